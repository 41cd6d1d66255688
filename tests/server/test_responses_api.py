"""HTTP tests of /v1/responses (the OpenAI Responses API) on the tiny model and the scripted-model
server: every streamed response is checked against the event grammar below, the stream against
the whole response, and bad requests for a 4xx naming the field.

The grammar of a stream (server/responses_route.cc, server/responses_output.h), one SSE event
each, "event: <type>" then "data: <json>" whose type is <type>, sequence_number 0, 1, 2, ...:

    stream    = created in_progress item* terminal          (no [DONE])
    created   = response.created        response.status "in_progress", output []
    in_progress = response.in_progress
    item      = output_item.added(i) body(i) output_item.done(i)   i = 0, 1, ... in order
    body(message)       = content_part.added output_text.delta* output_text.done content_part.done
    body(reasoning)     = content_part.added reasoning_text.delta* reasoning_text.done content_part.done
    body(function_call) = function_call_arguments.delta* function_call_arguments.done
    terminal  = response.completed | response.incomplete | response.failed

Every event of an item carries its output_index and item_id; the deltas concatenate to the done
text; the done item is the terminal response's output[i]; the terminal status matches its type.

Run: M3SERVE_BIN=build/bin/m3serve SCRIPTED_SERVER_BIN=build/tests/server/scripted_server
python3 tests/server/test_responses_api.py (from the repo root).
"""
import json
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from live_server import LiveServer, open_stream  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("M3SERVE_BIN", "build/bin/m3serve")
SCRIPTED = os.environ.get("SCRIPTED_SERVER_BIN", "build/tests/server/scripted_server")
MODEL = os.environ.get("M3SERVE_MODEL", "models/minimax-m3-tiny")
PARSERS = ["--reasoning-parser", "minimax_m3", "--tool-call-parser", "minimax_m3", "--enable-auto-tool-choice"]
SERVER = None
SCRIPTED_SERVER = None

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
CLOCK = {"type": "function", "name": "get_time", "parameters": {"type": "object"}}


def start_tiny(*extra):
    return LiveServer([BIN, "serve", MODEL, "--host", "127.0.0.1", "--port", "0", "--served-model-name", "tiny",
                       "--max-model-len", "1024", "--kv-cache-memory", "64MiB", "--disable-log-stats"]
                      + PARSERS + list(extra))


def setUpModule():
    global SERVER, SCRIPTED_SERVER
    SERVER = start_tiny()
    SCRIPTED_SERVER = LiveServer([SCRIPTED, "--model-dir", MODEL, "--port", "0",
                                  "--replies", os.path.join(HERE, "scripted_replies.json")] + PARSERS)


def tearDownModule():
    for server in (SERVER, SCRIPTED_SERVER):
        if server:
            code = server.stop()
            assert code == 0, "server exit status %s:\n%s" % (code, server.log_text())


def parse_stream(raw):
    """The SSE body as (event name, JSON) pairs, framing checked strictly."""
    text = raw.decode()
    assert text.endswith("\n\n"), "stream must end with a blank line: %r" % text[-80:]
    events = []
    for block in text.split("\n\n")[:-1]:
        lines = block.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), block[:300]
        data = lines[1][len("data: "):]
        assert data != "[DONE]", "the Responses stream sends no [DONE]"
        events.append((lines[0][len("event: "):], json.loads(data)))
    return events


