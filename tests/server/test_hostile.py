"""Hostile and careless clients against `m3serve serve` on the bundled model (issue 14): deep JSON
nesting everywhere client JSON goes, bodies over the limit (chunked too), malformed
Content-Length, header limits, pipelining, slow-loris with /health probes, overflowing numbers,
stalled and vanishing stream readers, the connection cap, TLS, and 10,000 idle connections plus
2,000 concurrent streams with random disconnects.

Run: M3SERVE_BIN=build/bin/m3serve python3 tests/server/test_hostile.py (from the repo root).
Standard library only; every server listens on 127.0.0.1 and every loop is bounded.
"""
import asyncio
import json
import os
import random
import resource
import select
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from live_server import LiveServer, parse_sse  # noqa: E402

BIN = os.environ.get("M3SERVE_BIN", "build/bin/m3serve")
MODEL = os.environ.get("M3SERVE_MODEL", "models/minimax-m3-tiny")
NAME = "tiny"
DEPTH = 50000  # far past the server's cap of 128
BODY_LIMIT = 1 << 20
IDLE_CONNECTIONS = 10000
STREAMS = 2000

COMMON_ARGS = ["serve", MODEL, "--host", "127.0.0.1", "--port", "0", "--served-model-name", NAME,
               "--kv-cache-memory", "64MiB", "--disable-log-stats",
               "--tool-call-parser", "minimax_m3", "--enable-auto-tool-choice"]
# The main server: generous timeouts, so idle connections stay open through the load test.
MAIN = None
# Tight deadlines and a small connection cap, for slow-loris, stalls and the 503 at the cap.
STRICT = None
STRICT_MAX_CONNECTIONS = 40


def raise_open_file_limit(wanted):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard == resource.RLIM_INFINITY else min(hard, max(soft, wanted))
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def setUpModule():
    global MAIN, STRICT
    raise_open_file_limit(IDLE_CONNECTIONS + STREAMS + 1000)
    MAIN = LiveServer([BIN] + COMMON_ARGS + [
        "--max-model-len", "2048", "--max-num-seqs", "64", "--max-body-size", str(BODY_LIMIT), "--request-head-timeout", "120",
        "--keep-alive-timeout", "120", "--max-connections", str(IDLE_CONNECTIONS + STREAMS + 500)])
    STRICT = LiveServer([BIN] + COMMON_ARGS + [
        "--max-num-seqs", "8", "--max-model-len", "4096", "--request-head-timeout", "2", "--request-body-timeout", "2",
        "--keep-alive-timeout", "2", "--stream-stall-timeout", "2",
        "--max-connections", str(STRICT_MAX_CONNECTIONS)])


def tearDownModule():
    for server in (MAIN, STRICT):
        if server:
            code = server.stop()
            assert code == 0, "server exit status %s:\n%s" % (code, server.log_text())


# ---- raw HTTP over sockets ----

def connect(server, timeout=10):
    return socket.create_connection(("127.0.0.1", server.port), timeout=timeout)


def read_response(f):
    """Reads one HTTP/1.1 response from a buffered socket file: (status, headers, body bytes)."""
    line = f.readline()
    if not line:
        return None
    status = int(line.split()[1])
    headers = {}
    while True:
        h = f.readline()
        if h in (b"\r\n", b""):
            break
        name, _, value = h.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    if status == 100:
        return read_response(f)
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int(f.readline().split(b";")[0], 16)
            if size == 0:
                f.readline()
                break
            body += f.read(size)
            f.readline()
    else:
        body = f.read(int(headers.get("content-length", "0")))
    return status, headers, body


def raw_exchange(server, data, timeout=10):
    """Sends raw bytes, returns the first response and the seconds it took."""
    with connect(server, timeout) as s:
        start = time.monotonic()
        s.sendall(data)
        reply = read_response(s.makefile("rb"))
        return reply, time.monotonic() - start


def post_raw(server, path, body_bytes, timeout=30):
    head = ("POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n\r\n" % (path, len(body_bytes))).encode()
    reply, _ = raw_exchange(server, head + body_bytes, timeout)
    return reply


def error_of(reply):
    status, _, body = reply
    return status, json.loads(body)["error"]


def nested(depth, leaf="0"):
    return "[" * depth + leaf + "]" * depth


def metric(server, name):
    return server.metric(name)


