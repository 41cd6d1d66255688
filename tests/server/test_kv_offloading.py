"""The host tier of the prefix cache through `m3serve serve` (--kv-offloading-size): on a KV pool
too small for the traffic, sessions with long shared prefixes come back after other requests
evicted their blocks; with the tier those blocks are copied back from host memory instead of
recomputed, the greedy outputs are those of a server without it, and /metrics counts the hits
and the copies. Bad sizes are refused at start naming the option.

Run: M3SERVE_BIN=build/bin/m3serve python3 tests/server/test_kv_offloading.py (from the repo root).
M3SERVE_EXTRA_ARGS adds serve options (CTest runs it once more with -tp 2: each rank copies its
own share of every block). M3SERVE_NODES=N serves over N processes as N hosts would (--nnodes,
on 127.0.0.1): node 0 announces each step's copies, so every node's ranks copy their shares.
M3SERVE_BUSY_FIRST_LANE=1 (with DEP) keeps lane 0 busy with a long request while the traffic
runs, so the lane router sends the sessions to lane 1 (and their turns stay there): over two
processes that is the other node's copy, whose tier copies go over its channel.
"""
import os
import re
import shlex
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from live_server import LiveServer, MultiNodeServer  # noqa: E402

BIN = os.environ.get("M3SERVE_BIN", "build/bin/m3serve")
MODEL = os.environ.get("M3SERVE_MODEL", "models/minimax-m3-tiny")
EXTRA = shlex.split(os.environ.get("M3SERVE_EXTRA_ARGS", ""))
NODES = int(os.environ.get("M3SERVE_NODES", "1"))
BUSY_FIRST_LANE = os.environ.get("M3SERVE_BUSY_FIRST_LANE") == "1"
# The tiny model's blocks are 128 tokens; 6 blocks hold two of the requests below at most.
POOL = ["--num-kv-blocks", "6", "--max-model-len", "512"]


def ids(seed, n):
    return [3 + (seed * 7919 + i * 104729) % 8000 for i in range(n)]


def traffic():
    """Three sessions (a 256-token shared prefix, a new turn each round) and one-off requests in
    between, one at a time: by the time a session comes back its blocks have left the pool."""
    bodies = []
    for rnd in range(2):
        for session in range(3):
            bodies.append(("s%d-r%d" % (session, rnd), ids(100 + session, 256) + ids(1000 + 10 * rnd + session, 40)))
        bodies.append(("other-r%d" % rnd, ids(5000 + rnd, 300)))
    return bodies


def serve(*args):
    # No --device: the CPU here, the GPU where one is (M3SERVE_EXTRA_ARGS may name it).
    argv = [BIN, "serve", MODEL, "--host", "127.0.0.1", "--port", "0", "--enable-prompt-tokens-details",
            "--disable-log-stats"] + POOL + list(args) + EXTRA
    return MultiNodeServer(argv, NODES) if NODES > 1 else LiveServer(argv)


def run_traffic(server):
    blocker = None
    if BUSY_FIRST_LANE:
        # In flight on lane 0 (both lanes idle: the lowest index) before any session arrives.
        blocker = threading.Thread(target=server.post, args=("/v1/completions", {
            "model": MODEL, "prompt": ids(9000, 8), "max_tokens": 480, "temperature": 0, "ignore_eos": True}))
        blocker.start()
        deadline = time.time() + 30
        while server.metric("vllm:num_requests_running") < 1 and time.time() < deadline:
            time.sleep(0.01)
    out = {}
    for name, prompt in traffic():
        r = server.post("/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0,
                                            "ignore_eos": True})
        out[name] = (r["choices"][0]["text"], r["usage"]["prompt_tokens_details"]["cached_tokens"])
    if blocker:
        blocker.join()
    return out


