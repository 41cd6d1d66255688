#!/usr/bin/env python3
"""Issue 19 item 1's per-op table from `m3serve bench latency --json` reports: for each decode case,
each op's ms per step and its ratio to its own byte floor (ops_floor_ratio: the op's time less one
wait a call, over the bytes it must move at the report's bandwidth; app/op_floors.h), one column
pair per report, largest ops first (by the last report's time). Markdown on stdout.

usage: op_floor_table.py REPORT.json [REPORT.json ...] [--label NAME ...] [--top N]

With two reports (before, after) it is the before/after table the issue asks for; a ratio above
1.3 needs a sentence saying why in the notes.
"""
import argparse
import json
import sys


def decode_cases(path):
    with open(path) as f:
        report = json.load(f)
    cases = {}
    for r in report.get("decode", []):
        if r.get("status") == "ok" and "ops_ms" in r:
            cases[(r["batch"], r["context"])] = r
    return report, cases


def cell(case, op):
    if case is None or op not in case.get("ops_ms", {}):
        return "-"
    ms = case["ops_ms"][op]
    ratio = case.get("ops_floor_ratio", {}).get(op)
    return f"{ms:.3f} (x{ratio:.2f})" if ratio is not None else f"{ms:.3f}"


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+")
    parser.add_argument("--label", action="append", default=[], help="a column's name, in report order")
    parser.add_argument("--top", type=int, default=12, help="ops per case (0: all)")
    args = parser.parse_args(argv)
    loaded = [decode_cases(p) for p in args.reports]
    labels = args.label + [p for p in args.reports[len(args.label):]]
    keys = sorted({k for _, cases in loaded for k in cases}, key=lambda k: (k[1], k[0]))
    if not keys:
        sys.exit("no decode case with an op breakdown (run bench latency without --no-op-breakdown)")
    for batch, context in keys:
        rows = [cases.get((batch, context)) for _, cases in loaded]
        last = next((r for r in reversed(rows) if r is not None), None)
        ops = sorted(last["ops_ms"], key=lambda op: -last["ops_ms"][op])
        if args.top > 0:
            ops = ops[: args.top]
        print(f"\n### batch {batch}, context {context}\n")
        print("| op | " + " | ".join(f"{label}: ms (x own floor)" for label in labels) + " | MB |")
        print("|---|" + "---|" * len(labels) + "---|")
        step = " | ".join(
            f"{r['step_ms']:.3f} (x{r['floor_ratio']:.2f})" if r is not None and "floor_ratio" in r else "-" for r in rows)
        print(f"| whole step | {step} | {last['floor_bytes'] / 1e6:.1f} |")
        for op in ops:
            mb = last.get("ops_bytes", {}).get(op, 0) / 1e6
            print(f"| {op} | " + " | ".join(cell(r, op) for r in rows) + f" | {mb:.2f} |")
        waits = ", ".join(f"{label} {r['op_sync_ms'] * 1e3:.1f} us" for label, r in zip(labels, rows)
                          if r is not None and "op_sync_ms" in r)
        if waits:
            print(f"\nEach op's time includes one wait a call, subtracted in the ratio: {waits}.")


if __name__ == "__main__":
    main(sys.argv[1:])
