#!/usr/bin/env python3
"""Fails when a source file includes a project header from a layer it may not depend on.

The layers (docs/architecture.md, "Layers"): dependencies point one way,
    core <- formats <- ops <- kernels        ops <- model <- engine <- server <- app
    text, hub and loadgen beside (core only), grammar beside (core and ops: it implements ops/token_constraint.h),
    parallel beside kernels (ops and below; model and above may use it);
a folder may include its own headers and those of the layers below it. tests/, bench/ and tools/
may include anything. Prints each offending include as file:line and exits 1; 0 when clean."""
import pathlib
import re
import sys

ALLOWED = {
    "core": {"core"},
    "formats": {"core", "formats"},
    "ops": {"core", "formats", "ops"},
    "kernels": {"core", "formats", "ops", "kernels"},
    "parallel": {"core", "formats", "ops", "parallel"},
    "model": {"core", "formats", "ops", "parallel", "model"},
    "engine": {"core", "formats", "ops", "parallel", "model", "engine"},
    "text": {"core", "text"},
    "grammar": {"core", "ops", "grammar"},
    "hub": {"core", "hub"},
    "loadgen": {"core", "loadgen"},
    "server": {"core", "formats", "ops", "engine", "text", "grammar", "server"},
    "app": None,  # the top: anything
}
SOURCES = {".h", ".cc", ".cu", ".cuh"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/')


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    layers = set(ALLOWED)
    bad = []
    checked = 0
    for layer, allowed in ALLOWED.items():
        folder = root / layer
        if allowed is None or not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*")):
            if path.suffix not in SOURCES:
                continue
            checked += 1
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if m and m.group(1) in layers | {"tests"} and m.group(1) not in allowed:
                    bad.append(f"{path.relative_to(root)}:{number}: {layer}/ may not include {m.group(1)}/ "
                               f"(allowed: {', '.join(sorted(allowed))})")
    for line in bad:
        print(line)
    print(f"layer includes: {checked} files checked, {len(bad)} crossing a layer the wrong way")
    return 1 if bad or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
