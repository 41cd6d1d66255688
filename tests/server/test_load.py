"""Load: 64 concurrent streaming clients with mixed lengths, some hanging up midway. Zero server
errors, every completed stream identical to its sequential run, and afterwards no request left
running, the KV cache empty and the server's memory back near its baseline.

M3SERVE_EXTRA_ARGS adds serve options; M3SERVE_NODES=N serves over N processes as N hosts would
(CTest runs it once more with DEP 2 over two: the other node's copy takes half of the clients).
"""
import json
import os
import shlex
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from live_server import LiveServer, MultiNodeServer, open_stream, parse_sse  # noqa: E402

BIN = os.environ.get("M3SERVE_BIN", "build/bin/m3serve")
MODEL = os.environ.get("M3SERVE_MODEL", "models/minimax-m3-tiny")
CLIENTS = 64
EXTRA = shlex.split(os.environ.get("M3SERVE_EXTRA_ARGS", ""))
NODES = int(os.environ.get("M3SERVE_NODES", "1"))


def spec(i):
    words = " ".join("w%d" % ((i * 31 + k) % 97) for k in range(4 + (i * 17) % 120))
    disconnect = i % 8 == 3
    body = {"max_tokens": 300 if disconnect else 4 + (i * 11) % 60, "ignore_eos": True, "temperature": 0}
    if i % 2:
        body["messages"] = [{"role": "user", "content": "Client %d says: %s" % (i, words)}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = "Client %d: %s" % (i, words)
        path = "/v1/completions"
    return path, body, disconnect


def text_of(events):
    out = ""
    for e in events:
        for c in e.get("choices", []):
            out += (c.get("delta") or {}).get("content") or c.get("text") or ""
    return out


def read_stream(port, path, body, hang_up_after=None):
    """Streams a request on a raw socket; returns (status line, events, done, error)."""
    sock = open_stream(port, path, body)
    raw = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            raw += chunk
            if hang_up_after is not None and raw.count(b"data: ") >= hang_up_after:
                return raw.split(b"\r\n", 1)[0], [], False, None
    finally:
        sock.close()
    head, _, body_raw = raw.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0]
    # De-chunk the transfer encoding.
    data, rest = b"", body_raw
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        data, rest = data + rest[:size], rest[size + 2:]
    events, done = parse_sse(data.decode())
    errors = [e for e in events if "error" in e]
    return status, events, done, errors


class Load(unittest.TestCase):
    def run_round(self, server, specs, reference):
        """All clients at once; checks every completed stream. Returns the wall time."""
        results = [None] * CLIENTS
        barrier = threading.Barrier(CLIENTS)

        def client(i):
            path, body, disconnect = specs[i]
            barrier.wait()
            try:
                results[i] = read_stream(server.port, path, body, hang_up_after=4 if disconnect else None)
            except Exception as e:  # noqa: BLE001 - reported by the assertions below
                results[i] = (repr(e).encode(), [], False, [repr(e)])

        started = time.time()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        elapsed = time.time() - started
        for i, (path, body, disconnect) in enumerate(specs):
            status, events, done, errors = results[i]
            self.assertTrue(status.startswith(b"HTTP/1.1 200"), (i, status))
            if disconnect:
                continue
            self.assertTrue(done, "client %d: stream did not end with [DONE]" % i)
            self.assertFalse(errors, "client %d: %s" % (i, errors))
            self.assertEqual(text_of(events), reference[i], "client %d differs from its sequential run" % i)
        return elapsed

    def settle(self, server):
        """Waits until nothing runs; then the KV cache must be empty."""
        deadline = time.time() + 30
        while time.time() < deadline:
            if server.metric("vllm:num_requests_running") == 0 and server.metric("vllm:num_requests_waiting") == 0:
                break
            time.sleep(0.1)
        self.assertEqual(server.metric("vllm:num_requests_running"), 0)
        self.assertEqual(server.metric("vllm:num_requests_waiting"), 0)
        self.assertEqual(server.metric("vllm:kv_cache_usage_perc"), 0.0)
        time.sleep(0.5)

    def test_64_streaming_clients(self):
        argv = [BIN, "serve", MODEL, "--host", "127.0.0.1", "--port", "0", "--max-model-len", "1024",
                "--num-kv-blocks", "48", "--max-num-seqs", "64", "--disable-log-stats"] + EXTRA
        server = MultiNodeServer(argv, NODES) if NODES > 1 else LiveServer(argv)
        try:
            specs = [spec(i) for i in range(CLIENTS)]
            # Sequential references (and allocator warm-up before the memory baseline).
            reference = {}
            for i, (path, body, disconnect) in enumerate(specs):
                if not disconnect:
                    status, events, done, errors = read_stream(server.port, path, body)
                    self.assertTrue(done and not errors, (i, status, errors))
                    reference[i] = text_of(events)
            # Round 1 warms the allocator's per-thread arenas and the HTTP workers; the memory
            # baseline is taken after it, and round 2 must not grow it (no leak per request).
            disconnects = sum(1 for s in specs if s[2])
            aborted_before = server.metric("vllm:request_success_total", finished_reason="abort")
            self.run_round(server, specs, reference)
            self.settle(server)
            baseline = server.rss_bytes()
            elapsed = self.run_round(server, specs, reference)
            self.settle(server)
            after = server.rss_bytes()
            self.assertEqual(server.metric("vllm:request_success_total", finished_reason="abort") - aborted_before,
                             2 * disconnects)
            self.assertEqual(server.metric("vllm:request_success_total", finished_reason="error"), 0)
            print("\nload: %d clients (%d hung up) in %.1f s; RSS baseline %.1f MiB, after %.1f MiB" %
                  (CLIENTS, disconnects, elapsed, baseline / 2**20, after / 2**20))
            self.assertLess(after, baseline + (16 << 20), "memory grew by %.1f MiB over a round of 64 clients" %
                            ((after - baseline) / 2**20))
        finally:
            self.assertEqual(server.stop(), 0, server.log_text())


if __name__ == "__main__":
    unittest.main(verbosity=2)