class Grammar:
    """Checks a stream against the grammar of the module docstring; returns the terminal event."""

    def __init__(self, test, events):
        self.test, self.events, self.pos = test, events, 0

    def next(self, *types):
        t = self.test
        t.assertLess(self.pos, len(self.events), "stream ended early, expected %s" % (types,))
        name, e = self.events[self.pos]
        t.assertEqual(name, e["type"], "event line and data type differ")
        t.assertEqual(e["sequence_number"], self.pos)
        t.assertIn(e["type"], types, "event %d" % self.pos)
        self.pos += 1
        return e

    def peek(self):
        return self.events[self.pos][1]["type"] if self.pos < len(self.events) else None

    def check(self):
        t = self.test
        created = self.next("response.created")
        t.assertEqual(created["response"]["status"], "in_progress")
        t.assertEqual(created["response"]["output"], [])
        t.assertIsNone(created["response"]["usage"])
        rid = created["response"]["id"]
        self.next("response.in_progress")
        items = []
        while self.peek() == "response.output_item.added":
            items.append(self.item(len(items)))
        terminal = self.next("response.completed", "response.incomplete", "response.failed")
        t.assertEqual(self.pos, len(self.events), "events after the terminal one")
        response = terminal["response"]
        t.assertEqual(response["id"], rid)
        status = {"response.completed": "completed", "response.incomplete": "incomplete",
                  "response.failed": "failed"}[terminal["type"]]
        t.assertEqual(response["status"], status)
        if status != "failed":
            t.assertEqual(response["output"], items)
            usage = response["usage"]
            t.assertEqual(usage["total_tokens"], usage["input_tokens"] + usage["output_tokens"])
        if status == "incomplete":
            t.assertEqual(response["incomplete_details"], {"reason": "max_output_tokens"})
        return terminal

    def item(self, index):
        t = self.test
        added = self.next("response.output_item.added")
        t.assertEqual(added["output_index"], index)
        item = added["item"]
        t.assertEqual(item["status"], "in_progress")
        kind = item["type"]
        t.assertIn(kind, ("message", "reasoning", "function_call"))
        prefix = {"message": "msg_", "reasoning": "rs_", "function_call": "fc_"}[kind]
        t.assertTrue(item["id"].startswith(prefix), item["id"])

        def own(e):
            t.assertEqual(e["output_index"], index)
            t.assertEqual(e["item_id"], item["id"])
            return e

        if kind == "function_call":
            t.assertEqual(item["arguments"], "")
            t.assertTrue(item["call_id"].startswith("call_"))
            args = ""
            while self.peek() == "response.function_call_arguments.delta":
                args += own(self.next("response.function_call_arguments.delta"))["delta"]
            done = own(self.next("response.function_call_arguments.done"))
            t.assertEqual(done["arguments"], args)
            t.assertEqual(done["name"], item["name"])
            text = None
        else:
            t.assertEqual(item["content"], [])
            part_type, delta_type, done_type = (
                ("output_text", "response.output_text.delta", "response.output_text.done") if kind == "message"
                else ("reasoning_text", "response.reasoning_text.delta", "response.reasoning_text.done"))
            part = own(self.next("response.content_part.added"))
            t.assertEqual(part["content_index"], 0)
            t.assertEqual(part["part"]["type"], part_type)
            t.assertEqual(part["part"]["text"], "")
            text, logprobs = "", []
            while self.peek() == delta_type:
                delta = own(self.next(delta_type))
                t.assertEqual(delta["content_index"], 0)
                text += delta["delta"]
                logprobs += delta.get("logprobs", [])
            text_done = own(self.next(done_type))
            t.assertEqual(text_done["text"], text)
            part_done = own(self.next("response.content_part.done"))
            t.assertEqual(part_done["part"]["text"], text)
            t.assertEqual(part_done["part"]["type"], part_type)
            if kind == "message":
                # The deltas' logprobs add up to the part's, and the done event repeats them.
                t.assertEqual(text_done["logprobs"], logprobs)
                t.assertEqual(part_done["part"]["logprobs"], logprobs)
        done = self.next("response.output_item.done")
        t.assertEqual(done["output_index"], index)
        final = done["item"]
        t.assertEqual(final["id"], item["id"])
        t.assertIn(final["status"], ("completed", "incomplete"))
        if text is not None:
            t.assertEqual(final["content"][0]["text"], text)
        if kind == "message":
            t.assertEqual(final["content"][0]["annotations"], [])
        return final


def body(content="Hello, who are you?", **kw):
    b = {"model": "tiny", "input": content, "max_output_tokens": 16, "temperature": 0}
    b.update(kw)
    return b


