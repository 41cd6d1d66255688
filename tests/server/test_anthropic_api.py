"""HTTP tests of the Anthropic Messages API (/v1/messages, /v1/messages/count_tokens), standard
library only: the streamed event sequence checked against Anthropic's grammar, streams that
rebuild the whole message, exact blocks from the scripted model (thinking, text, tool_use, stop
sequences, one call with disable_parallel_tool_use), the thinking budget on the tiny model,
prefix-cache usage, Anthropic error shapes on these routes only, x-api-key and Bearer auth.

Run: M3SERVE_BIN=build/bin/m3serve SCRIPTED_SERVER_BIN=build/tests/server/scripted_server
python3 tests/server/test_anthropic_api.py (from the repo root).
"""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from live_server import LiveServer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("M3SERVE_BIN", "build/bin/m3serve")
SCRIPTED_BIN = os.environ.get("SCRIPTED_SERVER_BIN", "build/tests/server/scripted_server")
MODEL = "models/minimax-m3-tiny"
KEY = "sk-messages"
AUTH = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
PARSERS = ["--reasoning-parser", "minimax_m3", "--tool-call-parser", "minimax_m3", "--enable-auto-tool-choice"]
TINY = SCRIPTED = None

WEATHER = {"name": "get_weather", "description": "Weather forecast for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                            "required": ["city"]}}


def setUpModule():
    global TINY, SCRIPTED
    TINY = LiveServer([BIN, "serve", MODEL, "--host", "127.0.0.1", "--port", "0", "--served-model-name", "tiny",
                       "--max-model-len", "1024", "--kv-cache-memory", "64MiB", "--api-key", KEY, "--max-body-size", "64KiB",
                       "--disable-log-stats"] + PARSERS)
    SCRIPTED = LiveServer([SCRIPTED_BIN, "--model-dir", MODEL, "--port", "0", "--served-model-name", "scripted",
                           "--replies", os.path.join(HERE, "anthropic_replies.json")] + PARSERS)


def tearDownModule():
    for server in (TINY, SCRIPTED):
        if server:
            code = server.stop()
            assert code == 0, "server exit status %s:\n%s" % (code, server.log_text())


def body(model, content="Hello", **kw):
    b = {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": content}]}
    b.update(kw)
    return b


def post(server, path, payload, expect=200, headers=AUTH):
    status, hdrs, raw = server.request("POST", path, payload, headers)
    if expect is not None and status != expect:
        raise AssertionError("POST %s -> %d (expected %d): %s" % (path, status, expect, raw[:2000]))
    return status, hdrs, json.loads(raw)


def sse_events(raw):
    """(event name, data) pairs; every event is an `event:` line then one `data:` line."""
    text = raw.decode()
    assert text.endswith("\n\n"), text[-200:]
    events = []
    for block in text.split("\n\n")[:-1]:
        lines = block.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), block[:300]
        name, data = lines[0][len("event: "):], json.loads(lines[1][len("data: "):])
        assert data["type"] == name, (name, data)
        events.append((name, data))
    return events


DELTA_OF_BLOCK = {"text": "text_delta", "thinking": "thinking_delta", "tool_use": "input_json_delta"}


def check_grammar(events):
    """Anthropic's stream grammar; returns the message the events build."""
    names = [n for n, _ in events]
    assert names[0] == "message_start", names
    message = events[0][1]["message"]
    assert message["content"] == [] and message["stop_reason"] is None and message["role"] == "assistant"
    assert message["id"].startswith("msg_") and message["type"] == "message"
    i = 1
    while i < len(events) and names[i] == "ping":
        i += 1
    content, inputs = [], []
    while names[i] == "content_block_start":
        start = events[i][1]
        assert start["index"] == len(content), start
        block = dict(start["content_block"])
        assert block["type"] in DELTA_OF_BLOCK, block
        content.append(block)
        inputs.append("")
        i += 1
        while names[i] in ("content_block_delta", "ping"):
            if names[i] == "content_block_delta":
                d = events[i][1]
                assert d["index"] == start["index"], d
                delta = d["delta"]
                assert delta["type"] in (DELTA_OF_BLOCK[block["type"]], "signature_delta"), (block, delta)
                if delta["type"] == "text_delta":
                    block["text"] += delta["text"]
                elif delta["type"] == "thinking_delta":
                    block["thinking"] += delta["thinking"]
                elif delta["type"] == "signature_delta":
                    block["signature"] = delta["signature"]
                else:
                    inputs[-1] += delta["partial_json"]
            i += 1
        assert names[i] == "content_block_stop" and events[i][1]["index"] == start["index"], events[i]
        if block["type"] == "tool_use":
            block["input"] = json.loads(inputs[-1]) if inputs[-1] else {}
        i += 1
    assert names[i] == "message_delta", names[i:]
    delta = events[i][1]
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens", "stop_sequence", "tool_use"), delta
    assert names[i + 1:] == ["message_stop"], names[i:]
    message.update(content=content, stop_reason=delta["delta"]["stop_reason"],
                   stop_sequence=delta["delta"]["stop_sequence"])
    message["usage"].update(delta["usage"])
    return message


def without_ids(content):
    return [{k: v for k, v in b.items() if k != "id"} for b in content]


class StreamGrammar(unittest.TestCase):
    def check_stream_matches_whole(self, server, payload):
        _, _, whole = post(server, "/v1/messages", payload)
        status, hdrs, raw = server.request("POST", "/v1/messages", dict(payload, stream=True), AUTH)
        self.assertEqual(status, 200, raw[:500])
        self.assertTrue(hdrs["content-type"].startswith("text/event-stream"))
        streamed = check_grammar(sse_events(raw))
        self.assertEqual(without_ids(streamed["content"]), without_ids(whole["content"]))
        for key in ("stop_reason", "stop_sequence", "model", "role", "type"):
            self.assertEqual(streamed[key], whole[key], key)
        self.assertEqual(streamed["usage"]["output_tokens"], whole["usage"]["output_tokens"])
        return whole

    def test_scripted_thinking_and_text(self):
        whole = self.check_stream_matches_whole(SCRIPTED, body("scripted", "What is 2+2?", max_tokens=64))
        self.assertEqual(whole["content"], [{"type": "thinking", "thinking": "Two plus two is four.", "signature": ""},
                                            {"type": "text", "text": "The answer is 4."}])
        self.assertEqual(whole["stop_reason"], "end_turn")

    def test_scripted_tool_use(self):
        whole = self.check_stream_matches_whole(SCRIPTED, body("scripted", "Weather in Paris?", max_tokens=128,
                                                               tools=[WEATHER]))
        self.assertEqual(whole["stop_reason"], "tool_use")
        call = whole["content"][-1]
        self.assertTrue(call["id"].startswith("toolu_"), call)
        self.assertEqual((call["name"], call["input"]), ("get_weather", {"city": "Paris", "days": 3}))

    def test_scripted_stop_sequence_and_one_call(self):
        whole = self.check_stream_matches_whole(SCRIPTED, body("scripted", "Hi", max_tokens=64, stop_sequences=["STOP"]))
        self.assertEqual((whole["stop_reason"], whole["stop_sequence"]), ("stop_sequence", "STOP"))
        self.assertEqual(whole["content"], [{"type": "text", "text": "Hello! This is a scripted reply, with a "}])
        # tool_choice auto: the text-level cut of a second call (with "any" the call markup's grammar
        # enforces one call, which the scripted model, blind to masks, cannot follow; the structured
        # output tests check that path on real models).
        one = self.check_stream_matches_whole(SCRIPTED, body(
            "scripted", "Weather in Paris and Rome?", max_tokens=128, tools=[WEATHER],
            tool_choice={"type": "auto", "disable_parallel_tool_use": True}))
        self.assertEqual([b["input"] for b in one["content"]], [{"city": "Paris"}])
        self.assertEqual(one["stop_reason"], "tool_use")

    def test_tiny_plain_thinking_and_forced_tool(self):
        whole = self.check_stream_matches_whole(TINY, body("tiny", "Tell me a story", temperature=0,
                                                           thinking={"type": "disabled"}))
        self.assertIn(whole["stop_reason"], ("end_turn", "max_tokens"))
        # max_tokens leaves room for the 4 reasoning tokens and a whole constrained call (about 40
        # tokens on tiny): with less, the end of reasoning is forced at once so that the call fits.
        forced = self.check_stream_matches_whole(TINY, body(
            "tiny", "Weather?", max_tokens=256, temperature=0, tools=[WEATHER],
            tool_choice={"type": "tool", "name": "get_weather"}, thinking={"type": "enabled", "budget_tokens": 4}))
        # The budget closes the reasoning after 4 tokens, then the call opens: random text the
        # model writes inside the call comes after it as text.
        types = [b["type"] for b in forced["content"]]
        self.assertEqual(types[:2], ["thinking", "tool_use"], forced["content"])
        self.assertEqual(forced["content"][1]["name"], "get_weather")
        self.assertNotIn("tool_use", types[2:])

    def test_thinking_budget_cuts_the_reasoning(self):
        free = post(TINY, "/v1/messages", body("tiny", "Think", max_tokens=24, temperature=0,
                                               thinking={"type": "adaptive"}, system="x"))[2]
        on = lambda budget: post(TINY, "/v1/messages", body(  # noqa: E731
            "tiny", "Think", max_tokens=24, temperature=0, thinking={"type": "enabled", "budget_tokens": budget}))[2]
        long, short = on(23), on(3)
        self.assertEqual(long["content"][0]["type"], "thinking", long)
        self.assertEqual(short["content"][0]["type"], "thinking", short)
        # Greedy: the capped reasoning is where the free one was after 3 tokens, and the answer
        # follows it.
        self.assertTrue(long["content"][0]["thinking"].startswith(short["content"][0]["thinking"]))
        self.assertLess(len(short["content"][0]["thinking"]), len(long["content"][0]["thinking"]))
        if short["stop_reason"] == "max_tokens":
            self.assertGreaterEqual(len(short["content"]), 2, short)
        self.assertIn(free["stop_reason"], ("end_turn", "max_tokens"))


class UsageAndCounting(unittest.TestCase):
    def test_prefix_cache_reads_and_count_tokens(self):
        long_text = "The history of the region is long and varied. " * 12
        payload = body("scripted", long_text, max_tokens=8, system="Be brief.", tools=[WEATHER])
        first = post(SCRIPTED, "/v1/messages", payload)[2]["usage"]
        second = post(SCRIPTED, "/v1/messages", payload)[2]["usage"]
        counted = post(SCRIPTED, "/v1/messages/count_tokens",
                       {k: v for k, v in payload.items() if k != "max_tokens"})[2]
        self.assertEqual(set(counted), {"input_tokens"})
        self.assertGreater(second["cache_read_input_tokens"], 0, second)
        for usage in (first, second):
            self.assertEqual(usage["input_tokens"] + usage["cache_read_input_tokens"], counted["input_tokens"])
            self.assertEqual(usage["cache_creation_input_tokens"], 0)

    def test_request_id_and_version_header(self):
        _, hdrs, m = post(TINY, "/v1/messages", body("tiny", max_tokens=2))
        self.assertEqual(hdrs["request-id"], m["id"])


class Errors(unittest.TestCase):
    def check(self, status, raw, error_type, words=()):
        err = json.loads(raw)
        self.assertEqual(set(err), {"type", "error"}, err)
        self.assertEqual(err["type"], "error")
        self.assertEqual(err["error"]["type"], error_type, err)
        for w in words:
            self.assertIn(w, err["error"]["message"])

    def test_anthropic_shape_on_messages_routes(self):
        cases = [
            (body("tiny", max_tokens=None), 400, ["max_tokens"]),
            (body("tiny", temperature=2), 400, ["temperature"]),
            (body("nope"), 404, ["nope"]),
            (body("tiny", messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]), 400,
             ["messages[0].content[0]", "text-only"]),
            (body("tiny", tools=[{"name": "t"}]), 400, ["tools[0].input_schema"]),
            (body("tiny", tool_choice={"type": "any"}), 400, ["tool_choice"]),
            (body("tiny", max_tokens=5000), 400, ["max_tokens"]),
        ]
        for payload, status, words in cases:
            payload = {k: v for k, v in payload.items() if v is not None}
            got, _, raw = TINY.request("POST", "/v1/messages", payload, AUTH)
            self.assertEqual(got, status, raw)
            self.check(got, raw, "invalid_request_error" if status == 400 else "not_found_error", words)
        got, _, raw = TINY.request("POST", "/v1/messages", b"{not json", AUTH)
        self.assertEqual(got, 400)
        self.check(got, raw, "invalid_request_error")
        got, _, raw = TINY.request("POST", "/v1/messages/count_tokens", {"model": "tiny"}, AUTH)
        self.assertEqual(got, 400)
        self.check(got, raw, "invalid_request_error", ["messages"])
        got, _, raw = TINY.request("GET", "/v1/messages", headers=AUTH)
        self.assertEqual(got, 405)
        self.check(got, raw, "invalid_request_error", ["POST"])
        got, _, raw = TINY.request("POST", "/v1/messages", body("tiny", "x" * 100000), AUTH)
        self.assertEqual(got, 413)
        self.check(got, raw, "request_too_large", ["too large"])
        got, _, raw = TINY.request("POST", "/v1/chat/completions", {"messages": "x" * 100000}, AUTH)
        self.assertEqual((got, json.loads(raw)["error"]["code"]), (413, 413))

    def test_any_field_of_any_type_is_a_4xx_or_served(self):
        """Every value of a full request replaced by each JSON type: never a 5xx, always Anthropic's shape."""
        full = body("scripted", "Weather in Paris?", max_tokens=2, system=[{"type": "text", "text": "s"}],
                    tools=[WEATHER], tool_choice={"type": "auto", "disable_parallel_tool_use": False},
                    thinking={"type": "enabled", "budget_tokens": 1}, temperature=0.5, top_p=0.9, top_k=5,
                    stop_sequences=["x"], metadata={"user_id": "u"},
                    messages=[{"role": "user", "content": "Weather in Paris?"},
                              {"role": "assistant", "content": [
                                  {"type": "thinking", "thinking": "t", "signature": ""},
                                  {"type": "text", "text": "a"},
                                  {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "P"}}]},
                              {"role": "user", "content": [
                                  {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": False,
                                   "content": [{"type": "text", "text": "r"}]}]}])

        def paths(value, prefix=()):
            yield prefix
            items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
            for key, item in items:
                yield from paths(item, prefix + (key,))

        def replaced(value, path, new):
            if not path:
                return new
            out = json.loads(json.dumps(value))
            target = out
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = new
            return out

        count = 0
        for path in list(paths(full))[1:]:
            for new in (None, 7, -1.5, "x", "", [], {}, True, [{"type": "text"}]):
                payload = replaced(full, path, new)
                for route in ("/v1/messages", "/v1/messages/count_tokens"):
                    got, _, raw = SCRIPTED.request("POST", route, payload)
                    count += 1
                    self.assertIn(got, (200, 400, 404), (route, path, new, raw[:300]))
                    if got != 200:
                        self.check(got, raw, "invalid_request_error" if got == 400 else "not_found_error")
        self.assertGreater(count, 500)
        deep = json.dumps(body("scripted", "x")).replace('"max_tokens"', '"metadata": %s, "max_tokens"' % (
            '{"a":' * 5000 + "1" + "}" * 5000), 1)
        got, _, raw = SCRIPTED.request("POST", "/v1/messages", deep.encode())
        self.assertEqual(got, 400)
        self.check(got, raw, "invalid_request_error", ["deep"])
        self.assertEqual(SCRIPTED.request("GET", "/health")[0], 200)

    def test_auth_headers(self):
        payload = body("tiny", max_tokens=2)
        got, _, raw = TINY.request("POST", "/v1/messages", payload)
        self.assertEqual(got, 401)
        self.check(got, raw, "authentication_error", ["x-api-key"])
        got, _, raw = TINY.request("POST", "/v1/messages", payload, {"x-api-key": "wrong"})
        self.assertEqual(got, 401)
        self.check(got, raw, "authentication_error", ["invalid"])
        self.assertEqual(TINY.request("POST", "/v1/messages", payload, {"Authorization": "Bearer " + KEY})[0], 200)
        self.assertEqual(TINY.request("POST", "/v1/messages", payload, {"x-api-key": KEY})[0], 200)
        both = {"x-api-key": "placeholder", "Authorization": "Bearer " + KEY}
        self.assertEqual(TINY.request("POST", "/v1/messages", payload, both)[0], 200)
        # The OpenAI routes keep their error shape, and take x-api-key too.
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        got, _, raw = TINY.request("POST", "/v1/chat/completions", chat)
        self.assertEqual(got, 401)
        self.assertEqual(json.loads(raw)["error"]["code"], 401)
        self.assertEqual(TINY.request("POST", "/v1/chat/completions", chat, {"x-api-key": KEY})[0], 200)
        got, _, raw = TINY.request("POST", "/v1/chat/completions", dict(chat, temperature=-1), {"x-api-key": KEY})
        self.assertEqual(json.loads(raw)["error"]["param"], "temperature")


if __name__ == "__main__":
    unittest.main(verbosity=2)
