#!/usr/bin/env python3
"""Reads `m3serve bench latency --kernel-timeline --json` output and prints, per decode case (one
step) and prefill case (one whole prompt), where the time goes as the GPU ran it (CUPTI's
timestamps; decode steps are replayed from CUDA graphs).

With programmatic dependent launch a kernel starts while the one before it drains and waits inside
for it, so its duration overstates what it adds. What a kernel adds to the step is its tail on the
stream's chain: end_i - max(end_{i-1}, start_i) over the kernels of that stream in order. The tails
of the main stream (the one with the most kernels) sum to its span; idle is the time no kernel of
any stream runs (launch and dependency gaps). Prints, per case: the span, busy and idle time, the
tails summed per kernel name, and the kernels of the last layer one by one.

usage: kernel_timeline_summary.py BENCH.json [--top N]
"""
import json
import sys
from collections import defaultdict


def short(name, width=60):
    name = name.replace("m3::cuda::detail::", "").replace("(anonymous namespace)::", "")
    return name if len(name) <= width else name[: width - 3] + "..."


def summarize(case, top):
    tl = case["kernel_timeline"]
    ks = tl["kernels"]
    if "prompt_len" in case:
        title = (f"prefill {case['prompt_len']} (chunks of {case.get('chunk_size', '?')}): "
                 f"prompt {case.get('time_ms', 0):.1f} ms (timed pass)")
    else:
        title = f"decode b{case['batch']} ctx {case['context']}: step {case.get('step_ms', 0):.3f} ms (timed pass)"
    if not ks:
        print(f"{title}: no kernels recorded")
        return
    per_stream = defaultdict(list)
    for k in ks:
        per_stream[k["stream"]].append(k)
    main = max(per_stream, key=lambda s: len(per_stream[s]))
    span = max(k["start_us"] + k["us"] for k in ks) - min(k["start_us"] for k in ks)
    # Busy: the union of all kernels' intervals.
    intervals = sorted((k["start_us"], k["start_us"] + k["us"]) for k in ks)
    busy, cur_s, cur_e = 0.0, *intervals[0]
    for s, e in intervals[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    print(f"{title}, recorded {tl['host_span_us'] / 1e3:.3f} ms on the host; kernels span "
          f"{span / 1e3:.3f} ms, {len(ks)} kernels on {len(per_stream)} streams; busy {busy / 1e3:.3f} ms, "
          f"idle {(span - busy) / 1e3:.3f} ms")
    tails = defaultdict(lambda: [0, 0.0, 0.0])  # name -> count, tail, duration
    for s, lst in per_stream.items():
        prev_end = None
        for k in lst:
            end = k["start_us"] + k["us"]
            tail = end - (k["start_us"] if prev_end is None else max(prev_end, k["start_us"]))
            prev_end = end if prev_end is None else max(prev_end, end)
            k["tail"] = max(tail, 0.0)
            key = (short(k["name"]), "main" if s == main else f"side {s}")
            t = tails[key]
            t[0] += 1
            t[1] += k["tail"]
            t[2] += k["us"]
    print(f"  {'kernel':60s} {'stream':>9s} {'count':>5s} {'tail us':>9s} {'mean dur':>9s}")
    for (name, stream), (n, tail, dur) in sorted(tails.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {name:60s} {stream:>9s} {n:5d} {tail:9.1f} {dur / n:9.1f}")
    # The last layer: main-stream kernels from the last but one attention_input on.
    mk = per_stream[main]
    marks = [i for i, k in enumerate(mk) if "attention_input" in k["name"]]
    if len(marks) >= 2:
        first, last = marks[-2], marks[-1]
        t0 = mk[first]["start_us"]
        print(f"  one layer (main stream, kernels {first}-{last - 1}): {mk[last]['start_us'] - t0:.1f} us start to start")
        for k in mk[first:last]:
            print(f"    +{k['start_us'] - t0:7.1f} {k['us']:7.1f} us (tail {k['tail']:6.1f})  {short(k['name'], 70)}")
        side = [k for s, lst in per_stream.items() if s != main for k in lst
                if t0 <= k["start_us"] < mk[last]["start_us"]]
        for k in side:
            print(f"    side: +{k['start_us'] - t0:7.1f} {k['us']:7.1f} us  {short(k['name'], 70)}")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 25
    data = json.load(open(sys.argv[1]))
    cases = [c for c in data.get("decode", []) + data.get("prefill", []) if "kernel_timeline" in c]
    if not cases:
        sys.exit("no case has a kernel_timeline (run bench latency with --kernel-timeline --json)")
    for c in cases:
        summarize(c, top)


if __name__ == "__main__":
    main()