class Streams(unittest.TestCase):
    def stream(self, server, b):
        status, headers, raw = server.request("POST", "/v1/responses", dict(b, stream=True))
        self.assertEqual(status, 200, raw[:500])
        self.assertTrue(headers["content-type"].startswith("text/event-stream"))
        events = parse_stream(raw)
        return Grammar(self, events).check(), events

    def assert_same_output(self, whole, streamed):
        strip = lambda items: [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in items]  # noqa: E731
        self.assertEqual(strip(streamed["output"]), strip(whole["output"]))
        # Cached tokens depend on what ran before (the prefix cache): the rest is the same.
        usage = lambda r: {k: v for k, v in r["usage"].items() if k != "input_tokens_details"}  # noqa: E731
        self.assertEqual(usage(streamed), usage(whole))
        self.assertEqual(streamed["status"], whole["status"])

    def test_plain_requests_in_every_thinking_mode(self):
        for reasoning in (None, {"effort": "none"}, {"effort": "high"}):
            for tokens in (1, 24):
                b = body(max_output_tokens=tokens)
                if reasoning:
                    b["reasoning"] = reasoning
                whole = SERVER.post("/v1/responses", b)
                terminal, _ = self.stream(SERVER, b)
                self.assert_same_output(whole, terminal["response"])
                self.assertLessEqual(whole["usage"]["output_tokens"], tokens)

    def test_forced_tool_calls(self):
        # Thinking off, so the forced call opener comes first (a random model may never close its
        # reasoning, and the call is only forced after it). "required" with one tool names it; a
        # named choice among several names its tool.
        for tools, choice in (([WEATHER], "required"), ([WEATHER, CLOCK], {"type": "function", "name": "get_time"})):
            b = body("Weather in Paris?", tools=tools, tool_choice=choice, max_output_tokens=40,
                     reasoning={"effort": "none"})
            whole = SERVER.post("/v1/responses", b)
            terminal, events = self.stream(SERVER, b)
            self.assert_same_output(whole, terminal["response"])
            calls = [i for i in whole["output"] if i["type"] == "function_call"]
            self.assertTrue(calls, whole["output"])
            if isinstance(choice, dict):
                self.assertEqual(calls[0]["name"], "get_time")
            self.assertIn("response.function_call_arguments.done", [e["type"] for _, e in events])
        # parallel_tool_calls false: one call at most.
        b = body("Weather?", tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
                 reasoning={"effort": "none"}, max_output_tokens=40)
        r = SERVER.post("/v1/responses", b)
        self.assertEqual(len([i for i in r["output"] if i["type"] == "function_call"]), 1)
        self.assertFalse(r["parallel_tool_calls"])

    def test_scripted_reasoning_and_calls(self):
        terminal, events = self.stream(SCRIPTED_SERVER, {"model": "scripted", "input": "Weather in Oslo?",
                                                         "tools": [WEATHER]})
        response = terminal["response"]
        self.assertEqual(terminal["type"], "response.completed")
        self.assertEqual([i["type"] for i in response["output"]], ["reasoning", "function_call"])
        self.assertEqual(response["output"][0]["content"], [{"type": "reasoning_text",
                                                             "text": "The user wants the weather."}])
        self.assertEqual(json.loads(response["output"][1]["arguments"]), {"city": "Oslo"})
        self.assertGreater(response["usage"]["output_tokens_details"]["reasoning_tokens"], 0)
        whole = SCRIPTED_SERVER.post("/v1/responses", {"model": "scripted", "input": "Weather in Oslo?",
                                                       "tools": [WEATHER]})
        self.assert_same_output(whole, response)

        terminal, _ = self.stream(SCRIPTED_SERVER, {"model": "scripted", "input": "What is 2+2?"})
        response = terminal["response"]
        self.assertEqual([i["type"] for i in response["output"]], ["reasoning", "message"])
        self.assertEqual(response["output_text"], "The answer is 4.")

        # Cut short inside the reply: incomplete, the open item too.
        terminal, _ = self.stream(SCRIPTED_SERVER, {"model": "scripted", "input": "Hi", "max_output_tokens": 3})
        self.assertEqual(terminal["type"], "response.incomplete")
        self.assertEqual(terminal["response"]["output"][-1]["status"], "incomplete")

    def test_previous_response_id_continues_a_stored_stream(self):
        terminal, _ = self.stream(SCRIPTED_SERVER, {"model": "scripted", "input": "Weather in Oslo?",
                                                    "tools": [WEATHER]})
        first = terminal["response"]
        call = first["output"][1]
        terminal, _ = self.stream(SCRIPTED_SERVER, {
            "model": "scripted", "previous_response_id": first["id"], "tools": [WEATHER],
            "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "rain, 7C"}]})
        self.assertEqual(terminal["response"]["output_text"], "It is raining in Oslo, 7C.")
        self.assertEqual(terminal["response"]["previous_response_id"], first["id"])


class Logprobs(unittest.TestCase):
    LOGPROBS = {"include": ["message.output_text.logprobs"], "top_logprobs": 2}

    def message_part(self, response):
        messages = [i for i in response["output"] if i["type"] == "message"]
        self.assertEqual(len(messages), 1, response["output"])
        return messages[0]["content"][0]

    def test_output_text_carries_the_chat_routes_logprobs(self):
        b = body("Hello", max_output_tokens=8, **self.LOGPROBS)
        r = SERVER.post("/v1/responses", b)
        self.assertEqual(r["top_logprobs"], 2)
        part = self.message_part(r)
        entries = part["logprobs"]
        self.assertTrue(entries)
        for e in entries:
            self.assertEqual(set(e), {"token", "logprob", "bytes", "top_logprobs"})
            self.assertEqual(list(e["token"].encode()), e["bytes"])
            self.assertEqual(len(e["top_logprobs"]), 2)
            # Greedy: the token drawn is the most likely one.
            self.assertEqual((e["top_logprobs"][0]["token"], e["top_logprobs"][0]["logprob"]),
                             (e["token"], e["logprob"]))
            self.assertGreaterEqual(e["top_logprobs"][0]["logprob"], e["top_logprobs"][1]["logprob"])
        # Every token of the text, and only those (no reasoning here, the run ends at the budget).
        self.assertEqual("".join(e["token"] for e in entries), part["text"])
        # The same tokens and values as /v1/chat/completions gives for the same conversation.
        chat = SERVER.post("/v1/chat/completions", {
            "model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8,
            "temperature": 0, "logprobs": True, "top_logprobs": 2})
        self.assertEqual(chat["choices"][0]["message"]["content"], part["text"])
        self.assertEqual(chat["choices"][0]["logprobs"]["content"], entries)

    def test_a_stream_carries_the_same_logprobs(self):
        b = body("Hello", max_output_tokens=8, **self.LOGPROBS)
        whole = SERVER.post("/v1/responses", b)
        status, _, raw = SERVER.request("POST", "/v1/responses", dict(b, stream=True))
        self.assertEqual(status, 200, raw[:300])
        events = parse_stream(raw)
        terminal = Grammar(self, events).check()  # checks the deltas add up to the part's logprobs
        self.assertEqual(self.message_part(terminal["response"])["logprobs"], self.message_part(whole)["logprobs"])
        deltas = [e for _, e in events if e["type"] == "response.output_text.delta"]
        self.assertTrue(all(len(d["logprobs"]) >= 1 for d in deltas if d["delta"]), deltas)

    def test_without_include_there_are_none(self):
        for extra in ({}, {"top_logprobs": 3}):
            r = SERVER.post("/v1/responses", body("Hello", max_output_tokens=4, **extra))
            self.assertEqual(self.message_part(r)["logprobs"], [])
            self.assertEqual(r["top_logprobs"], extra.get("top_logprobs", 0))

    def test_bad_top_logprobs(self):
        for top in (-1, 21):
            err = SERVER.post("/v1/responses", body(top_logprobs=top, include=["message.output_text.logprobs"]),
                              expect=400)["error"]
            self.assertEqual(err["param"], "top_logprobs", err)
        err = SERVER.post("/v1/responses", body(top_logprobs="2"), expect=400)["error"]
        self.assertEqual(err["param"], "top_logprobs", err)


class Background(unittest.TestCase):
    def poll(self, rid, timeout=60):
        """GET until the response has ended; returns (statuses seen, the final response)."""
        seen, deadline = [], time.monotonic() + timeout
        while True:
            r = SERVER.request("GET", "/v1/responses/" + rid)
            self.assertEqual(r[0], 200, r[2][:300])
            response = json.loads(r[2])
            if not seen or seen[-1] != response["status"]:
                seen.append(response["status"])
            if response["status"] not in ("queued", "in_progress"):
                return seen, response
            self.assertLess(time.monotonic(), deadline, "the background response did not end")
            time.sleep(0.02)

    def wait_idle(self):
        deadline = time.monotonic() + 10
        while SERVER.metric("vllm:num_requests_running") != 0:
            self.assertLess(time.monotonic(), deadline, "a request is still running")
            time.sleep(0.05)

    def test_a_background_response_runs_without_the_client(self):
        b = body("Hello", max_output_tokens=12)
        queued = SERVER.post("/v1/responses", dict(b, background=True))
        self.assertEqual((queued["status"], queued["background"], queued["output"]), ("queued", True, []))
        self.assertTrue(queued["id"].startswith("resp_"))
        seen, final = self.poll(queued["id"])
        self.assertIn(seen[-1], ("completed", "incomplete"))
        self.assertTrue(set(seen[:-1]) <= {"queued", "in_progress"}, seen)
        self.assertTrue(final["background"])
        foreground = SERVER.post("/v1/responses", b)  # greedy: the same output
        self.assertEqual(final["output_text"], foreground["output_text"])
        self.assertEqual(final["usage"]["output_tokens"], foreground["usage"]["output_tokens"])
        # Once it has ended it continues a conversation, and cancel returns it as it is.
        follow = SERVER.post("/v1/responses", body("And then?", previous_response_id=queued["id"], max_output_tokens=2))
        self.assertEqual(follow["previous_response_id"], queued["id"])
        self.assertEqual(SERVER.post("/v1/responses/%s/cancel" % queued["id"], {})["status"], final["status"])

    def test_cancel_ends_it_with_its_output_so_far(self):
        queued = SERVER.post("/v1/responses", body("Tell me a long story", max_output_tokens=700, background=True))
        # Still running: it cannot be continued yet.
        err = SERVER.post("/v1/responses", body("more", previous_response_id=queued["id"]), expect=None)
        if "error" in err:  # (it may already have ended on a fast machine)
            self.assertEqual(err["error"]["param"], "previous_response_id")
        cancelled = SERVER.post("/v1/responses/%s/cancel" % queued["id"], {})
        self.assertEqual(cancelled["status"], "cancelled")
        self.assertLess(cancelled["usage"]["output_tokens"], 700)
        self.assertEqual(self.poll(queued["id"])[1]["status"], "cancelled")
        self.assertEqual(SERVER.post("/v1/responses/%s/cancel" % queued["id"], {})["status"], "cancelled")
        self.wait_idle()  # its engine request was aborted

    def test_delete_cancels_a_running_one(self):
        queued = SERVER.post("/v1/responses", body("Tell me a long story", max_output_tokens=700, background=True))
        deleted = SERVER.request("DELETE", "/v1/responses/" + queued["id"])
        self.assertEqual(deleted[0], 200, deleted[2])
        self.assertEqual(SERVER.request("GET", "/v1/responses/" + queued["id"])[0], 404)
        self.wait_idle()
        time.sleep(0.2)  # nothing stores it again afterwards
        self.assertEqual(SERVER.request("GET", "/v1/responses/" + queued["id"])[0], 404)

    def test_what_background_needs(self):
        err = SERVER.post("/v1/responses", body(background=True, store=False), expect=400)["error"]
        self.assertEqual(err["param"], "background")
        err = SERVER.post("/v1/responses", body(background=True, stream=True), expect=400)["error"]
        self.assertEqual(err["param"], "stream")
        fg = SERVER.post("/v1/responses", body(max_output_tokens=1))
        self.assertFalse(fg["background"])
        err = SERVER.post("/v1/responses/%s/cancel" % fg["id"], {}, expect=400)["error"]
        self.assertIn("background", err["message"])
        self.assertEqual(SERVER.post("/v1/responses/resp_nope/cancel", {}, expect=404)["error"]["param"],
                         "response_id")


class Lifecycle(unittest.TestCase):
    def test_a_client_that_hangs_up_aborts_its_response(self):
        b = body("hang up", max_output_tokens=400)
        # Greedy on the batch-invariant CPU backend: this prompt runs to the budget every time.
        self.assertEqual(SERVER.post("/v1/responses", dict(b, store=False))["status"], "incomplete")
        aborted = SERVER.metric("vllm:request_success_total", finished_reason="abort")
        s = open_stream(SERVER.port, "/v1/responses", b)
        f = s.makefile("rb")
        while b"response.output_text.delta" not in f.readline():
            pass
        s.close()
        f.close()
        # The abort count is observed where the route sees the aborted output, on the engine's
        # thread, just before the lane publishes the gauges of that step: a scrape in between sees
        # the count and the request still running, so both are waited for.
        deadline = time.monotonic() + 10
        while (SERVER.metric("vllm:request_success_total", finished_reason="abort") == aborted or
               SERVER.metric("vllm:num_requests_running") != 0):
            self.assertLess(time.monotonic(), deadline, "the hung-up response was not aborted")
            time.sleep(0.05)

    def test_text_format_asks_for_json(self):
        r = SERVER.post("/v1/responses", body(text={"format": {"type": "json_schema", "name": "answer", "schema": {
            "type": "object", "properties": {"a": {"type": "integer"}}}}}, max_output_tokens=4))
        self.assertEqual(r["text"]["format"]["name"], "answer")
        plain = SERVER.post("/v1/responses", body(max_output_tokens=4))
        # The format reaches the prompt (as the chat route's response_format does).
        self.assertGreater(r["usage"]["input_tokens"], plain["usage"]["input_tokens"])

    def test_text_format_is_enforced(self):
        # The random tiny model writes noise unconstrained: valid JSON here comes from the grammar.
        schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "y"]}},
                  "required": ["a", "b"], "additionalProperties": False}
        for fmt in ({"type": "json_schema", "name": "answer", "schema": schema, "strict": True},
                    {"type": "json_object"}):
            r = SERVER.post("/v1/responses", body(text={"format": fmt}, max_output_tokens=64,
                                                  reasoning={"effort": "none"}))
            value = json.loads(r["output_text"])
            self.assertIsInstance(value, dict, r["output_text"])
            if fmt["type"] == "json_schema":
                self.assertEqual(set(value), {"a", "b"})
                self.assertIsInstance(value["a"], int)
                self.assertIn(value["b"], ("x", "y"))


