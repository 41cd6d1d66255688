"""HTTP tests of `m3serve serve` on the bundled model: every endpoint and request option, SSE
framing, OpenAI error shapes for bad input, and the seed command lines of docs/reference.md D7.

Run: M3SERVE_BIN=build/bin/m3serve python3 tests/server/test_http_api.py (from the repo root).
The bundled model has random weights, so tests check shapes, consistency between paths
(streaming vs not, alone vs batched) and exact values where the server decides them.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from live_server import LiveServer, MultiNodeServer, open_stream, post_all  # noqa: E402

BIN = os.environ.get("M3SERVE_BIN", "build/bin/m3serve")
MODEL = os.environ.get("M3SERVE_MODEL", "models/minimax-m3-tiny")
# Extra serve options for the module's shared server, e.g. "-tp 2" (CTest runs the suite once more
# under a parallel layout).
EXTRA = shlex.split(os.environ.get("M3SERVE_EXTRA_ARGS", ""))
# M3SERVE_NODES=N: the shared server over N processes, as N hosts run it (--nnodes on 127.0.0.1);
# its followers must exit 0 when it stops.
NODES = int(os.environ.get("M3SERVE_NODES", "1"))
NAME = "tiny"
SERVER = None


def setUpModule():
    global SERVER
    argv = [BIN, "serve", MODEL, "--host", "127.0.0.1", "--port", "0", "--served-model-name", NAME, "m3-alias", "org/m3-tiny",
            "--max-model-len", "1024", "--kv-cache-memory", "64MiB", "--reasoning-parser", "minimax_m3",
            "--tool-call-parser", "minimax_m3", "--enable-auto-tool-choice", "--enable-prompt-tokens-details",
            "--disable-log-stats"] + EXTRA
    SERVER = MultiNodeServer(argv, NODES) if NODES > 1 else LiveServer(argv)


def tearDownModule():
    if SERVER:
        code = SERVER.stop()
        assert code == 0, "server exit status %s:\n%s" % (code, SERVER.log_text())
        if NODES > 1 and "--data-parallel-size" in EXTRA:
            # DEP over hosts: the concurrent tests must have put requests on the other nodes' copies.
            ran = [int(n) for n in re.findall(r"copy \d+: node 0 said stop after \d+ steps, (\d+) of them with requests",
                                                SERVER.follower_logs())]
            assert ran and all(n > 0 for n in ran), "a copy on another node served nothing:\n" + SERVER.follower_logs()


def chat_body(content="Hello, who are you?", **kw):
    body = {"model": NAME, "messages": [{"role": "user", "content": content}], "max_tokens": 12,
            "temperature": 0}
    body.update(kw)
    return body


def completion_body(prompt="The quick brown fox", **kw):
    body = {"model": NAME, "prompt": prompt, "max_tokens": 12, "temperature": 0}
    body.update(kw)
    return body


def stream_text(events, key="content"):
    out = ""
    for e in events:
        for c in e["choices"]:
            if "delta" in c:
                out += c["delta"].get(key) or ""
            else:
                out += c.get("text") or ""
    return out


class ServiceRoutes(unittest.TestCase):
    def test_health_version_models(self):
        status, _, body = SERVER.request("GET", "/health")
        self.assertEqual(status, 200)
        status, _, body = SERVER.request("GET", "/version")
        self.assertEqual(status, 200)
        self.assertIn("version", json.loads(body))
        status, _, body = SERVER.request("GET", "/v1/models")
        models = json.loads(body)
        self.assertEqual(models["object"], "list")
        self.assertEqual([m["id"] for m in models["data"]], [NAME, "m3-alias", "org/m3-tiny"])
        self.assertEqual(models["data"][0]["object"], "model")
        self.assertEqual(models["data"][0]["max_model_len"], 1024)
        # Retrieve one (the SDKs' models.retrieve): the list's entry; a slash as it is or as %2F.
        for path, name in (("/v1/models/" + NAME, NAME), ("/v1/models/org/m3-tiny", "org/m3-tiny"),
                           ("/v1/models/org%2Fm3-tiny", "org/m3-tiny")):
            status, _, body = SERVER.request("GET", path)
            self.assertEqual(status, 200, (path, body))
            self.assertEqual(json.loads(body), [m for m in models["data"] if m["id"] == name][0])
        status, _, body = SERVER.request("GET", "/v1/models/nope")
        self.assertEqual(status, 404, body)
        self.assertEqual(json.loads(body)["error"]["param"], "model")
        self.assertIn("`nope` does not exist", json.loads(body)["error"]["message"])
        self.assertEqual(SERVER.request("GET", "/v1/models/bad%zz")[0], 400)
        # A known path with the wrong method: 405 with Allow, in the OpenAI error shape.
        status, headers, body = SERVER.request("GET", "/v1/chat/completions")
        self.assertEqual(status, 405, body)
        self.assertEqual(headers["allow"], "POST")
        self.assertIn("not allowed", json.loads(body)["error"]["message"])
        status, headers, _ = SERVER.request("POST", "/v1/models", {})
        self.assertEqual((status, headers["allow"]), (405, "GET, HEAD"))

    def test_metrics_have_vllm_names(self):
        SERVER.post("/v1/completions", completion_body(max_tokens=2))
        status, hdrs, body = SERVER.request("GET", "/metrics")
        self.assertEqual(status, 200)
        self.assertTrue(hdrs["content-type"].startswith("text/plain"))
        text = body.decode()
        for name in ["vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                     "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
                     "vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting",
                     "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                     "vllm:num_preemptions_total", "vllm:request_success_total"]:
            self.assertIn(name + "{", text)
        self.assertNotIn("vllm:spec_decode", text)  # as vLLM without a speculative config
        self.assertIn('model_name="%s"' % NAME, text)
        self.assertGreater(SERVER.metric("vllm:generation_tokens_total"), 0)
        self.assertGreater(SERVER.metric("vllm:time_to_first_token_seconds_count"), 0)

    def test_vllm_series_are_present_and_move(self):
        moving = ["vllm:request_prefill_time_seconds_count", "vllm:request_decode_time_seconds_count",
                  "vllm:request_inference_time_seconds_count", "vllm:request_time_per_output_token_seconds_count",
                  "vllm:time_per_output_token_seconds_count", "vllm:iteration_tokens_total_count",
                  "vllm:iteration_tokens_total_sum", "vllm:request_decode_time_seconds_sum"]
        before = {n: SERVER.metric(n) for n in moving}
        r = SERVER.post("/v1/completions", completion_body(max_tokens=4, ignore_eos=True))
        after = {n: SERVER.metric(n) for n in moving}
        for n in moving:
            self.assertGreater(after[n], before[n], n)
        # One step per decode at least, and every computed token counted once.
        self.assertGreaterEqual(after["vllm:iteration_tokens_total_sum"] - before["vllm:iteration_tokens_total_sum"],
                                r["usage"]["completion_tokens"] - 1)
        text = SERVER.request("GET", "/metrics")[2].decode()
        for series, top in [("vllm:request_prefill_time_seconds", "7680.0"), ("vllm:request_decode_time_seconds", "7680.0"),
                            ("vllm:request_time_per_output_token_seconds", "80.0"),
                            ("vllm:iteration_tokens_total", "16384.0")]:
            self.assertIn("# TYPE %s histogram" % series, text)
            self.assertIn('%s_bucket{engine="0",model_name="%s",le="%s"}' % (series, NAME, top), text)
        info = [line for line in text.splitlines() if line.startswith("vllm:cache_config_info{")]
        self.assertEqual(len(info), 1, text)
        self.assertTrue(info[0].endswith("} 1.0"), info)
        for label in ['block_size="128"', 'cache_dtype="auto"', 'enable_prefix_caching="True"', 'engine="0"',
                      'gpu_memory_utilization="0.9"', 'num_gpu_blocks="']:
            self.assertIn(label, info[0])

    def test_tokenize_detokenize(self):
        t = SERVER.post("/tokenize", {"model": NAME, "prompt": "Hello world, héllo 世界"})
        self.assertEqual(t["count"], len(t["tokens"]))
        self.assertEqual(t["max_model_len"], 1024)
        d = SERVER.post("/detokenize", {"model": NAME, "tokens": t["tokens"]})
        self.assertEqual(d["prompt"], "Hello world, héllo 世界")
        chat = SERVER.post("/tokenize", {"model": NAME, "messages": [{"role": "user", "content": "hi"}]})
        self.assertGreater(chat["count"], 2)
        strs = SERVER.post("/tokenize", {"prompt": "abc", "return_token_strs": True})
        self.assertEqual(len(strs["token_strs"]), strs["count"])


class Completions(unittest.TestCase):
    def test_burst_of_connections_is_served(self):
        # 200 clients connecting at the same instant: none may be refused or reset (a listen
        # backlog of 5, as the earlier HTTP library had, reset some of them under load).
        bodies = [completion_body(prompt="burst %d" % k, max_tokens=1) for k in range(200)]
        out = post_all(SERVER, "/v1/completions", bodies)  # raises with every client error
        self.assertTrue(all(r["usage"]["completion_tokens"] == 1 for r in out))

    def test_shape(self):
        r = SERVER.post("/v1/completions", completion_body(max_tokens=5, ignore_eos=True))
        self.assertTrue(r["id"].startswith("cmpl-"))
        self.assertEqual(r["object"], "text_completion")
        self.assertIsInstance(r["created"], int)
        self.assertEqual(r["model"], NAME)
        self.assertEqual(len(r["choices"]), 1)
        c = r["choices"][0]
        self.assertEqual(c["index"], 0)
        self.assertIsInstance(c["text"], str)
        self.assertIsNone(c["logprobs"])
        self.assertEqual(c["finish_reason"], "length")
        u = r["usage"]
        self.assertEqual(u["completion_tokens"], 5)
        self.assertEqual(u["total_tokens"], u["prompt_tokens"] + 5)
        self.assertIsInstance(u["prompt_tokens_details"]["cached_tokens"], int)

    def test_stream_matches_whole_and_ends_with_done(self):
        body = completion_body(max_tokens=10, ignore_eos=True)
        whole = SERVER.post("/v1/completions", body)["choices"][0]["text"]
        events, done, _ = SERVER.stream("/v1/completions", dict(body, stream_options={"include_usage": True}))
        self.assertTrue(done)
        self.assertEqual(stream_text(events[:-1]), whole)
        for e in events[:-1]:
            self.assertEqual(e["object"], "text_completion")
            self.assertIsNone(e["usage"])
        self.assertEqual(events[-1]["choices"], [])
        self.assertEqual(events[-1]["usage"]["completion_tokens"], 10)
        finals = [c for e in events for c in e["choices"] if c["finish_reason"]]
        self.assertEqual([c["finish_reason"] for c in finals], ["length"])

    def test_token_id_prompts_and_batches(self):
        ids = SERVER.post("/tokenize", {"prompt": "The quick brown fox"})["tokens"]
        by_ids = SERVER.post("/v1/completions", completion_body(prompt=ids))
        by_text = SERVER.post("/v1/completions", completion_body())
        self.assertEqual(by_ids["choices"][0]["text"], by_text["choices"][0]["text"])
        batch = SERVER.post("/v1/completions", completion_body(prompt=["The quick brown fox", "Once upon"], n=2,
                                                               temperature=0))
        self.assertEqual([c["index"] for c in batch["choices"]], [0, 1, 2, 3])
        self.assertEqual(batch["choices"][0]["text"], by_text["choices"][0]["text"])
        self.assertEqual(batch["choices"][1]["text"], by_text["choices"][0]["text"])
        ids_batch = SERVER.post("/v1/completions", completion_body(prompt=[ids, ids[:3]]))
        self.assertEqual(len(ids_batch["choices"]), 2)

    def test_max_tokens_and_ignore_eos(self):
        r = SERVER.post("/v1/completions", completion_body(max_tokens=7, ignore_eos=True))
        self.assertEqual(r["usage"]["completion_tokens"], 7)
        self.assertEqual(r["choices"][0]["finish_reason"], "length")

    def test_stop_strings(self):
        full = SERVER.post("/v1/completions", completion_body(max_tokens=24, ignore_eos=True))["choices"][0]["text"]
        # A 2-character stop string from the middle of the output, at its first occurrence.
        for k in range(4, len(full) - 2):
            stop = full[k:k + 2]
            if stop.strip() and full.find(stop) == k:
                break
        else:
            self.skipTest("output too repetitive to pick a stop string: %r" % full)
        r = SERVER.post("/v1/completions", completion_body(max_tokens=24, ignore_eos=True, stop=[stop, "\x00never"]))
        c = r["choices"][0]
        self.assertEqual(c["text"], full[:k])
        self.assertEqual(c["finish_reason"], "stop")
        self.assertEqual(c["stop_reason"], stop)
        inc = SERVER.post("/v1/completions", completion_body(max_tokens=24, ignore_eos=True, stop=stop,
                                                             include_stop_str_in_output=True))
        self.assertEqual(inc["choices"][0]["text"], full[:k + 2])
        events, done, _ = SERVER.stream("/v1/completions", completion_body(max_tokens=24, ignore_eos=True, stop=stop))
        self.assertEqual(stream_text(events), full[:k])

    def test_stop_token_ids(self):
        r = SERVER.post("/v1/completions", completion_body(max_tokens=16, ignore_eos=True, return_token_ids=True))
        ids = r["choices"][0]["token_ids"]
        k = next(i for i in range(3, len(ids)) if ids[i] not in ids[:i])
        s = SERVER.post("/v1/completions", completion_body(max_tokens=16, ignore_eos=True, stop_token_ids=[ids[k]]))
        c = s["choices"][0]
        self.assertEqual(c["finish_reason"], "stop")
        self.assertEqual(c["stop_reason"], ids[k])
        self.assertEqual(s["usage"]["completion_tokens"], k + 1)
        self.assertEqual(c["text"], SERVER.post("/detokenize", {"tokens": ids[:k]})["prompt"])

    def test_logprobs(self):
        r = SERVER.post("/v1/completions", completion_body(max_tokens=6, ignore_eos=True, logprobs=3))
        lp = r["choices"][0]["logprobs"]
        for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"]:
            self.assertEqual(len(lp[key]), 6, key)
        self.assertTrue(all(v <= 0 for v in lp["token_logprobs"]))
        # Top 3 plus the sampled token; keyed by text, so tokens that decode alike (the partial
        # UTF-8 bytes of a random model, shown as U+FFFD) share an entry, as in vLLM.
        for tokens, top in zip(lp["tokens"], lp["top_logprobs"]):
            self.assertTrue(1 <= len(top) <= 4, top)
            self.assertIn(tokens, top)
        self.assertEqual("".join(lp["tokens"]), r["choices"][0]["text"])

    def test_echo_and_prompt_logprobs(self):
        prompt = "The quick brown fox"
        r = SERVER.post("/v1/completions", completion_body(prompt=prompt, max_tokens=3, ignore_eos=True, echo=True,
                                                           logprobs=1, prompt_logprobs=2))
        c = r["choices"][0]
        self.assertTrue(c["text"].startswith(prompt))
        n_prompt = r["usage"]["prompt_tokens"]
        self.assertEqual(len(c["logprobs"]["tokens"]), n_prompt + 3)
        self.assertIsNone(c["logprobs"]["token_logprobs"][0])
        self.assertIsInstance(c["logprobs"]["token_logprobs"][1], float)
        self.assertEqual(len(c["prompt_logprobs"]), n_prompt)
        self.assertIsNone(c["prompt_logprobs"][0])
        first = c["prompt_logprobs"][1]
        self.assertTrue(all({"logprob", "rank", "decoded_token"} <= set(v) for v in first.values()))

    def test_sampling_options_and_seed(self):
        body = completion_body(max_tokens=16, ignore_eos=True, temperature=1.0, top_p=0.95, top_k=50, min_p=0.01,
                               presence_penalty=0.3, frequency_penalty=0.2, repetition_penalty=1.1, seed=1234)
        a = SERVER.post("/v1/completions", body)["choices"][0]["text"]
        b = SERVER.post("/v1/completions", body)["choices"][0]["text"]
        self.assertEqual(a, b)
        c = SERVER.post("/v1/completions", dict(body, seed=98765))["choices"][0]["text"]
        self.assertNotEqual(a, c)
        n = SERVER.post("/v1/completions", dict(body, n=3))
        self.assertEqual(len(n["choices"]), 3)
        self.assertEqual(n["choices"][0]["text"], a)  # sample j uses seed + j


    def test_logit_bias(self):
        # +100 makes one token win at every step; -100 bans the greedy choice.
        the = SERVER.post("/tokenize", {"prompt": " the", "add_special_tokens": False})["tokens"]
        self.assertEqual(len(the), 1)
        body = completion_body(max_tokens=3, temperature=0, ignore_eos=True)
        forced = SERVER.post("/v1/completions", dict(body, logit_bias={str(the[0]): 100}))
        self.assertEqual(forced["choices"][0]["text"], " the" * 3)
        first = SERVER.post("/v1/completions", dict(body, max_tokens=1))["choices"][0]["text"]
        first_ids = SERVER.post("/tokenize", {"prompt": first, "add_special_tokens": False})["tokens"]
        self.assertEqual(len(first_ids), 1, first)
        banned = SERVER.post("/v1/completions", dict(body, max_tokens=1, logit_bias={str(first_ids[0]): -100}))
        self.assertNotEqual(banned["choices"][0]["text"], first)
        # The chat route takes it too, and a bias of 0 changes nothing.
        chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0,
                "ignore_eos": True}
        self.assertEqual(SERVER.post("/v1/chat/completions", dict(chat, logit_bias={str(the[0]): 100}))
                         ["choices"][0]["message"]["content"], " the" * 3)
        self.assertEqual(SERVER.post("/v1/completions", dict(body, logit_bias={str(the[0]): 0}))["choices"][0]["text"],
                         SERVER.post("/v1/completions", body)["choices"][0]["text"])
        # Ids outside the vocabulary, and values outside [-100, 100], are 400s naming the entry.
        for bias, param in (({"999999": 1}, "logit_bias.999999"), ({"5": 150}, "logit_bias.5"),
                            ({"x": 1}, "logit_bias.x")):
            err = SERVER.post("/v1/completions", dict(body, logit_bias=bias), expect=400)["error"]
            self.assertEqual(err["param"], param, err)


class ChatCompletions(unittest.TestCase):
    def test_shape(self):
        r = SERVER.post("/v1/chat/completions", chat_body(max_completion_tokens=6))
        self.assertTrue(r["id"].startswith("chatcmpl-"))
        self.assertEqual(r["object"], "chat.completion")
        self.assertEqual(r["model"], NAME)
        c = r["choices"][0]
        self.assertEqual(c["message"]["role"], "assistant")
        self.assertIn(c["finish_reason"], ("stop", "length"))
        self.assertIn("reasoning_content", c["message"])
        self.assertLessEqual(r["usage"]["completion_tokens"], 6)

    def test_stream_matches_whole(self):
        body = chat_body(max_tokens=12, ignore_eos=True)
        whole = SERVER.post("/v1/chat/completions", body)["choices"][0]["message"]
        events, done, _ = SERVER.stream("/v1/chat/completions", body)
        self.assertTrue(done)
        self.assertEqual(events[0]["object"], "chat.completion.chunk")
        self.assertEqual(events[0]["choices"][0]["delta"]["role"], "assistant")
        self.assertEqual(stream_text(events, "content"), whole["content"] or "")
        self.assertEqual(stream_text(events, "reasoning_content"), whole["reasoning_content"] or "")
        self.assertEqual(len({e["id"] for e in events}), 1)
        finals = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
        self.assertEqual(finals, ["length"])

    def test_n_and_logprobs(self):
        r = SERVER.post("/v1/chat/completions", chat_body(n=2, temperature=0.8, seed=5, logprobs=True,
                                                          top_logprobs=2, max_tokens=5, ignore_eos=True))
        self.assertEqual([c["index"] for c in r["choices"]], [0, 1])
        for c in r["choices"]:
            content = c["logprobs"]["content"]
            self.assertEqual(len(content), 5)
            for entry in content:
                self.assertEqual(set(entry), {"token", "logprob", "bytes", "top_logprobs"})
                self.assertEqual(len(entry["top_logprobs"]), 2)
        self.assertEqual(r["usage"]["completion_tokens"], 10)

    def test_request_options_are_accepted(self):
        tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
                                                   "parameters": {"type": "object",
                                                                  "properties": {"city": {"type": "string"}}}}}]
        for extra in [dict(tools=tools), dict(tools=tools, tool_choice="auto"), dict(tools=tools, tool_choice="none"),
                      dict(tools=tools, tool_choice={"type": "function", "function": {"name": "get_weather"}}),
                      dict(response_format={"type": "json_object"}), dict(reasoning_effort="low"),
                      dict(chat_template_kwargs={"thinking_mode": "disabled"}),
                      dict(chat_template_kwargs={"thinking_mode": "enabled"}),
                      dict(stop=["\n\n"], stream_options=None), dict(max_completion_tokens=3)]:
            r = SERVER.post("/v1/chat/completions", chat_body(**extra))
            self.assertIn(r["choices"][0]["finish_reason"], ("stop", "length", "tool_calls"), extra)
            events, done, _ = SERVER.stream("/v1/chat/completions", chat_body(**extra))
            self.assertTrue(done, extra)

    def test_named_and_required_tool_choice_force_a_call(self):
        # Random weights would rarely call a tool on their own: the constraint makes the output a call.
        weather = {"type": "function", "function": {"name": "get_weather", "description": "weather",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
        clock = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
        for thinking in ("disabled", "enabled", "adaptive"):
            # Reasoning of a random model may never end: max_tokens bounds it, and a call is then
            # required only when the reasoning closed (the constraint starts after its end marker).
            body = chat_body(tools=[weather, clock], max_tokens=48, ignore_eos=True,
                             tool_choice={"type": "function", "function": {"name": "get_time"}},
                             chat_template_kwargs={"thinking_mode": thinking})
            r = SERVER.post("/v1/chat/completions", dict(body, logprobs=True))
            choice = r["choices"][0]
            ids = [t["token"] for t in choice["logprobs"]["content"]]
            reasoning_closed = thinking == "disabled" or "</mm:think>" in "".join(ids)
            if reasoning_closed:
                calls = choice["message"]["tool_calls"]
                self.assertEqual(calls[0]["function"]["name"], "get_time", (thinking, choice))
                self.assertEqual(calls[0]["type"], "function")
            events, done, _ = SERVER.stream("/v1/chat/completions", dict(body, stream=True))
            self.assertTrue(done)
            if reasoning_closed:
                names = [tc["function"].get("name") for e in events for c in e.get("choices", [])
                         for tc in (c.get("delta", {}).get("tool_calls") or []) if "function" in tc]
                self.assertIn("get_time", names, thinking)
        # "required" with one tool names it (the whole call, constrained, takes ~40 tokens of this model).
        r = SERVER.post("/v1/chat/completions", chat_body(tools=[weather], tool_choice="required", max_tokens=64,
                                                          ignore_eos=True,
                                                          chat_template_kwargs={"thinking_mode": "disabled"}))
        self.assertEqual(r["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather")

    def test_multi_turn_with_tool_history(self):
        messages = [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"},
            {"role": "user", "content": "Thanks, and tomorrow?"},
        ]
        r = SERVER.post("/v1/chat/completions", {"model": NAME, "messages": messages, "max_tokens": 4})
        self.assertEqual(r["object"], "chat.completion")


    def test_prompt_logprobs_at_the_top_level(self):
        messages = [{"role": "user", "content": "Score this prompt"}]
        r = SERVER.post("/v1/chat/completions", chat_body(messages=messages, max_tokens=2, prompt_logprobs=1))
        n_prompt = r["usage"]["prompt_tokens"]
        lp = r["prompt_logprobs"]
        self.assertEqual(len(lp), n_prompt)
        self.assertIsNone(lp[0])
        for entry in lp[1:]:
            self.assertTrue(1 <= len(entry) <= 2, entry)  # the prompt's token and the top 1
            self.assertTrue(all({"logprob", "rank", "decoded_token"} == set(v) for v in entry.values()))
        self.assertNotIn("prompt_logprobs", r["choices"][0])
        # The same values as completions gives for the same prompt ids.
        ids = SERVER.post("/tokenize", {"model": NAME, "messages": messages})["tokens"]
        self.assertEqual(len(ids), n_prompt)
        c = SERVER.post("/v1/completions", completion_body(prompt=ids, max_tokens=1, prompt_logprobs=1))
        self.assertEqual(c["choices"][0]["prompt_logprobs"], lp)
        self.assertNotIn("prompt_logprobs", SERVER.post("/v1/chat/completions", chat_body(max_tokens=1)))
        # Streamed: on the choice's last chunk, at the chunk's top level.
        events, done, _ = SERVER.stream("/v1/chat/completions",
                                        chat_body(messages=messages, max_tokens=2, prompt_logprobs=1))
        self.assertTrue(done)
        self.assertEqual([e["prompt_logprobs"] for e in events if "prompt_logprobs" in e], [lp])


@unittest.skipIf(EXTRA, "serve flags are checked once, on one rank")
class ServeFlags(unittest.TestCase):
    def serve(self, *args):
        return LiveServer([BIN, "serve", MODEL, "--host", "127.0.0.1", "--port", "0", "--max-model-len", "512",
                           "--served-model-name", NAME, "--disable-log-stats"] + list(args))

    def test_prompt_tokens_details_only_with_the_flag(self):
        s = self.serve()
        try:
            body = chat_body(max_tokens=2)
            self.assertIsNone(s.post("/v1/chat/completions", body)["usage"]["prompt_tokens_details"])
            self.assertIsNone(s.post("/v1/completions", completion_body(max_tokens=2))["usage"]["prompt_tokens_details"])
            events, done, _ = s.stream("/v1/chat/completions", dict(body, stream_options={"include_usage": True}))
            self.assertTrue(done)
            self.assertIsNone(events[-1]["usage"]["prompt_tokens_details"])
        finally:
            self.assertEqual(s.stop(), 0)
        # With it (the shared server): the prefix cache's share of the prompt.
        long_prompt = "The cached part of this prompt repeats. " * 20
        SERVER.post("/v1/completions", completion_body(prompt=long_prompt, max_tokens=1))
        again = SERVER.post("/v1/completions", completion_body(prompt=long_prompt, max_tokens=1))
        self.assertGreaterEqual(again["usage"]["prompt_tokens_details"]["cached_tokens"], 128)

    def test_seed_seeds_requests_without_one_across_restarts(self):
        bodies = [completion_body(prompt="seeded %d" % i, max_tokens=12, ignore_eos=True, temperature=1.0)
                  for i in range(2)]

        def run(seed):
            s = self.serve("--seed", str(seed))
            try:
                return [s.post("/v1/completions", b)["choices"][0]["text"] for b in bodies]
            finally:
                self.assertEqual(s.stop(), 0)
        a = run(21)
        self.assertEqual(run(21), a)
        self.assertNotEqual(run(22), a)

    def test_tokenizer_folder_replaces_the_models(self):
        import shutil
        import tempfile
        with tempfile.TemporaryDirectory() as folder:
            for name in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(os.path.join("models/minimax-m3-small", name), folder)
            with open(os.path.join(folder, "chat_template.jinja"), "w") as f:
                f.write("{% for m in messages %}[{{ m.content }}]{% endfor %}")
            s = self.serve("--tokenizer", folder)
            try:
                self.assertIn("tokenizer and chat template from " + folder, s.log_text())
                text = "Hello tokenizer, the quick brown fox"
                mine = s.post("/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]
                models = SERVER.post("/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]
                self.assertNotEqual(mine, models)  # another vocabulary
                self.assertEqual(s.post("/detokenize", {"tokens": mine})["prompt"], text)
                chat = s.post("/tokenize", {"messages": [{"role": "user", "content": "hi"}]})["tokens"]
                self.assertEqual(chat, s.post("/tokenize", {"prompt": "[hi]", "add_special_tokens": False})["tokens"])
            finally:
                self.assertEqual(s.stop(), 0)
        p = subprocess.run([BIN, "serve", MODEL, "--tokenizer", "/nonexistent/tok", "--port", "0"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn("--tokenizer '/nonexistent/tok' is neither a directory nor a valid Hugging Face repo id", p.stderr)

    def test_several_served_model_names(self):
        for name in (NAME, "m3-alias"):
            self.assertEqual(SERVER.post("/v1/completions", completion_body(model=name, max_tokens=1))["model"], NAME)
        models = json.loads(SERVER.request("GET", "/v1/models")[2])
        self.assertEqual([m["id"] for m in models["data"]], [NAME, "m3-alias", "org/m3-tiny"])
        self.assertEqual(SERVER.request("POST", "/v1/completions", completion_body(model="other"))[0], 404)


class SpeculativeDecoding(unittest.TestCase):
    """--speculative-config with the n-gram drafter: the same text as the same server without it
    (greedy and seeded; --batch-invariant, so that on a GPU a verification step's rows equal decode
    steps' too), streams, logprobs, n > 1, stop strings; the vllm:spec_decode_* counters move."""

    def serve(self, *extra):
        return LiveServer([BIN, "serve", MODEL, "--host", "127.0.0.1", "--port", "0", "--served-model-name", NAME,
                           "--max-model-len", "1024", "--kv-cache-memory", "64MiB", "--disable-log-stats",
                           "--reasoning-parser", "minimax_m3", "--tool-call-parser", "minimax_m3",
                           "--enable-auto-tool-choice", "--batch-invariant"] + list(extra))

    def test_same_text_as_without_speculation(self):
        plain = self.serve()
        s = self.serve("--speculative-config", '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_min":2}')
        try:
            prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add("
            bodies = [completion_body(prompt=prompt, max_tokens=40),
                      completion_body(prompt=prompt, max_tokens=40, temperature=0.9, seed=11, logprobs=2, n=2),
                      completion_body(prompt="one two three one two three one two", max_tokens=24, stop=["three"])]
            for body in bodies:
                want = plain.post("/v1/completions", body)
                got = s.post("/v1/completions", body)
                self.assertEqual([c["text"] for c in got["choices"]], [c["text"] for c in want["choices"]], body)
                self.assertEqual([c["finish_reason"] for c in got["choices"]],
                                 [c["finish_reason"] for c in want["choices"]], body)
                for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
                    self.assertEqual(got["usage"][key], want["usage"][key], body)
                if body.get("logprobs"):
                    self.assertEqual([c["logprobs"]["tokens"] for c in got["choices"]],
                                     [c["logprobs"]["tokens"] for c in want["choices"]])
                    for g, w in zip(got["choices"], want["choices"]):
                        for a, b in zip(g["logprobs"]["token_logprobs"], w["logprobs"]["token_logprobs"]):
                            self.assertAlmostEqual(a, b, places=4)
            chat = chat_body(content="Repeat after me: red green blue red green blue", max_tokens=30)
            events, done, _ = s.stream("/v1/chat/completions", dict(chat, stream=True))
            self.assertTrue(done)
            want = plain.post("/v1/chat/completions", chat)["choices"][0]["message"]
            self.assertEqual(stream_text(events), want["content"] or "")
            self.assertEqual(stream_text(events, "reasoning_content") or None, want.get("reasoning_content") or None)
            # Tool calls: the parser sees the same text, so the same calls (or none).
            tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
            for choice in ("auto", "required"):
                body = chat_body(content="What is the weather in Paris? Use the tool.", max_tokens=48, tools=tools,
                                 tool_choice=choice)
                got = s.post("/v1/chat/completions", body)["choices"][0]
                want = plain.post("/v1/chat/completions", body)["choices"][0]
                calls = [[c["function"] for c in m.get("tool_calls") or []] for m in (got["message"], want["message"])]
                self.assertEqual(calls[0], calls[1], choice)  # names and arguments (ids are random)
                self.assertEqual(got["message"].get("content"), want["message"].get("content"), choice)
                self.assertEqual(got["finish_reason"], want["finish_reason"], choice)
            metrics = s.request("GET", "/metrics")[2].decode()
            drafts = re.search(r'vllm:spec_decode_num_draft_tokens_total\{[^}]*\} ([0-9.]+)', metrics)
            self.assertIsNotNone(drafts, metrics)
            self.assertGreater(float(drafts.group(1)), 0)
            self.assertIn('vllm:spec_decode_num_accepted_tokens_per_pos_total{', metrics)
            self.assertNotIn("vllm:spec_decode", plain.request("GET", "/metrics")[2].decode())
        finally:
            self.assertEqual(s.stop(), 0)
            self.assertEqual(plain.stop(), 0)


class BadInput(unittest.TestCase):
    def check(self, path, body, status, words, param=None, headers=None):
        code, _, raw = SERVER.request("POST", path, body, headers)
        self.assertEqual(code, status, raw)
        err = json.loads(raw)["error"]
        self.assertEqual(set(err), {"message", "type", "param", "code"})
        self.assertEqual(err["code"], status)
        self.assertIn(words, err["message"])
        if param is not None:
            self.assertEqual(err["param"], param)

    def test_errors(self):
        c, m = "/v1/completions", "/v1/chat/completions"
        self.check(c, b"{nope", 400, "not valid JSON")
        self.check(c, b'{"prompt": "\xff\xfe"}', 400, "UTF-8")
        self.check(c, b'{"prompt": "\\ud800"}', 400, "not valid JSON")
        self.check(c, {"prompt": "x", "model": "gpt-4"}, 404, "does not exist", "model")
        self.check(c, {"prompt": 12}, 400, "prompt", "prompt")
        self.check(c, {"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens", "max_tokens")
        self.check(c, {"prompt": "x", "max_tokens": 5000}, 400, "maximum context length", "max_tokens")
        self.check(c, {"prompt": "word " * 1500}, 400, "maximum context length")
        self.check(c, {"prompt": "x", "temperature": -1}, 400, "temperature", "temperature")
        self.check(c, {"prompt": "x", "top_p": 0}, 400, "top_p", "top_p")
        self.check(c, {"prompt": "x", "top_k": -5}, 400, "top_k", "top_k")
        self.check(c, {"prompt": "x", "logprobs": 50}, 400, "logprobs", "logprobs")
        self.check(c, {"prompt": "x", "n": 0}, 400, "'n'", "n")
        self.check(c, {"prompt": [1, 2, 10 ** 7]}, 400, "vocabulary")
        self.check(c, {"prompt": "x", "stream": "yes"}, 400, "stream", "stream")
        self.check(m, {"messages": []}, 400, "messages", "messages")
        self.check(m, {"messages": [{"role": "user"}]}, 400, "content", "messages[0].content")
        self.check(m, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
                   400, "not supported", "messages[0].content[0]")
        self.check(m, dict(chat_body(), top_logprobs=3), 400, "logprobs", "top_logprobs")
        self.check(m, dict(chat_body(), presence_penalty=5), 400, "presence_penalty", "presence_penalty")
        self.check(m, dict(chat_body(), tool_choice="required"), 400, "tools", "tool_choice")
        self.check(m, dict(chat_body(), chat_template_kwargs={"thinking_mode": "sometimes"}), 400, "thinking_mode")
        self.check("/v1/embeddings", {"input": "x"}, 404, "no route")
        # After all that the server still answers.
        self.assertEqual(SERVER.request("GET", "/health")[0], 200)
        SERVER.post("/v1/completions", completion_body(max_tokens=2))


class AuthAndLimits(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # The connection cap is the hostile suite's (test_hostile.py); here it only has to leave room
        # for connections that linger after an error reply (the 413 below reads the rest of its body
        # for a moment), which a cap of 3 did not always.
        cls.server = LiveServer([BIN, "serve", MODEL, "--host", "127.0.0.1", "--port", "0", "--api-key", "sk-abc",
                                 "--max-body-size", "4KiB", "--max-header-size", "2KiB", "--max-connections", "16",
                                 "--max-model-len", "512", "--disable-log-stats"])

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_api_key(self):
        s = self.server
        body = {"prompt": "hi", "max_tokens": 2}
        status, hdrs, raw = s.request("POST", "/v1/completions", body)
        self.assertEqual(status, 401)
        self.assertEqual(json.loads(raw)["error"]["code"], 401)
        self.assertEqual(s.request("POST", "/v1/completions", body, {"Authorization": "Bearer wrong"})[0], 401)
        self.assertEqual(s.request("POST", "/v1/completions", body, {"Authorization": "Bearer sk-abc"})[0], 200)
        self.assertEqual(s.request("GET", "/v1/models")[0], 401)
        self.assertEqual(s.request("GET", "/health")[0], 200)
        self.assertEqual(s.request("GET", "/metrics")[0], 200)

    def test_body_and_header_limits(self):
        s = self.server
        auth = {"Authorization": "Bearer sk-abc"}
        status, _, raw = s.request("POST", "/v1/completions", {"prompt": "x" * 10000}, auth)
        self.assertEqual(status, 413)
        self.assertIn("too large", json.loads(raw)["error"]["message"])
        big = dict(auth, **{"X-Fill-%d" % i: "v" * 400 for i in range(8)})
        status, _, raw = s.request("POST", "/v1/completions", {"prompt": "x"}, big)
        self.assertEqual(status, 431)
        self.assertEqual(s.request("GET", "/health")[0], 200)


class Lifecycle(unittest.TestCase):
    def test_sigterm_drains_in_flight_streams(self):
        s = LiveServer([BIN, "serve", MODEL, "--host", "127.0.0.1", "--port", "0", "--max-model-len", "512",
                        "--disable-log-stats"])
        sock = open_stream(s.port, "/v1/completions", {"prompt": "drain me", "max_tokens": 64, "ignore_eos": True})
        received = b""
        while b"data: " not in received:
            received += sock.recv(65536)
        s.proc.send_signal(15)
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        sock.close()
        self.assertIn(b"data: [DONE]", received)
        self.assertIn(b'"finish_reason":"length"', received)
        self.assertEqual(s.proc.wait(60), 0, s.log_text())
        self.assertIn("draining", s.log_text())

    def test_health_is_503_while_loading(self):
        s = LiveServer([BIN, "serve", MODEL, "--host", "127.0.0.1", "--port", "0", "--max-model-len", "512",
                        "--disable-log-stats"], wait_ready=False)
        status = s.request("GET", "/health")[0]
        self.assertIn(status, (200, 503))
        s.wait_ready()
        self.assertEqual(s.request("GET", "/health")[0], 200)
        self.assertEqual(s.stop(), 0)


class ServeOptions(unittest.TestCase):
    def test_chat_template_generation_config_and_served_name(self):
        import tempfile
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "generation_config.json"), "w") as f:
                json.dump({"temperature": 0.0, "top_p": 0.5, "max_new_tokens": 5}, f)
            template = os.path.join(folder, "plain.jinja")
            with open(template, "w") as f:
                f.write("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                        "{% if add_generation_prompt %}assistant:{% endif %}")
            s = LiveServer([BIN, "serve", "--model", MODEL, "--host", "127.0.0.1", "--port", "0",
                            "--chat-template", template, "--generation-config", folder,
                            "--served-model-name", "custom", "--max-model-len", "512", "--disable-log-stats"])
            try:
                body = {"model": "custom", "messages": [{"role": "user", "content": "hi"}]}
                a, b = s.post("/v1/chat/completions", body), s.post("/v1/chat/completions", body)
                # generation_config: greedy (temperature 0) and at most 5 new tokens by default.
                self.assertEqual(a["choices"][0]["message"], b["choices"][0]["message"])
                self.assertLessEqual(a["usage"]["completion_tokens"], 5)
                t = s.post("/tokenize", {"messages": body["messages"]})
                plain = s.post("/tokenize", {"prompt": "user: hi\nassistant:", "add_special_tokens": False})
                self.assertEqual(t["tokens"], plain["tokens"])
                self.assertEqual(s.request("POST", "/v1/chat/completions", dict(body, model="tiny"))[0], 404)
            finally:
                self.assertEqual(s.stop(), 0)

    def test_missing_model_fails_clearly(self):
        p = subprocess.run([BIN, "serve", "/nonexistent/model", "--port", "0"], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn("/nonexistent/model", p.stderr)
        p = subprocess.run([BIN, "serve"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn("serve needs a model", p.stderr)


class SeedCommandLines(unittest.TestCase):
    """docs/reference.md D7: both seed lines parse; what cannot run here fails by name."""
    SPEC1 = ('{"method":"dspark","num_speculative_tokens":7,"attention_backend":"FLASHINFER_TS",'
             '"kv_cache_dtype":"fp8","draft_sample_method":"probabilistic"}')
    SPEC2 = ('{"method":"dspark","num_speculative_tokens":3,"attention_backend":"TRITON_ATTN",'
             '"kv_cache_dtype":"fp8","draft_sample_method":"probabilistic"}')

    def run_serve(self, args, env=None):
        p = subprocess.run([BIN, "serve"] + args, capture_output=True, text=True, timeout=120, env=env)
        return p.returncode, p.stderr

    def line1(self, model, tp):
        return [model, "-tp", tp, "--reasoning-parser", "minimax_m3", "--block-size", "128",
                "--kv-cache-dtype", "nvfp4", "--attention-config", '{"indexer_kv_dtype": "nvfp4"}',
                "--speculative-config", self.SPEC1, "--disable-hybrid-kv-cache-manager"]

    def line2(self, model, tp):
        return [model, "-tp", tp, "--reasoning-parser", "minimax_m3", "--block-size", "128",
                "--kv-cache-dtype", "nvfp4", "--attention-config",
                '{"indexer_kv_dtype": "nvfp4", "indexer_decode_cp": true}',
                "--quantization-config.moe", "mxfp8", "--speculative-config", self.SPEC2,
                "--disable-hybrid-kv-cache-manager"]

    def test_seed_lines_parse(self):
        # Both seed command lines parse (-tp 4 and every flag known, the speculative config valid);
        # what stops them here is the checkpoint, which this machine does not have.
        for line in (self.line1("MiniMaxAI/MiniMax-M3.1-Flash", "4"), self.line2("MiniMaxAI/MiniMax-M3.1-Flash", "4")):
            # Offline: a machine with a network must not start fetching the real checkpoint.
            code, err = self.run_serve(line + ["--download-dir", "/nonexistent-m3serve-cache"],
                                       env=dict(os.environ, HF_HUB_OFFLINE="1"))
            self.assertEqual(code, 1, err)
            self.assertIn("MiniMaxAI/MiniMax-M3.1-Flash", err)
            self.assertNotIn("--speculative-config", err)
            self.assertNotIn("not expected", err)
            self.assertNotIn("Could not convert", err)

    def test_each_unsupported_option_is_named(self):
        # Port 0: the seed line's 8000 may be taken by a suite running beside this one.
        code, err = self.run_serve(self.line1(MODEL, "1") + ["--port", "0"])
        self.assertEqual(code, 1)
        self.assertIn("--speculative-config: method dspark: no drafter at", err)  # the tiny model ships none
        line = self.line2(MODEL, "1")
        spec = line.index("--speculative-config")
        del line[spec:spec + 2]
        code, err = self.run_serve(line + ["--port", "0"])
        self.assertEqual(code, 1)
        self.assertIn("indexer_decode_cp", err)
        line[line.index('{"indexer_kv_dtype": "nvfp4", "indexer_decode_cp": true}')] = '{"indexer_kv_dtype": "nvfp4"}'
        code, err = self.run_serve(line + ["--port", "0"])
        self.assertEqual(code, 1)
        self.assertIn("--quantization-config.moe mxfp8", err)
        code, err = self.run_serve([MODEL, "--block-size", "64", "--port", "0"])
        self.assertEqual(code, 1)
        self.assertIn("--block-size 64", err)
        # A GPU option on the CPU backend (on a GPU machine --device auto would take it and serve).
        code, err = self.run_serve([MODEL, "--device", "cpu", "--gpu-memory-utilization", "0.9", "--port", "0"])
        self.assertEqual(code, 1)
        self.assertIn("--gpu-memory-utilization", err)

    def test_seed_options_that_can_run_here_do(self):
        line = self.line1(MODEL, "1")
        spec = line.index("--speculative-config")
        del line[spec:spec + 2]
        s = LiveServer([BIN, "serve"] + line + ["--host", "127.0.0.1", "--port", "0", "--max-model-len", "512",
                                                "--disable-log-stats"])
        try:
            r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            self.assertEqual(r["object"], "chat.completion")
        finally:
            self.assertEqual(s.stop(), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
