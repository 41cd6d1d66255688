#!/usr/bin/env python3
"""`m3serve score` on the small model's held-out sample (1024 ids, MSA selection active: 8 blocks,
top-4) for each recorded setting: perplexity within 0.5% of PyTorch's (tools/train/eval_torch.py,
fp32 with m3serve's KV numerics emulated), and, with --max-ppl, at most that bound (the quality the
shipped model is held to: docs/small-model.md). Prints one line per setting and 'N passed, N failed'."""
import argparse
import json
import math
import subprocess
import sys

TOLERANCE = 0.005


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m3serve", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--sample", required=True)
    ap.add_argument("--max-ppl", type=float, help="fail any setting whose perplexity is above this")
    args = ap.parse_args()
    sample = json.load(open(args.sample))
    ids = sample["ids"]
    passed = failed = 0
    for setting, expected in sorted(sample["expected_ppl"].items()):
        attention, kv = setting.split("/")
        assert attention == "sparse", "the test scores the model as shipped (sparse attention)"
        cmd = [args.m3serve, "score", "--model", args.model, "--prompt-ids", ",".join(map(str, ids)),
               "--dtype", "float32", "--kv-cache-dtype", kv, "--json"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        if res.returncode != 0:
            print(f"{setting}: m3serve score failed ({res.returncode}):\n{res.stderr[-3000:]}")
            failed += 1
            continue
        logprobs = json.loads(res.stdout)["prompt_logprobs"]
        if len(logprobs) != len(ids) - 1:
            print(f"{setting}: {len(logprobs)} log-probabilities for {len(ids)} ids")
            failed += 1
            continue
        ppl = math.exp(-sum(logprobs) / len(logprobs))
        rel = ppl / expected - 1
        ok = abs(rel) <= TOLERANCE
        bounded = args.max_ppl is None or ppl <= args.max_ppl
        verdict = "ok" if ok and bounded else ("FAIL (tolerance 0.5%)" if not ok else f"FAIL (above {args.max_ppl})")
        print(f"{setting}: m3serve ppl {ppl:.4f}, PyTorch {expected:.4f}, diff {100 * rel:+.3f}% {verdict}")
        ok = ok and bounded
        passed += ok
        failed += not ok
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
