"""`m3serve bench agentic` end to end against `m3serve serve` on the random tiny model.

A small seeded synthetic corpus (sub-agents, heavy-tailed think times), replayed with 1 and 2
lanes and think times scaled down: request accounting, the idle cap bounding every wait, one
cache-bust marker per replay, a prefix hit rate from /metrics above 0, the server's usage token
counts, requests over --max-context-length skipped and counted, the JSON fields, and the SVG and
PNG plots (signature, IHDR, every chunk's CRC, the image data inflating to its size).

Run: M3SERVE_BIN=build/bin/m3serve python3 tests/loadgen/test_bench_agentic.py (from the repo root).
"""
import http.server
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from live_server import LiveServer  # noqa: E402

BIN = os.environ.get("M3SERVE_BIN", "build/bin/m3serve")
MODEL = os.environ.get("M3SERVE_MODEL", "models/minimax-m3-tiny")
IDLE_CAP = 0.3
GENERATE = ["--num-sessions", "3", "--seed", "11", "--gen-median-turns", "3", "--gen-system-tokens", "200",
            "--gen-tool-tokens", "100", "--gen-new-tokens", "60", "--gen-output-tokens", "6",
            "--gen-subagent-probability", "0.5", "--gen-max-context", "1200"]


def read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


def m3serve(*args, check=True):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=240)
    if check and p.returncode != 0:
        raise AssertionError("m3serve %s -> %d\n%s" % (" ".join(args), p.returncode, p.stderr[-3000:]))
    return p


def trace_requests(steps):
    for s in steps:
        if s["type"] == "subagent":
            yield from trace_requests(s["requests"])
        else:
            yield s