class KvOffloading(unittest.TestCase):
    def test_greedy_outputs_identical_with_and_without_the_host_tier(self):
        plain = serve()
        try:
            without = run_traffic(plain)
            self.assertEqual(plain.metric("vllm:external_prefix_cache_hits_total"), 0)
            self.assertEqual(plain.metric("m3:kv_offload_blocks_total"), 0)
        finally:
            self.assertEqual(plain.stop(), 0)
        tiered = serve("--kv-offloading-size", "0.05", "--kv-offloading-backend", "native")
        try:
            self.assertIn("KV host tier (--kv-offloading-size 0.05 GiB)", tiered.log_text())
            with_tier = run_traffic(tiered)
            metrics = {k: tiered.metric(k) for k in ("vllm:external_prefix_cache_hits_total",
                                                     "vllm:external_prefix_cache_queries_total",
                                                     "vllm:prefix_cache_hits_total")}
            to_host = tiered.metric("m3:kv_offload_blocks_total", direction="to_host")
            to_device = tiered.metric("m3:kv_offload_blocks_total", direction="to_device")
            bytes_back = tiered.metric("m3:kv_offload_bytes_total", direction="to_device")
            seconds = tiered.metric("m3:kv_offload_seconds_total")
            stored = tiered.metric("m3:kv_offload_host_blocks_stored")
            saved_ahead = tiered.metric("m3:kv_offload_blocks_saved_ahead_total")
            waiting = tiered.metric("m3:kv_offload_steps_waiting_total")
        finally:
            self.assertEqual(tiered.stop(), 0)
        if BUSY_FIRST_LANE and NODES > 1:
            # The sessions ran on the other node's copy: its log counts the steps it served.
            served = [int(n) for n in re.findall(r"copy 1: node 0 said stop after \d+ steps, (\d+) of them",
                                                 tiered.follower_logs())]
            self.assertTrue(served and served[0] >= len(traffic()), tiered.follower_logs())
        self.assertEqual({k: v[0] for k, v in with_tier.items()}, {k: v[0] for k, v in without.items()})
        # Every session's second round found its two prefix blocks in host memory; without the
        # tier they had left the pool and were recomputed.
        for session in range(3):
            self.assertEqual(with_tier["s%d-r1" % session][1], 256, with_tier)
            self.assertEqual(without["s%d-r1" % session][1], 0, without)
        self.assertGreaterEqual(metrics["vllm:external_prefix_cache_hits_total"], 3 * 256)
        self.assertGreater(metrics["vllm:external_prefix_cache_queries_total"], 0)
        self.assertGreaterEqual(metrics["vllm:prefix_cache_hits_total"], metrics["vllm:external_prefix_cache_hits_total"])
        self.assertGreaterEqual(to_device, 6)
        self.assertGreater(to_host, 0)
        self.assertGreater(bytes_back, 0)
        self.assertEqual(bytes_back % to_device, 0)  # whole blocks
        self.assertGreater(seconds, 0)
        self.assertGreater(stored, 0)
        # Cached blocks at the head of the free list were saved before they were evicted; the steps
        # that reused them waited for the batch that saved them.
        self.assertGreater(saved_ahead, 0)
        self.assertLessEqual(saved_ahead, to_host)
        self.assertGreater(waiting, 0)

    def test_bad_sizes_are_clear_errors(self):
        def refused(args, words):
            r = subprocess.run([BIN, "generate", "--model", MODEL, "--device", "cpu", "--prompt-ids", "5,6,7",
                                "--max-tokens", "1"] + args, capture_output=True, text=True, timeout=120)
            self.assertNotEqual(r.returncode, 0, args)
            for w in words:
                self.assertIn(w, r.stdout + r.stderr, args)
        refused(["--kv-offloading-size=-1"], ["--kv-offloading-size -1 must be positive"])
        refused(["--kv-offloading-size", "lots"], ["--kv-offloading-size 'lots' is not a number"])
        refused(["--kv-offloading-size", "4GiB"], ["--kv-offloading-size '4GiB' is not a number"])
        refused(["--kv-offloading-size", "0"], ["--kv-offloading-size 0 must be positive"])
        refused(["--kv-offloading-size", "100000000"], ["--kv-offloading-size 100000000 GiB is more than this host has "
                                                        "available"])
        refused(["--kv-offloading-size", "0.0000001"], ["--kv-offloading-size 0.0000001 GiB holds no KV block"])
        refused(["--kv-offloading-size", "1", "--kv-offloading-backend", "lmcache"],
                ["--kv-offloading-backend 'lmcache'", "only vLLM's 'native' backend"])
        refused(["--kv-offloading-size", "1", "--no-enable-prefix-caching"],
                ["--kv-offloading-size is the host tier of the prefix cache"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
