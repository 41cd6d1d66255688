"""Determinism of `m3serve serve` on the bundled model: greedy outputs are identical whether a
request runs alone, in a batch of 32, after preemption, or with a prefix-cache hit; seeded
sampling is identical across runs and batch compositions.

Reference outputs come from a server with prefix caching off, one request at a time. The server
under test has prefix caching on and a KV pool too small for 32 requests at once, so batches
force preemption (checked through vllm:num_preemptions_total).

M3SERVE_EXTRA_ARGS (split as a shell would) goes to both servers, e.g. "--device cuda
--batch-invariant" (the CUDA backend is batch-invariant only with that flag; the CPU backend always is).
"""
import os
import shlex
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from live_server import LiveServer, post_all  # noqa: E402

BIN = os.environ.get("M3SERVE_BIN", "build/bin/m3serve")
EXTRA_ARGS = shlex.split(os.environ.get("M3SERVE_EXTRA_ARGS", ""))
MODEL = os.environ.get("M3SERVE_MODEL", "models/minimax-m3-tiny")
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
         "sigma tau upsilon phi chi psi omega").split()


def prompt(i, length):
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(length))


# A shared prefix longer than two 128-token blocks, so later requests hit the prefix cache.
SHARED = prompt(99, 300)
REQUESTS = [dict(prompt=(SHARED + " " + prompt(i, 5 + i % 9)) if i % 4 == 0 else prompt(i, 8 + (i * 13) % 90),
                 max_tokens=24 + (i * 5) % 40, ignore_eos=True, temperature=0)
            for i in range(32)]
SEEDED = [dict(prompt=prompt(i, 20), max_tokens=24, ignore_eos=True, temperature=0.9, top_p=0.95, seed=1000 + i)
          for i in range(8)]


def run_batch(server, bodies):
    return post_all(server, "/v1/completions", bodies)


class Determinism(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # The default bfloat16 activations: the CPU backend is batch-invariant (kernels/cpu/cpu_ops.h).
        common = ["--host", "127.0.0.1", "--port", "0", "--max-model-len", "1024", "--enable-prompt-tokens-details",
                  "--disable-log-stats"] + EXTRA_ARGS
        reference = LiveServer([BIN, "serve", MODEL, "--no-enable-prefix-caching", "--num-kv-blocks", "16"] + common)
        try:
            replies = [reference.post("/v1/completions", b) for b in REQUESTS]
            cls.alone = [r["choices"][0]["text"] for r in replies]
            cls.reference_cached = sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in replies)
            cls.seeded_alone = [reference.post("/v1/completions", b)["choices"][0]["text"] for b in SEEDED]
        finally:
            reference.stop()
        # 32 requests need ~40 blocks at once; 12 blocks force preemption. A 256-token step budget
        # splits the long shared prompts into chunks (chunked prefill).
        cls.server = LiveServer([BIN, "serve", MODEL, "--num-kv-blocks", "12", "--max-num-seqs", "32",
                                 "--max-num-batched-tokens", "256"] + common)

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0, cls.server.log_text()

    def test_batch_of_32_with_preemption_matches_alone(self):
        before = self.server.metric("vllm:num_preemptions_total")
        results = run_batch(self.server, REQUESTS)
        for i, r in enumerate(results):
            self.assertEqual(r["choices"][0]["text"], self.alone[i], "request %d" % i)
            self.assertEqual(r["usage"]["completion_tokens"], REQUESTS[i]["max_tokens"])
        self.assertGreater(self.server.metric("vllm:num_preemptions_total"), before,
                           "the KV pool was meant to force preemption")

    def test_prefix_cache_hits_match_alone(self):
        hits_before = self.server.metric("vllm:prefix_cache_hits_total")
        shared = [i for i in range(len(REQUESTS)) if i % 4 == 0]
        first = self.server.post("/v1/completions", REQUESTS[shared[0]])
        self.assertEqual(first["choices"][0]["text"], self.alone[shared[0]])
        for i in shared:
            r = self.server.post("/v1/completions", REQUESTS[i])
            self.assertGreaterEqual(r["usage"]["prompt_tokens_details"]["cached_tokens"], 256, "request %d" % i)
            self.assertEqual(r["choices"][0]["text"], self.alone[i], "request %d" % i)
        self.assertGreater(self.server.metric("vllm:prefix_cache_hits_total"), hits_before)

    def test_prefix_caching_can_be_turned_off(self):
        # The reference server ran the shared-prefix prompts 8 times with --no-enable-prefix-caching.
        self.assertEqual(self.reference_cached, 0)

    def test_seeded_sampling_is_reproducible(self):
        again = [self.server.post("/v1/completions", b)["choices"][0]["text"] for b in SEEDED]
        self.assertEqual(again, self.seeded_alone)
        batched = run_batch(self.server, SEEDED + REQUESTS[:8])
        self.assertEqual([r["choices"][0]["text"] for r in batched[:len(SEEDED)]], self.seeded_alone)
        self.assertGreater(len(set(self.seeded_alone)), 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