def png_chunks(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "no PNG signature"
    at, chunks = 8, []
    while at < len(data):
        length, = struct.unpack(">I", data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        crc, = struct.unpack(">I", data[at + 8 + length:at + 12 + length])
        assert crc == zlib.crc32(kind + body), "bad CRC in %r" % kind
        chunks.append((kind, body))
        at += 12 + length
    return chunks


class BenchAgentic(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="bench_agentic_")
        cls.traces = os.path.join(cls.dir, "traces.jsonl")
        m3serve("bench", "agentic", "--generate-traces", cls.traces, *GENERATE)
        cls.sessions = [json.loads(line) for line in read(cls.traces).splitlines()]
        sizes = sorted(r["in"] + r["out"] for s in cls.sessions for r in trace_requests(s["requests"]))
        # Some requests of the corpus lie above the limit, most below.
        cls.max_context = sizes[int(len(sizes) * 0.85)]
        cls.server = LiveServer([BIN, "serve", MODEL, "--host", "127.0.0.1", "--port", "0",
                                 "--enable-prompt-tokens-details", "--disable-log-stats", "--max-model-len", "2048"])
        cls.out = os.path.join(cls.dir, "result.json")
        cls.svg, cls.png = os.path.join(cls.dir, "p.svg"), os.path.join(cls.dir, "p.png")
        try:
            p = m3serve("bench", "agentic", "--traces", cls.traces, "--base-url", "http://127.0.0.1:%d" % cls.server.port,
                        "--concurrency", "1,2", "--max-replays", "4", "--think-time-scale", "0.2",
                        "--idle-cap-seconds", str(IDLE_CAP), "--idle-cap-mode", "wait", "--warmup-requests", "1", "--tokenizer", MODEL,
                        "--max-context-length", str(cls.max_context), "--num-gpus", "2", "--detailed",
                        "--label", "tiny cpu", "--output", cls.out, "--plot", cls.svg, "--plot-png", cls.png,
                        "--json")
        finally:
            cls.server.kill()
        cls.stdout_report = json.loads(p.stdout)
        cls.report = json.loads(read(cls.out))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_generator_is_seeded(self):
        again = os.path.join(self.dir, "again.jsonl")
        m3serve("bench", "agentic", "--generate-traces", again, *GENERATE)
        self.assertEqual(read(again), read(self.traces))
        self.assertTrue(any(r["type"] == "subagent" for s in self.sessions for r in s["requests"]))

    def test_json_fields(self):
        self.assertEqual(self.report, self.stdout_report)
        for key in ("label", "model", "endpoint", "num_gpus", "corpus_theoretical_hit_rate", "runs"):
            self.assertIn(key, self.report)
        self.assertEqual([r["concurrency"] for r in self.report["runs"]], [1, 2])
        for run in self.report["runs"]:
            for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2el_ms"):
                self.assertEqual(set(run[key]), {"count", "mean", "p50", "p90", "p95", "p99"})
            self.assertGreater(run["interactivity_tok_s_user"], 0)
            t = run["throughput"]
            self.assertGreater(t["total_tok_s"], 0)
            self.assertAlmostEqual(t["total_tok_s_per_gpu"] * 2, t["total_tok_s"], places=6)
            self.assertAlmostEqual(t["total_tok_s"], t["input_tok_s"] + t["output_tok_s"], places=6)

    def test_request_accounting(self):
        for run in self.report["runs"]:
            req, records = run["requests"], run["request_records"]
            self.assertEqual(req["sent"], req["completed"] + req["failed"])
            self.assertEqual(req["failed"], 0, run["errors"])
            self.assertEqual(req["sent"] + req["skipped_over_context"], len(records))
            self.assertEqual(req["replays"], 4)
            self.assertEqual(req["context_resets"], 0)  # every turn extends its agent's array
            self.assertEqual(req["warmup"], run["concurrency"])  # one per lane
            self.assertEqual(req["measured"], req["completed"] - req["warmup"])
            self.assertTrue(any(r["agent"] != "main" for r in records), "no sub-agent request was sent")

    def test_requests_over_the_context_limit_are_skipped(self):
        for run in self.report["runs"]:
            self.assertGreater(run["requests"]["skipped_over_context"], 0)
            for r in run["request_records"]:
                over = r["trace_in"] + r["trace_out"] > self.max_context
                self.assertEqual(r["status"] == "skipped", over, r)

    def test_idle_cap_bounds_every_wait(self):
        for run in self.report["runs"]:
            self.assertGreater(run["think"]["capped_waits"], 0)
            self.assertLessEqual(run["think"]["max_wait_s"], IDLE_CAP + 1e-9)
            for r in run["request_records"]:
                self.assertLessEqual(r["wait_s"], IDLE_CAP + 1e-9)
                self.assertAlmostEqual(r["wait_s"], min(r["recorded_wait_s"] * 0.2, IDLE_CAP), places=9)
            # Between one agent's requests the client waits no longer than the cap (plus slack).
            by_agent = {}
            for r in run["request_records"]:
                if r["status"] == "ok":
                    by_agent.setdefault((r["replay"], r["agent"]), []).append(r)
            for rs in by_agent.values():
                rs.sort(key=lambda r: r["start_s"])
                for a, b in zip(rs, rs[1:]):
                    if a["agent"] == "main":
                        continue  # the main agent also waits for its sub-agents
                    self.assertLess(b["start_s"] - (a["start_s"] + a["e2e_s"]), IDLE_CAP + 1.0)

    def test_one_cache_bust_marker_per_replay(self):
        markers = [p["marker"] for run in self.report["runs"] for p in run["replays"]]
        self.assertEqual(len(markers), 8)
        self.assertEqual(len(set(markers)), len(markers))
        # The recycled session (replay 3 = session 0 again) has its own marker.
        run = self.report["runs"][0]
        by_replay = {p["replay"]: p for p in run["replays"]}
        self.assertEqual(by_replay[0]["session"], by_replay[3]["session"])
        self.assertNotEqual(by_replay[0]["marker"], by_replay[3]["marker"])

    def test_prefix_hits_from_the_server(self):
        for run in self.report["runs"]:
            pc = run["prefix_cache"]
            self.assertGreater(pc["server_queries"], 0)
            self.assertGreater(pc["server_hit_rate"], 0)
            self.assertGreater(pc["usage_cached_rate"], 0)
            self.assertGreater(pc["theoretical_hit_rate"], 0)

    def test_server_token_counts_are_used(self):
        for run in self.report["runs"]:
            self.assertEqual(run["requests"]["with_server_usage"], run["requests"]["measured"])
            ok = [r for r in run["request_records"] if r["status"] == "ok"]
            measured = [r for r in ok if not r["warmup"]]
            self.assertEqual(run["tokens"]["input"], sum(r["prompt_tokens"] for r in measured))
            self.assertEqual(run["tokens"]["output"], sum(r["completion_tokens"] for r in measured))
            for r in ok:
                self.assertTrue(r["server_usage"])
                self.assertEqual(r["completion_tokens"], max(r["trace_out"], 1))  # max_tokens, ignore_eos
                # One token per word: the prompt is the trace's input plus the chat template and marker.
                self.assertGreaterEqual(r["prompt_tokens"], r["trace_in"])
            overheads = {r["prompt_tokens"] - r["trace_in"] for r in ok}
            self.assertLess(max(overheads) - min(overheads), 64, overheads)

    def test_plots_are_written(self):
        svg = read(self.svg)
        self.assertTrue(svg.startswith("<svg"))
        self.assertIn("tiny cpu", svg)
        self.check_png(self.png)

    def check_png(self, path):
        chunks = png_chunks(read(path, "rb"))
        self.assertEqual([k for k, _ in chunks], [b"IHDR", b"IDAT", b"IEND"])
        width, height, depth, color = struct.unpack(">IIBB", chunks[0][1][:10])
        self.assertEqual((depth, color), (8, 2))
        raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
        self.assertEqual(len(raw), height * (1 + 3 * width))

    def test_plot_of_several_result_files(self):
        svg, png = os.path.join(self.dir, "two.svg"), os.path.join(self.dir, "two.png")
        m3serve("bench", "agentic", "--plot", svg, "--plot-png", png, self.out, self.out,
                "--labels", "fp8 KV,host tier on")
        text = read(svg)
        self.assertIn("fp8 KV", text)
        self.assertIn("host tier on", text)
        self.check_png(png)

    def test_trajectory_start_exact_counts_and_duration(self):
        out, timed = os.path.join(self.dir, "trajectory.json"), os.path.join(self.dir, "timed.json")
        server = LiveServer([BIN, "serve", MODEL, "--host", "127.0.0.1", "--port", "0", "--disable-log-stats",
                             "--max-model-len", "2048"])
        url = "http://127.0.0.1:%d" % server.port
        try:
            m3serve("bench", "agentic", "--traces", self.traces, "--base-url", url,
                    "--max-replays", "3", "--think-time-scale", "0", "--trajectory-start-min-ratio", "0.5",
                    "--trajectory-start-max-ratio", "0.5", "--detailed", "--output", out)
            # Recorded think times (up to the 10 s cap) and a 1.5 s limit: the waits in progress end
            # at the limit, lanes recycle nothing after it.
            # /v1/completions with the server's tokenizer: the prompt is exactly the trace's `in`
            # (one token per word, the marker in place of as many words).
            exact = os.path.join(self.dir, "exact.json")
            m3serve("bench", "agentic", "--traces", self.traces, "--base-url", url, "--endpoint", "completions",
                    "--max-replays", "2", "--think-time-scale", "0", "--tokenizer", MODEL, "--detailed",
                    "--output", exact)
            start = time.monotonic()
            m3serve("bench", "agentic", "--traces", self.traces, "--base-url", url, "--concurrency", "2",
                    "--duration", "1.5", "--output", timed)
            elapsed = time.monotonic() - start
        finally:
            server.kill()
        records = json.loads(read(exact))["runs"][0]["request_records"]
        self.assertGreater(len(records), 3)
        for r in records:
            self.assertEqual(r["status"], "ok", r)
            self.assertEqual(r["prompt_tokens"], r["trace_in"], r)
        level = json.loads(read(timed))["runs"][0]
        self.assertGreater(level["requests"]["sent"], 0)
        self.assertEqual(level["requests"]["failed"], 0, level["errors"])
        # Without the stop the lanes would sit out 10 s waits (the corpus's second turns).
        self.assertLess(level["wall_s"], 9.0)
        self.assertLess(elapsed, 15.0)
        run = json.loads(read(out))["runs"][0]
        self.assertEqual(run["requests"]["failed"], 0, run["errors"])
        for p in run["replays"]:
            session = next(s for s in self.sessions if s["id"] == p["session"])
            main_requests = sum(1 for r in session["requests"] if r["type"] != "subagent")
            turns = [r["turn"] for r in run["request_records"] if r["replay"] == p["replay"] and r["agent"] == "main"]
            self.assertEqual(min(turns), main_requests // 2, (p, turns))

    def test_a_bad_trace_line_is_named(self):
        bad = os.path.join(self.dir, "bad.jsonl")
        with open(bad, "w") as f:
            f.write(read(self.traces).splitlines()[0] + "\n")
            f.write('{"id":"x","requests":[{"t":0,"type":"n","in":10,"out":1,"hash_ids":[1,2]}]}\n')
        p = m3serve("bench", "agentic", "--traces", bad, "--base-url", "http://127.0.0.1:9", "--model", "m",
                    check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn(bad + ":2: requests[0].hash_ids: 2 ids for in=10 tokens", p.stderr)


class ScriptedOpenAI(http.server.BaseHTTPRequestHandler):
    """A stand-in OpenAI server: each streamed completion sends 5 text chunks 80 ms apart, then
    usage, over chunked transfer encoding; no /metrics. Keeps every request body it got."""
    protocol_version = "HTTP/1.1"
    bodies = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = b'{"data":[{"id":"scripted"}]}' if self.path == "/v1/models" else b"not here"
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ScriptedOpenAI.bodies.append(request)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def event(obj):
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        for _ in range(5):
            time.sleep(0.08)
            event({"choices": [{"index": 0, "delta": {"content": "x"}}]})
        event({"choices": [], "usage": {"prompt_tokens": 1000, "completion_tokens": 5}})
        event(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")


class AgainstAnotherServer(unittest.TestCase):
    def test_chunk_times_and_usage_of_a_scripted_server(self):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ScriptedOpenAI)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        work = tempfile.mkdtemp(prefix="bench_agentic_scripted_")
        try:
            traces = os.path.join(work, "t.jsonl")
            with open(traces, "w") as f:
                f.write(json.dumps({"id": "one", "requests": [
                    {"t": 0, "type": "n", "in": 100, "out": 5, "hash_ids": [1, 2]},
                    {"t": 9, "type": "n", "in": 150, "out": 5, "hash_ids": [1, 3, 4], "think_time": 0.05}]}) + "\n")
            p = m3serve("bench", "agentic", "--traces", traces, "--base-url",
                        "http://127.0.0.1:%d" % server.server_address[1], "--json")
        finally:
            server.shutdown()
            shutil.rmtree(work, ignore_errors=True)
        run = json.loads(p.stdout)["runs"][0]
        self.assertEqual(run["requests"]["completed"], 2)
        # Each chunk is seen when it arrives: 80 ms apart, the first after 80 ms.
        self.assertEqual(run["itl_ms"]["count"], 8)
        self.assertGreater(run["itl_ms"]["p50"], 60)
        self.assertLess(run["itl_ms"]["p50"], 200)
        self.assertGreater(run["ttft_ms"]["p50"], 60)
        self.assertEqual(run["tokens"]["input"], 2000)  # the server's count, not the trace's
        self.assertEqual(run["prefix_cache"]["server_hit_rate"], -1)  # no /metrics there
        self.assertAlmostEqual(run["prefix_cache"]["theoretical_hit_rate"], 64 / 250)
        first, second = ScriptedOpenAI.bodies[-2:]
        self.assertEqual(first["model"], "scripted")
        self.assertEqual((first["max_tokens"], first["ignore_eos"], first["stream"]), (5, True, True))
        self.assertEqual(first["stream_options"], {"include_usage": True})
        # The whole array again, grown: the first turn's messages unchanged at its start.
        self.assertEqual(second["messages"][:len(first["messages"])], first["messages"])
        self.assertGreater(len(second["messages"]), len(first["messages"]))
        self.assertTrue(first["messages"][-1]["content"].startswith("[rid:"))

    def test_subagents_join_before_the_parents_next_turn(self):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ScriptedOpenAI)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        work = tempfile.mkdtemp(prefix="bench_agentic_subagents_")

        def req(t, hash_ids):
            return {"t": t, "type": "s", "in": 64 * len(hash_ids), "out": 5, "hash_ids": hash_ids, "think_time": 0}

        def sub(agent_id, status, requests):
            return {"t": 1, "type": "subagent", "agent_id": agent_id, "subagent_type": "Explore", "status": status,
                    "requests": requests}

        session = {"id": "tree", "requests": [
            req(0, [1]),
            sub("a", "completed", [req(1, [1, 10]), req(2, [1, 10, 11])]),
            sub("b", "completed", [req(1, [1, 20])]),
            sub("bg", "async_launched", [req(1, [1, 30]), req(2, [1, 30, 31]), req(3, [1, 30, 31, 32])]),
            req(5, [1, 2]),
        ]}
        try:
            traces = os.path.join(work, "t.jsonl")
            with open(traces, "w") as f:
                f.write(json.dumps(session) + "\n")
            p = m3serve("bench", "agentic", "--traces", traces, "--base-url",
                        "http://127.0.0.1:%d" % server.server_address[1], "--detailed", "--json")
        finally:
            server.shutdown()
            shutil.rmtree(work, ignore_errors=True)
        run = json.loads(p.stdout)["runs"][0]
        self.assertEqual(run["requests"]["completed"], 8)
        records = run["request_records"]
        end = {}
        for r in records:
            end.setdefault(r["agent"], []).append((r["start_s"], r["start_s"] + r["e2e_s"]))
        main_second = sorted(end["main"])[1][0]
        # The parent's next turn starts after both waited-for sub-agents ended, not after "bg".
        self.assertGreaterEqual(main_second, max(e for _, e in end["a"]))
        self.assertGreaterEqual(main_second, max(e for _, e in end["b"]))
        self.assertLess(main_second, max(e for _, e in end["bg"]))
        # a and b ran side by side.
        self.assertLess(min(s for s, _ in end["b"]), max(e for _, e in end["a"]))


if __name__ == "__main__":
    unittest.main(verbosity=2)
