#!/usr/bin/env python3
"""The generator of expert iteration (expert_iteration.sh): a live `m3serve serve` of the current
model completes definition prompts made from the train split, and the completions that pass
eval_code.py's check without a looping line become supervised targets for train.py stage e
(--st-gen 0 --st-targets FILE).

Why m3serve: the training path's generator (self_train.py) runs a Python loop per token and spent
nearly all of a stage e step generating; m3serve batches hundreds of completions with its CUDA
graphs, and generates with the numerics the model ships with (MSA selection, NVFP4 KV), which are
what eval_code.py measures.

Each prompt (definition_prompts.prompt_of_document over defs.jsonl in a seeded order, so each
round's seed gives other prompts; --kinds picks which kinds) is completed once greedily and
--samples times at eval_code.py's temperature and top-p, with its kind's max_tokens
(definition_prompts.MAX_TOKENS) and eval_code.py's stop strings for definitions. A completion's
verdict and target come from definition_prompts.target_text; two equal targets of one prompt are
kept once. Sampled completions of chat and tool prompts that leave the think tags to the model
start from the opening tag (forces_think_open; --force-think-open 0 turns it off). Tool prompts
(a tool exchange cut before the call) are longer than the others: the
tools and their instructions take about 2,000 characters, so their limit is
--max-tool-prompt-chars.

The completions that give no target and either ran to max_tokens or loop (a looping line, or a
run inside a line: definition_prompts.repeated_runs) are the round's negatives (--negatives,
jsonl: kind, mode, prompt, completion, finish_reason; chat and tool text keeps its special
tokens, the think and tool-call tags): train.py stage e (--st-negatives) gives
their repeated tokens the unlikelihood term, so the model is taught against the loops it makes
with the numerics it ships with, not only towards what ends.

Needs only python3 and a built m3serve (no torch). Writes --out (jsonl: kind, mode, prompt,
target), --negatives, and --stats (pass, acceptance and negative rates per mode and kind, and the
generation rate).

Usage: python3 tools/train/gen_targets.py --m3serve build/bin/m3serve --model DIR --defs defs.jsonl
           --count N --seed S --out targets.jsonl [--negatives negatives.jsonl] [--stats stats.json]
           [--device cuda] [--concurrency 256] [--samples 1] [--kinds function,class,chat,tool]
           [--max-prompt-chars 1400] [--max-tool-prompt-chars 4000]
"""
import argparse
import concurrent.futures
import json
import os
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import definition_prompts as DP  # noqa: E402
import eval_code  # noqa: E402


def prompts_of(defs, count, seed, kinds, max_chars, max_tool_chars):
    """Up to `count` (kind, prompt) of the definition documents in a seeded random order."""
    out = []
    for kind, text in DP.prompts_in_order(defs, seed, kinds):
        if len(text) <= (max_tool_chars if kind == "tool" else max_chars):
            out.append((kind, text))
            if len(out) == count:
                break
    if not out:
        raise SystemExit(f"{defs}: no definition document gives a prompt")
    return out


