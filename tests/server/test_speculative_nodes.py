"""DSpark speculative decoding with data-parallel copies on two hosts (two processes here,
--nnodes 2): node 0's engine drafts for the copy the other node holds through that node's own
drafter (its cache lives beside that copy's pool), over the copy's channel. Greedy and seeded
requests spread over both copies give the text of the same deployment without speculation (the
layout's own: expert-parallel sums may move a seeded draw against one process's); the other
node's drafter ran; the vllm:spec_decode_* counters count drafts.

Run: M3SERVE_BIN=build/bin/m3serve python3 tests/server/test_speculative_nodes.py (repo root).
"""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from live_server import MultiNodeServer, post_all  # noqa: E402

BIN = os.environ.get("M3SERVE_BIN", "build/bin/m3serve")
MODEL = "models/minimax-m3-small"  # ships its trained drafter in dspark/
NAME = "small"
PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "import os\nimport sys\n\n\ndef main():\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "for i in range(10):\n    print(i)\nfor j in range(",
]


def serve_args(*extra):
    return [BIN, "serve", MODEL, "--host", "127.0.0.1", "--port", "0", "--served-model-name", NAME,
            "--max-model-len", "1024", "--kv-cache-memory", "64MiB", "--disable-log-stats"] + list(extra)


class DSparkAcrossNodes(unittest.TestCase):
    def test_copies_on_another_host_draft_there(self):
        bodies = []
        for i, prompt in enumerate(PROMPTS):
            bodies.append({"model": NAME, "prompt": prompt, "max_tokens": 32, "temperature": 0, "ignore_eos": True})
            bodies.append({"model": NAME, "prompt": prompt, "max_tokens": 24, "temperature": 0.8, "seed": 100 + i,
                           "ignore_eos": True})
        dep = ["--data-parallel-size", "2", "--enable-expert-parallel"]
        plain = MultiNodeServer(serve_args(*dep), 2)
        try:
            want = [r["choices"][0]["text"] for r in post_all(plain, "/v1/completions", bodies)]
        finally:
            self.assertEqual(plain.stop(), 0)
        spec = MultiNodeServer(serve_args(*dep, "--speculative-config",
                                          '{"method":"dspark","num_speculative_tokens":3}'), 2)
        try:
            got = [r["choices"][0]["text"] for r in post_all(spec, "/v1/completions", bodies)]
            metrics = spec.request("GET", "/metrics")[2].decode()
        finally:
            self.assertEqual(spec.stop(), 0)
        for body, g, w in zip(bodies, got, want):
            self.assertEqual(g, w, body)
        drafts = re.findall(r"copy \d+: node 0 said stop after \d+ steps, (\d+) of them with requests here, "
                            r"(\d+) draft steps", spec.follower_logs())
        self.assertTrue(drafts and all(int(s) > 0 and int(d) > 0 for s, d in drafts), spec.follower_logs())
        accepted = re.search(r'vllm:spec_decode_num_accepted_tokens_total\{[^}]*\} ([0-9.]+)', metrics)
        self.assertIsNotNone(accepted, metrics)
        self.assertGreater(float(accepted.group(1)), 0)


if __name__ == "__main__":
    unittest.main()
