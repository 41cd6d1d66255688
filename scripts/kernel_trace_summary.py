#!/usr/bin/env python3
"""Sums Nsight Compute's kernel durations of one decode step against the step's measured time.

usage: kernel_trace_summary.py NCU_CSV BENCH_JSON

NCU_CSV is `ncu --csv --print-kernel-base function --metrics gpu__time_duration.sum` over a
`m3serve bench latency` run of one batch size (its stdout mixed in: only the CSV rows are read).
The step is the kernels from the last embedding kernel on (each forward starts with it). BENCH_JSON
is the same case's `bench latency --json` without ncu, for the step time. Prints the step time, the
sum of its kernels, the difference (what the step loses between kernels: launch, drain and ramp),
the time per kernel name, and the last layer's kernels in order.
"""
import csv
import json
import sys


def read_kernels(path):
    rows, header = [], None
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith('"ID","Process ID"'):
                header = next(csv.reader([line]))
                continue
            if header is None or not line.startswith('"'):
                continue
            fields = next(csv.reader([line]))
            if len(fields) != len(header):
                continue
            r = dict(zip(header, fields))
            if r.get("Metric Name") != "gpu__time_duration.sum":
                continue
            scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
                     "second": 1e6, "s": 1e6}.get(r["Metric Unit"], None)
            if scale is None:
                continue
            value = float(r["Metric Value"].replace(",", ""))
            rows.append((r["Kernel Name"], value * scale, r.get("Grid Size", ""), r.get("Block Size", "")))
    return rows


def main():
    kernels = read_kernels(sys.argv[1])
    bench = json.load(open(sys.argv[2]))
    case = bench["decode"][0]
    starts = [i for i, k in enumerate(kernels) if "embed" in k[0]]
    if not starts:
        print("trace: no embedding kernel found in %d kernels" % len(kernels))
        return
    step = kernels[starts[-1]:]
    total = sum(k[1] for k in step)
    step_us = case["step_ms"] * 1e3
    # Nsight Compute runs each kernel alone (no overlap with the side stream, no programmatic
    # launch, clocks as they come after the pause), so short kernels measure longer than inside
    # the replay and the difference can be negative: read it as an upper bound of the kernels' own
    # time, not as the gaps.
    print("trace b%d ctx %d: step %.1f us (graph replay, no profiler); %d kernels, each alone under ncu, "
          "sum to %.1f us (step minus sum %.1f us, %.2f us a kernel)" % (
              case["batch"], case["context"], step_us, len(step), total, step_us - total,
              (step_us - total) / max(1, len(step))))
    by_name = {}
    for name, us, _, _ in step:
        n, t = by_name.get(name, (0, 0.0))
        by_name[name] = (n + 1, t + us)
    print("  %-44s %5s %10s %8s %6s" % ("kernel", "count", "total us", "mean us", "share"))
    for name, (n, t) in sorted(by_name.items(), key=lambda x: -x[1][1]):
        print("  %-44s %5d %10.1f %8.2f %5.1f%%" % (name[:44], n, t, t / n, 100 * t / total))
    print("  last 24 kernels in order (name, us, grid, block):")
    for name, us, grid, block in step[-24:]:
        print("    %-44s %8.2f %s %s" % (name[:44], us, grid, block))


if __name__ == "__main__":
    main()