def wait_idle(server, timeout=30):
    """Waits until no request runs or waits and no KV block is in use; returns the last values."""
    deadline = time.monotonic() + timeout
    while True:
        values = (metric(server, "vllm:num_requests_running"),
                  metric(server, "vllm:num_requests_waiting"),
                  metric(server, "vllm:kv_cache_usage_perc"))
        if values == (0, 0, 0) or time.monotonic() > deadline:
            return values
        time.sleep(0.05)


# ---- the cases ----

class DeepNesting(unittest.TestCase):
    """Client JSON nested 50,000 deep, in every place client JSON goes: 400 naming the limit."""

    def check_refused(self, path, body_text):
        status, error = error_of(post_raw(MAIN, path, body_text.encode()))
        self.assertEqual(status, 400, error)
        self.assertIn("128", error["message"])
        self.assertEqual(MAIN.request("GET", "/health")[0], 200)
        return error

    def test_every_place(self):
        deep = nested(DEPTH)
        cases = {
            "messages content": ('/v1/chat/completions',
                                 '{"messages":[{"role":"user","content":%s}]}' % deep),
            "tool parameters": ('/v1/chat/completions',
                                '{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function",'
                                '"function":{"name":"f","parameters":{"type":"object","x":%s}}}]}' % deep),
            "chat_template_kwargs": ('/v1/chat/completions',
                                     '{"messages":[{"role":"user","content":"hi"}],'
                                     '"chat_template_kwargs":{"x":%s}}' % deep),
            "tokenize messages": ('/tokenize', '{"messages":[{"role":"user","content":%s}]}' % deep),
            "completion prompt": ('/v1/completions', '{"prompt":%s}' % deep),
            "detokenize": ('/detokenize', '{"tokens":%s}' % deep),
        }
        for what, (path, text) in cases.items():
            with self.subTest(what):
                self.check_refused(path, text)
        # deep keys: objects rather than arrays
        self.check_refused("/v1/completions", '{"prompt":"x","x":' + '{"a":' * DEPTH + '1' + '}' * DEPTH + '}')

    def test_history_tool_call_arguments(self):
        # The arguments arrive as a JSON string that the server parses: the cap holds there too.
        arguments = json.dumps({"a": json.loads(nested(100))})[:-1] + ',"b":' + nested(DEPTH) + "}"
        body = {"messages": [
            {"role": "user", "content": "call f"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "ok"}], "max_tokens": 2}
        error = self.check_refused("/v1/chat/completions", json.dumps(body))
        self.assertIn("arguments", error["param"])

    def test_nesting_under_the_cap_is_served(self):
        # 50 levels of schema (100 JSON levels) through the template and the tool parser's schema.
        schema = {"type": "string"}
        for _ in range(50):
            schema = {"type": "object", "properties": {"a": schema}}
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0,
                "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]}
        status, _, raw = MAIN.request("POST", "/v1/chat/completions", body)
        self.assertEqual(status, 200, raw[:500])
        arguments = json.dumps({"a": json.loads(nested(100))})
        history = {"messages": [
            {"role": "user", "content": "call f"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c", "content": "ok"}]}
        status, _, raw = MAIN.request("POST", "/tokenize", history)
        self.assertEqual(status, 200, raw[:500])


class BodyAndHeaderLimits(unittest.TestCase):
    def test_chunked_body_over_the_limit_gets_413_as_soon_as_it_passes(self):
        with connect(MAIN, 30) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n")
            piece = b"a" * 65536
            chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
            sent = 0
            try:
                for _ in range(64 * BODY_LIMIT // len(piece)):  # bounded: 64x the limit at most
                    if select.select([s], [], [], 0)[0]:
                        break  # the answer is there
                    s.sendall(chunk)
                    sent += len(piece)
            except OSError:
                pass  # the server answered and closed while we were still sending
            reply = read_response(s.makefile("rb"))
        self.assertIsNotNone(reply)
        self.assertEqual(reply[0], 413, reply)
        self.assertIn(str(BODY_LIMIT), json.loads(reply[2])["error"]["message"])
        # The answer came once the limit was passed (give or take what the socket buffers hold),
        # not after the whole upload.
        self.assertLess(sent, 16 * BODY_LIMIT)

    def test_content_length_over_the_limit_gets_413_at_once(self):
        reply, seconds = raw_exchange(MAIN, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                            b"Content-Length: 999999999\r\n\r\n")
        self.assertEqual(reply[0], 413)
        self.assertLess(seconds, 1.0)

    def test_bad_content_length_gets_400_at_once(self):
        for what, header in [("negative", b"Content-Length: -5\r\n"),
                             ("25 digits", b"Content-Length: 1234567890123456789012345\r\n"),
                             ("duplicate", b"Content-Length: 2\r\nContent-Length: 2\r\n"),
                             ("conflicting", b"Content-Length: 2\r\nContent-Length: 3\r\n"),
                             ("garbage", b"Content-Length: 12abc\r\n"),
                             ("empty", b"Content-Length: \r\n")]:
            with self.subTest(what):
                reply, seconds = raw_exchange(MAIN, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + header +
                                              b"\r\n{}")
                self.assertEqual(reply[0], 400, reply)
                self.assertLess(seconds, 1.0)

    def test_header_count_and_size_limits_get_431(self):
        many = b"".join(b"X-F%d: v\r\n" % i for i in range(300))
        reply, _ = raw_exchange(MAIN, b"GET /health HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
        self.assertEqual(reply[0], 431)
        big = b"X-Big: " + b"h" * (70 << 10) + b"\r\n"
        reply, _ = raw_exchange(MAIN, b"GET /health HTTP/1.1\r\nHost: x\r\n" + big + b"\r\n")
        self.assertEqual(reply[0], 431)

    def test_malformed_request_line_gets_400(self):
        reply, _ = raw_exchange(MAIN, b"HELLO\r\n\r\n")
        self.assertEqual(reply[0], 400)


class Pipelining(unittest.TestCase):
    def test_get_and_post_in_one_write_are_answered_in_order(self):
        chat = json.dumps({"messages": [{"role": "user", "content": "pipelined"}], "max_tokens": 6,
                           "temperature": 0, "ignore_eos": True}).encode()
        tok = b'{"prompt":"hello pipelining"}'

        def post(path, body):
            return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (path, len(body), body))

        data = (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + post(b"/v1/chat/completions", chat) +
                b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n" + post(b"/tokenize", tok) +
                post(b"/v1/chat/completions", chat) + b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        with connect(MAIN, 60) as s:
            s.sendall(data)
            f = s.makefile("rb")
            replies = [read_response(f) for _ in range(6)]
        self.assertEqual([r[0] for r in replies], [200] * 6)
        self.assertEqual(replies[0][2], b"")
        self.assertIn("version", json.loads(replies[2][2]))
        self.assertIn("tokens", json.loads(replies[3][2]))
        self.assertEqual(json.loads(replies[5][2])["object"], "list")
        first, second = json.loads(replies[1][2]), json.loads(replies[4][2])
        alone = MAIN.post("/v1/chat/completions", json.loads(chat))
        for r in (first, second):
            self.assertEqual(r["choices"][0]["message"]["content"], alone["choices"][0]["message"]["content"])


class Numbers(unittest.TestCase):
    def test_overflowing_and_out_of_range_numbers_name_the_field(self):
        cases = [("temperature", '"temperature": 1e999'), ("max_tokens", '"max_tokens": 1e999'),
                 ("top_p", '"top_p": -1e999'), ("temperature", '"temperature": 1e308'),
                 ("presence_penalty", '"presence_penalty": 1e308'),
                 ("logit_bias.5", '"logit_bias": {"5": 1e999}')]
        for param, member in cases:
            with self.subTest(member):
                status, error = error_of(post_raw(MAIN, "/v1/completions",
                                                  ('{"prompt": "x", %s}' % member).encode()))
                self.assertEqual(status, 400, error)
                self.assertEqual(error["param"], param, error)

    def test_invalid_utf8_reports_the_offset(self):
        status, error = error_of(post_raw(MAIN, "/v1/completions", b'{"prompt": "ab\xff"}'))
        self.assertEqual(status, 400)
        self.assertIn("offset 14", error["message"])


class SlowClients(unittest.TestCase):
    def test_slow_loris_is_dropped_and_health_stays_fast(self):
        loris = []
        for _ in range(STRICT_MAX_CONNECTIONS - 10):
            s = connect(STRICT)
            s.sendall(b"GET /health HTTP/1.1\r\n")
            loris.append(s)
        slow_body = connect(STRICT)
        slow_body.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        loris.append(slow_body)
        worst = 0.0
        for i in range(30):  # 3 s of probes, one header line per loris connection every 0.5 s
            if i % 5 == 0 and i < 15:
                for s in loris:
                    try:
                        s.sendall(b"X-Slow: 1\r\n")
                    except OSError:
                        pass
            start = time.monotonic()
            status = STRICT.request("GET", "/health", timeout=5)[0]
            worst = max(worst, time.monotonic() - start)
            self.assertEqual(status, 200)
            time.sleep(0.1)
        self.assertLess(worst, 0.1, "a /health probe took %.0f ms" % (worst * 1000))
        # Past the 2 s head/body deadline every slow connection was answered 408 and closed.
        for s in loris:
            s.settimeout(5)
            reply = read_response(s.makefile("rb"))
            self.assertEqual(reply[0] if reply else None, 408)
            s.close()

    def test_a_reader_that_stalls_is_dropped_and_its_request_aborted(self):
        aborted = STRICT.metric("vllm:request_success_total", finished_reason="abort")
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", STRICT.port))
        # Chat logprobs with 20 alternatives: a few KB per token, megabytes in all, far more than
        # the socket buffers and the server's per-stream backlog hold.
        body = json.dumps({"messages": [{"role": "user", "content": "stall"}], "max_tokens": 3000,
                           "ignore_eos": True, "stream": True, "logprobs": True,
                           "top_logprobs": 20, "n": 4}).encode()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        # Read nothing: the server's backlog fills, the stall timeout (2 s) drops the client.
        time.sleep(1.0)
        self.assertEqual(wait_idle(STRICT, timeout=60), (0, 0, 0))
        self.assertGreater(STRICT.metric("vllm:request_success_total", finished_reason="abort"), aborted)
        s.settimeout(10)
        received = 0
        for _ in range(100000):  # drain what was buffered; the server has closed the connection
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            received += len(data)
        s.close()

    def test_a_client_that_hangs_up_is_aborted_within_a_step(self):
        s = connect(STRICT)
        body = json.dumps({"prompt": "hang up", "max_tokens": 400, "ignore_eos": True, "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        f = s.makefile("rb")
        while b"data: " not in f.readline():
            pass
        s.close()
        f.close()
        start = time.monotonic()
        self.assertEqual(wait_idle(STRICT, timeout=5), (0, 0, 0))
        self.assertLess(time.monotonic() - start, 1.0)

    def test_idle_keep_alive_connections_are_closed_after_the_timeout(self):
        with connect(STRICT) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            f = s.makefile("rb")
            self.assertEqual(read_response(f)[0], 200)
            start = time.monotonic()
            self.assertEqual(f.read(1), b"")  # closed by the server, with nothing more sent
            self.assertLess(time.monotonic() - start, 5.0)  # keep-alive timeout: 2 s

    def test_expect_100_continue(self):
        body = b'{"prompt": "continue"}'
        with connect(MAIN) as s:
            s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
            f = s.makefile("rb")
            self.assertTrue(f.readline().startswith(b"HTTP/1.1 100"))
            f.readline()
            s.sendall(body)
            status, _, raw = read_response(f)
        self.assertEqual(status, 200)
        self.assertIn("tokens", json.loads(raw))

    def test_connections_beyond_the_cap_get_503_at_once(self):
        idle = [connect(STRICT) for _ in range(STRICT_MAX_CONNECTIONS)]
        time.sleep(0.2)
        try:
            reply, seconds = raw_exchange(STRICT, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assertEqual(reply[0], 503)
            self.assertIn("concurrent connections", json.loads(reply[2])["error"]["message"])
            self.assertLess(seconds, 0.5)
        finally:
            for s in idle:
                s.close()
        deadline = time.monotonic() + 5
        while STRICT.request("GET", "/health")[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(STRICT.request("GET", "/health")[0], 200)


class ApiKeyAndTls(unittest.TestCase):
    def test_tls_and_api_key(self):
        with tempfile.TemporaryDirectory() as tmp:
            key, cert = os.path.join(tmp, "key.pem"), os.path.join(tmp, "cert.pem")
            made = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                                   "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1"],
                                  capture_output=True)
            if made.returncode != 0:
                self.skipTest("openssl cannot make a certificate: %s" % made.stderr[-300:])
            server = LiveServer([BIN] + COMMON_ARGS + ["--max-model-len", "512", "--ssl-keyfile", key, "--ssl-certfile", cert,
                                                       "--api-key", "sk-right"], wait_ready=False)
            try:
                context = ssl.create_default_context(cafile=cert)
                context.check_hostname = False

                def request(path, body=None, key=None):
                    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as raw:
                        with context.wrap_socket(raw) as s:
                            data = json.dumps(body).encode() if body is not None else b""
                            auth = b"Authorization: Bearer %s\r\n" % key.encode() if key else b""
                            s.sendall(b"%s %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s" %
                                      (b"POST" if body is not None else b"GET", path.encode(), auth,
                                       len(data), data))
                            return read_response(s.makefile("rb"))

                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    try:
                        if request("/health")[0] == 200:
                            break
                    except OSError:
                        pass
                    time.sleep(0.1)
                body = {"prompt": "tls", "max_tokens": 3, "stream": True, "ignore_eos": True}
                status, _, raw = request("/v1/completions", body, "sk-right")
                self.assertEqual(status, 200)
                events, done = parse_sse(raw.decode())
                self.assertTrue(done)
                for wrong in ["sk-righ", "sk-right2", "", "sk-wrong"]:
                    self.assertEqual(request("/v1/completions", body, wrong)[0], 401, wrong)
                with socket.create_connection(("127.0.0.1", server.port), timeout=5) as plain:
                    plain.sendall(b"GET /health HTTP/1.1\r\n\r\n")  # plain HTTP to a TLS port
                    try:
                        answer = plain.recv(1000)
                    except OSError:
                        answer = b""
                    self.assertNotIn(b"HTTP/1.1 200", answer)
            finally:
                self.assertEqual(server.stop(), 0, server.log_text())


# ---- 10,000 idle connections and 2,000 streams ----

PROMPTS = ["Stream number %d tells a story about %s" % (k, w)
           for k, w in enumerate(["rivers", "mountains", "cities", "stars", "machines", "forests",
                                  "oceans", "deserts"])]


def stream_body(k):
    return {"prompt": PROMPTS[k % len(PROMPTS)], "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "stream": True}


async def one_stream(port, k, hang_up, results):
    body = json.dumps(stream_body(k)).encode()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as e:
        results["errors"].append("connect %d: %r" % (k, e))
        return
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        if hang_up:
            await reader.readuntil(b"data: ")
            results["hung_up"] += 1
            return
        raw = await asyncio.wait_for(reader.read(), timeout=600)
        head, _, chunked = raw.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            results["errors"].append("stream %d: %r" % (k, head[:100]))
            return
        data, rest = b"", chunked
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            data += rest[:size]
            rest = rest[size + 2:]
        events, done = parse_sse(data.decode())
        if not done:
            results["errors"].append("stream %d: no [DONE]" % k)
            return
        results["texts"][k] = "".join(c.get("text") or "" for e in events for c in e["choices"])
    except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError, AssertionError) as e:
        results["errors"].append("stream %d: %r" % (k, e))
    finally:
        writer.close()


async def all_streams(port, hang_ups):
    results = {"errors": [], "texts": {}, "hung_up": 0}
    await asyncio.gather(*(one_stream(port, k, k in hang_ups, results) for k in range(STREAMS)))
    return results


class ManyConnections(unittest.TestCase):
    def test_idle_connections_and_streams_with_disconnects(self):
        limit = raise_open_file_limit(IDLE_CONNECTIONS + STREAMS + 1000)
        self.assertGreaterEqual(limit, IDLE_CONNECTIONS + STREAMS + 200,
                                "the hard open-file limit is too low for this test")
        # Sequential greedy references, one per distinct prompt.
        expected = {}
        for k in range(len(PROMPTS)):
            body = dict(stream_body(k), stream=False)
            expected[k] = MAIN.post("/v1/completions", body)["choices"][0]["text"]
        rss_before = MAIN.rss_bytes()
        idle = []
        try:
            for _ in range(IDLE_CONNECTIONS):
                idle.append(socket.create_connection(("127.0.0.1", MAIN.port), timeout=30))
            start = time.monotonic()
            self.assertEqual(MAIN.request("GET", "/health")[0], 200)
            self.assertLess(time.monotonic() - start, 0.5)
            rng = random.Random(14)
            hang_ups = set(rng.sample(range(STREAMS), STREAMS // 10))
            results = asyncio.run(all_streams(MAIN.port, hang_ups))
            rss_peak = MAIN.rss_bytes()
            self.assertEqual(results["errors"], [])
            self.assertEqual(results["hung_up"], len(hang_ups))
            self.assertEqual(len(results["texts"]), STREAMS - len(hang_ups))
            for k, text in results["texts"].items():
                self.assertEqual(text, expected[k % len(PROMPTS)], "stream %d" % k)
            # The idle connections are all still served.
            for s in idle[::100]:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                self.assertEqual(read_response(s.makefile("rb"))[0], 200)
        finally:
            for s in idle:
                s.close()
        self.assertEqual(wait_idle(MAIN), (0, 0, 0))
        growth = rss_peak - rss_before
        print("\n10,000 idle + 2,000 streams: server RSS %+.1f MiB" % (growth / 2**20), file=sys.stderr)
        self.assertLess(growth, 512 << 20)


if __name__ == "__main__":
    unittest.main()
