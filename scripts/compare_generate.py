#!/usr/bin/env python3
"""Two `m3serve generate --json` results side by side, for the GPU scripts' summary lines:
whether the output ids are identical (else where they first differ) and the speeds.

  compare_generate.py A.json B.json [--label-a cpu --label-b cuda] [--require-identical]

--require-identical prefixes a difference with FAILED. B's spec_decode figures are printed when
it has them.
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--label-a", default="cpu")
    ap.add_argument("--label-b", default="cuda")
    ap.add_argument("--require-identical", action="store_true")
    args = ap.parse_args()
    try:
        a, b = (json.loads(open(f).read().strip().splitlines()[-1]) for f in (args.a, args.b))
    except Exception as e:  # a run that failed or printed nothing
        print("FAILED (no output: %s)" % e)
        return
    x, y = a["output_ids"], b["output_ids"]
    first = next((i for i in range(min(len(x), len(y))) if x[i] != y[i]), None)
    verdict = "ids identical" if first is None and len(x) == len(y) else "ids differ from %s" % first
    if args.require_identical and verdict != "ids identical":
        verdict = "FAILED: " + verdict
    spec = b.get("spec_decode")
    if spec:
        length = spec["mean_acceptance_length"]
        print("%s; acceptance length %s (%s/%s drafts kept); decode %.1f tok/s vs %.1f %s" % (
            verdict, "%.2f" % length if length is not None else "- (no drafts)", spec["num_accepted_tokens"],
            spec["num_draft_tokens"], b["decode_tokens_per_s"], a["decode_tokens_per_s"], args.label_a))
    else:
        print("%s; %s decode %.1f tok/s prefill %.1f tok/s (%s %.1f / %.1f)" % (
            verdict, args.label_b, b["decode_tokens_per_s"], b["prefill_tokens_per_s"], args.label_a,
            a["decode_tokens_per_s"], a["prefill_tokens_per_s"]))


if __name__ == "__main__":
    main()