class StoredResponses(unittest.TestCase):
    def test_get_delete_and_store_false(self):
        r = SERVER.post("/v1/responses", body(max_output_tokens=3))
        status, _, raw = SERVER.request("GET", "/v1/responses/" + r["id"])
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(raw)["output"], r["output"])
        status, _, raw = SERVER.request("DELETE", "/v1/responses/" + r["id"])
        self.assertEqual((status, json.loads(raw)), (200, {"id": r["id"], "object": "response", "deleted": True}))
        for method in ("GET", "DELETE"):
            status, _, raw = SERVER.request(method, "/v1/responses/" + r["id"])
            self.assertEqual(status, 404, raw)
            self.assertIn(r["id"], json.loads(raw)["error"]["message"])
        unstored = SERVER.post("/v1/responses", body(max_output_tokens=2, store=False))
        self.assertFalse(unstored["store"])
        self.assertEqual(SERVER.request("GET", "/v1/responses/" + unstored["id"])[0], 404)
        err = SERVER.post("/v1/responses", body(previous_response_id=unstored["id"]), expect=404)
        self.assertEqual(err["error"]["param"], "previous_response_id")
        status, headers, _ = SERVER.request("PUT", "/v1/responses/x")
        self.assertEqual((status, headers["allow"]), (405, "GET, HEAD, DELETE"))
        self.assertEqual(SERVER.request("GET", "/v1/responses/a/b")[0], 404)

    def test_input_items_pages(self):
        items = [{"role": "user", "content": "a"}, {"type": "message", "role": "assistant", "content": "b"},
                 {"role": "user", "content": [{"type": "input_text", "text": "c"}], "id": "msg_mine"}]
        r = SERVER.post("/v1/responses", body(items, max_output_tokens=1, instructions="not an item"))
        path = "/v1/responses/%s/input_items" % r["id"]

        def page(query=""):
            status, _, raw = SERVER.request("GET", path + query)
            self.assertEqual(status, 200, raw)
            return json.loads(raw)

        whole = page()
        self.assertEqual(whole["object"], "list")
        self.assertEqual([i["content"][0]["text"] for i in whole["data"]], ["c", "b", "a"])  # newest first
        self.assertEqual(whole["first_id"], "msg_mine")
        self.assertFalse(whole["has_more"])
        self.assertEqual(whole["data"][1]["content"][0]["type"], "output_text")
        self.assertTrue(all(i["id"].startswith("msg_") for i in whole["data"]))
        first = page("?order=asc&limit=2")
        self.assertEqual([i["content"][0]["text"] for i in first["data"]], ["a", "b"])
        self.assertTrue(first["has_more"])
        rest = page("?order=asc&limit=2&after=" + first["last_id"])
        self.assertEqual([i["id"] for i in rest["data"]], ["msg_mine"])
        self.assertFalse(rest["has_more"])
        self.assertEqual([i["id"] for i in page("?before=" + whole["data"][2]["id"])["data"]], ["msg_mine",
                                                                                            whole["data"][1]["id"]])
        for query, param in (("?limit=0", "limit"), ("?limit=x", "limit"), ("?order=up", "order"),
                             ("?after=msg_none", "after"), ("?cursor=1", "cursor"), ("?a%zz=1", "a%zz")):
            status, _, raw = SERVER.request("GET", path + query)
            self.assertEqual((status, json.loads(raw)["error"]["param"]), (400, param), query)
        self.assertEqual(SERVER.request("GET", "/v1/responses/resp_none/input_items")[0], 404)

    def test_the_store_bound_evicts_the_least_recently_used(self):
        server = start_tiny("--max-stored-responses", "2")
        try:
            ids = [server.post("/v1/responses", body("n%d" % k, max_output_tokens=1))["id"] for k in range(2)]
            self.assertEqual(server.request("GET", "/v1/responses/" + ids[0])[0], 200)  # now the most recent
            ids.append(server.post("/v1/responses", body("n2", max_output_tokens=1))["id"])
            self.assertEqual([server.request("GET", "/v1/responses/" + i)[0] for i in ids], [200, 404, 200])
            err = server.post("/v1/responses", body(previous_response_id=ids[1]), expect=404)
            self.assertIn("evicted", err["error"]["message"])
            # Background responses running are bounded by the store too: a client cannot queue
            # unbounded work with them.
            long_ones = [server.post("/v1/responses", body("story %d" % k, max_output_tokens=700, background=True))
                         for k in range(2)]
            err = server.post("/v1/responses", body("one more", background=True), expect=429)["error"]
            self.assertEqual(err["param"], "background")
            self.assertIn("--max-stored-responses", err["message"])
            server.post("/v1/responses/%s/cancel" % long_ones[0]["id"], {})
            self.assertEqual(server.post("/v1/responses", body("now", background=True, max_output_tokens=1))["status"],
                             "queued")
            server.post("/v1/responses/%s/cancel" % long_ones[1]["id"], {})
        finally:
            self.assertEqual(server.stop(), 0)


