#!/usr/bin/env python3
"""Real acceptance length of a drafter through a live `m3serve serve` with --speculative-config:
the held-out code prompts of tests/model_small/code_prompts.json (those the small model and its
drafter never trained on) completed greedily and at temperature 1, and the server's own
vllm:spec_decode_* counters read from /metrics before and after each setting. Mean acceptance
length counts the target's own token, as vLLM's: 1 + accepted drafts / verification steps.
Decode tokens/s is wall-clock over the setting's requests (concurrency as given).

Needs only python3 and a built m3serve.

Usage: python3 tools/train/eval_spec.py --m3serve build/bin/m3serve [--model models/minimax-m3-small]
           [--method dspark|ngram] [--k 3,7] [--temperatures 0,1] [--count 100] [--max-tokens 128]
           [--device cpu|cuda] [--adaptive] [--out FILE] [--min-length L]
"""
import argparse
import concurrent.futures
import json
import re
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import eval_code as EC  # noqa: E402

COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def spec_counters(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for name in COUNTERS:
        m = re.search(r"^vllm:spec_decode_%s_total\{[^}]*\} ([0-9.e+]+)$" % name, text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    out["per_pos"] = [float(v) for v in re.findall(
        r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position="\d+"\} ([0-9.e+]+)$', text, re.M)]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m3serve", required=True)
    ap.add_argument("--model", default="models/minimax-m3-small")
    ap.add_argument("--prompts", default="tests/model_small/code_prompts.json")
    ap.add_argument("--method", default="dspark")
    ap.add_argument("--k", default="3,7")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--adaptive", action="store_true",
                    help="enable_adaptive_verification (drafts cut by the drafter's confidence head)")
    ap.add_argument("--out")
    ap.add_argument("--min-length", type=float, default=0.0,
                    help="exit 1 when a greedy setting's mean acceptance length is below this")
    args = ap.parse_args()
    prompts = json.load(open(args.prompts))["prompts"][:args.count]
    results, failed = [], False
    for k in [int(x) for x in args.k.split(",")]:
        # k = 0: the same server without speculation (the baseline's tokens/s).
        spec = {"method": args.method, "num_speculative_tokens": k}
        if args.method == "ngram":
            spec["prompt_lookup_min"] = 2
        if args.adaptive:
            spec["enable_adaptive_verification"] = True
        port = EC.free_port()
        server = EC.start_server(args, port, (["--speculative-config", json.dumps(spec)] if k > 0 else [])
                                 + ["--disable-log-stats"])
        try:
            for t in [float(x) for x in args.temperatures.split(",")]:
                before = spec_counters(port)
                start, tokens = time.time(), 0

                def one(i):
                    body = {"model": args.model, "prompt": prompts[i]["prompt"], "max_tokens": args.max_tokens,
                            "temperature": t, "seed": 1000 + i}
                    return EC.post(port, "/v1/completions", body, 600)["usage"]["completion_tokens"]

                with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
                    tokens = sum(pool.map(one, range(len(prompts))))
                seconds = time.time() - start
                after = spec_counters(port)
                d = {n: after[n] - before[n] for n in COUNTERS}
                per_pos = [a - b for a, b in zip(after["per_pos"], before["per_pos"] or [0.0] * len(after["per_pos"]))]
                length = 1.0 + d["num_accepted_tokens"] / d["num_drafts"] if d["num_drafts"] else None
                row = {"method": args.method if k > 0 else "none", "k": k, "adaptive": args.adaptive and k > 0,
                       "concurrency": args.concurrency, "temperature": t, "requests": len(prompts),
                       "completion_tokens": tokens,
                       "mean_acceptance_length": round(length, 3) if length is not None else None,
                       "per_position": [round(x / d["num_drafts"], 3) for x in per_pos] if d["num_drafts"] else [],
                       "verification_steps": int(d["num_drafts"]), "tokens_per_s": round(tokens / seconds, 1)}
                print(json.dumps(row), flush=True)
                results.append(row)
                if k > 0 and t == 0 and (length or 0.0) < args.min_length:
                    print(f"FAILED: greedy k={k} acceptance length {length} < {args.min_length}")
                    failed = True
        finally:
            server.terminate()
            server.wait(timeout=30)
    if args.out:
        json.dump(results, open(args.out, "w"), indent=1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