def forces_think_open(kind, prompt, mode, enabled):
    """Whether this completion starts from the opening think tag, given in the request and put
    back in front of the completion. An open chat or tool prompt (one that does not close the
    think tag) comes from a document whose turn opens with <mm:think> (definition_prompts cuts
    the bare </mm:think> into the prompt), so a sampled completion that starts there is a target
    in the template's format even while the model itself drops the tag; greedy completions are
    left alone, so that their tags_right still measures the model."""
    return enabled and mode == "sampled" and kind in ("chat", "tool") and not prompt.endswith(DP.THINK_CLOSED)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m3serve", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--defs", required=True, help="corpus.py's defs.jsonl (train split)")
    ap.add_argument("--count", type=int, default=1024, help="prompts")
    ap.add_argument("--seed", type=int, default=0, help="which prompts, and the sampling seeds")
    ap.add_argument("--samples", type=int, default=1, help="sampled completions per prompt (besides the greedy one)")
    ap.add_argument("--kinds", default=",".join(DP.ALL_KINDS), help="prompt kinds (function, class, chat, tool)")
    ap.add_argument("--max-prompt-chars", type=int, default=1400)
    ap.add_argument("--max-tool-prompt-chars", type=int, default=4000)
    ap.add_argument("--force-think-open", type=int, choices=(0, 1), default=1,
                    help="sampled completions of open chat / tool prompts start from <mm:think> (forces_think_open)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--kv-cache-dtype", default="nvfp4")
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", required=True)
    ap.add_argument("--negatives", help="jsonl of the completions without a target that looped or ran to max_tokens")
    ap.add_argument("--stats")
    args = ap.parse_args()

    kinds = tuple(args.kinds.split(","))
    unknown = set(kinds) - set(DP.ALL_KINDS)
    if unknown:
        raise SystemExit(f"--kinds: unknown kind(s) {', '.join(sorted(unknown))} (known: {', '.join(DP.ALL_KINDS)})")
    prompts = prompts_of(args.defs, args.count, args.seed, kinds, args.max_prompt_chars, args.max_tool_prompt_chars)
    jobs = [(i, p, "greedy", 0) for i, p in enumerate(prompts)]
    jobs += [(i, p, "sampled", s) for s in range(args.samples) for i, p in enumerate(prompts)]
    port = eval_code.free_port()
    t0 = time.time()
    server = eval_code.start_server(args, port)
    t_ready = time.time()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
            served = json.loads(r.read())["data"][0]["id"]

        def one(job):
            i, (kind, text), mode, s = job
            seed_base = (args.seed * (args.samples + 1) + s) * 1_000_000
            # The tool-call tags and the think tags are special tokens, which a completion's text
            # leaves out unless asked: the verdict and the target need them. (Until session 19,
            # chat targets were made without them and taught the model to drop its think tags.)
            extra = {"skip_special_tokens": False} if kind in ("chat", "tool") else {}
            forced = forces_think_open(kind, text, mode, args.force_think_open)
            res = eval_code.complete(port, served, {"kind": kind, "prompt": text + (DP.THINK_OPEN if forced else "")},
                                     mode, i, extra, args.timeout, seed_base=seed_base, max_tokens=DP.MAX_TOKENS[kind])
            if forced:
                res.update(completion=DP.THINK_OPEN + res["completion"], forced_think_open=True)
            return res
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            results = list(pool.map(one, jobs))
    finally:
        server.terminate()
        server.wait(timeout=30)
    t_done = time.time()

    counts, seen, targets, negatives = {}, set(), [], []
    for (i, (kind, text), mode, _), res in zip(jobs, results):
        ended = res.get("finish_reason") == "stop" and kind in ("chat", "tool")
        passed, target = DP.target_text(kind, text, res["completion"], ended) if "error" not in res else (False, None)
        c = counts.setdefault(f"{mode}_{kind}", {"n": 0, "parsed": 0, "accepted": 0, "negatives": 0, "errors": 0})
        c["n"] += 1
        if kind in ("chat", "tool") and not text.endswith(DP.THINK_CLOSED) and "error" not in res \
                and not res.get("forced_think_open"):
            # prompts that leave the think tags to the model: how often it writes them as the template does
            c["open_turns"] = c.get("open_turns", 0) + 1
            c["tags_right"] = c.get("tags_right", 0) + int(DP.turn_opens_right(text, res["completion"]))
        c["parsed"] += int(passed)
        c["errors"] += int("error" in res)
        if target is not None and (i, target) not in seen:
            seen.add((i, target))
            c["accepted"] += 1
            targets.append({"kind": kind, "mode": mode, "prompt": text, "target": target})
        elif target is None and "error" not in res and (
                res["finish_reason"] == "length" or DP.looping_lines(res["completion"])
                or DP.repeated_runs(res["completion"])):
            c["negatives"] += 1
            negatives.append({"kind": kind, "mode": mode, "prompt": text, "completion": res["completion"],
                              "finish_reason": res["finish_reason"]})
    DP.corpus.write_jsonl(args.out, targets)
    if args.negatives:
        DP.corpus.write_jsonl(args.negatives, negatives)
    tokens = sum(r["completion_tokens"] for r in results)
    gen_s = t_done - t_ready
    stats = {"model": args.model, "device": args.device, "seed": args.seed, "prompts": len(prompts),
             "completions": len(results), "targets": len(targets), "negatives": len(negatives),
             "completion_tokens": tokens,
             "server_start_s": round(t_ready - t0, 1), "generate_s": round(gen_s, 1),
             "completions_per_s": round(len(results) / gen_s, 1), "tokens_per_s": round(tokens / gen_s),
             "by_mode_kind": {k: {**v, "parse_rate": round(v["parsed"] / v["n"], 4),
                                  "accept_rate": round(v["accepted"] / v["n"], 4)} for k, v in sorted(counts.items())}}
    if args.stats:
        with open(args.stats, "w") as fh:
            json.dump(stats, fh, indent=1)
    print(f"{len(results)} completions ({tokens} tokens) in {gen_s:.0f} s after a {t_ready - t0:.0f} s start; "
          f"{len(targets)} targets -> {args.out}, {len(negatives)} negatives")
    for k, v in stats["by_mode_kind"].items():
        print(f"  {k}: {v['n']} completions, parse {v['parse_rate']:.2f}, accept {v['accept_rate']:.2f}, "
              f"negative {v['negatives'] / v['n']:.2f}"
              + (f", think tags right {v['tags_right']}/{v['open_turns']}" if v.get("open_turns") else "")
              + (f", {v['errors']} errors" if v["errors"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