class BadInput(unittest.TestCase):
    def test_errors_name_the_field(self):
        cases = [
            ({"tools": [{"type": "web_search"}]}, "tools[0].type", "web_search"),
            ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools[0].type", "file_search"),
            ({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}, "tools[0].type",
             "code_interpreter"),
            ({"tools": [{"type": "computer_use_preview"}]}, "tools[0].type", "computer_use_preview"),
            ({"tools": [{"type": "image_generation"}]}, "tools[0].type", "image_generation"),
            ({"tools": [{"type": "mcp", "server_label": "x"}]}, "tools[0].type", "mcp"),
            ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice.type", "web_search_preview"),
            ({"frobnicate": 1}, "frobnicate", "frobnicate"),
            ({"truncation": "auto"}, "truncation", "auto"),
            ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
             "input[0].content[0]", "input_image"),
            ({"input": [{"type": "function_call_output", "call_id": "call_none", "output": "x"}]},
             "input[0].call_id", "call_none"),
            ({"input": []}, "input", "input"),
            ({"max_output_tokens": 0}, "max_output_tokens", "max_output_tokens"),
            ({"max_output_tokens": 5000}, "max_output_tokens", "maximum context length"),
            ({"temperature": -1}, "temperature", "temperature"),
            ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema", "schema"),
            ({"tool_choice": "required"}, "tool_choice", "tools"),
        ]
        for extra, param, words in cases:
            b = dict(body(), **extra)
            err = SERVER.post("/v1/responses", b, expect=400)["error"]
            self.assertEqual(err["param"], param, (extra, err))
            self.assertIn(words, err["message"], (extra, err))
            self.assertEqual(err["type"], "BadRequestError")
        self.assertEqual(SERVER.post("/v1/responses", body(model="nope"), expect=404)["error"]["param"], "model")
        status, _, raw = SERVER.request("POST", "/v1/responses", b"[1, 2]")
        self.assertEqual(status, 400, raw)
        # The server keeps serving.
        self.assertEqual(SERVER.post("/v1/responses", body(max_output_tokens=1))["object"], "response")


class MutatedRequests(unittest.TestCase):
    def test_wrong_values_anywhere_are_4xx_and_the_server_keeps_serving(self):
        valid = {
            "model": "tiny", "instructions": "Be brief.", "max_output_tokens": 1, "temperature": 0, "top_p": 1,
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "r"}]},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"x\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "ok"},
            ],
            "tools": [WEATHER], "tool_choice": "auto", "parallel_tool_calls": True, "max_tool_calls": 2,
            "text": {"format": {"type": "text"}}, "reasoning": {"effort": "low", "summary": "auto"},
            "store": False, "metadata": {"k": "v"}, "include": ["reasoning.encrypted_content"],
        }
        self.assertEqual(SERVER.post("/v1/responses", valid)["object"], "response")
        wrong = [None, -1, 1e308, "x", [], {}, True]

        def paths(value, prefix=()):
            yield prefix
            if isinstance(value, dict):
                for k, v in value.items():
                    yield from paths(v, prefix + (k,))
            elif isinstance(value, list):
                for i, v in enumerate(value):
                    yield from paths(v, prefix + (i,))

        def replaced(value, path, new):
            if not path:
                return new
            copy = json.loads(json.dumps(value))
            node = copy
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = new
            return copy

        count = 0
        for path in list(paths(valid))[1:]:
            for new in wrong:
                b = replaced(valid, path, new)
                status, _, raw = SERVER.request("POST", "/v1/responses", b)
                count += 1
                self.assertIn(status, (200, 400, 404), (path, new, raw[:300]))
                reply = json.loads(raw)
                if status != 200:
                    self.assertIn("message", reply["error"], (path, new))
                else:
                    self.assertEqual(reply["object"], "response", (path, new, raw[:300]))
        self.assertGreater(count, 250)
        self.assertEqual(SERVER.post("/v1/responses", body(max_output_tokens=1))["object"], "response")


if __name__ == "__main__":
    unittest.main()
