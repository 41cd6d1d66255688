#!/usr/bin/env python3
"""scripts/kernel_timeline_summary.py on a hand-made timeline whose numbers are worked out below:
kernel tails under programmatic dependent launch (a kernel that starts before its predecessor ends
adds only what runs past it), a side stream, idle time, the last layer's listing, and a prefill
prompt's timeline beside the decode step's."""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "kernel_timeline_summary.py")


def kernel(name, start, us, stream=7):
    return {"name": name, "start_us": start, "us": us, "stream": stream}


def main():
    ks = []
    # Two layers on stream 7. Layer 1 at t = 0: attention_input 0-10; gemv starts at 5 (early
    # launch), waits, ends at 30: tail 20; norm 32-35 (2 us idle before it): tail 3. A side-stream
    # kernel 12-40 overlaps both. Layer 2 from t = 50 (15 us idle after the side kernel): the same.
    for t0 in (0, 50):
        ks += [kernel("attention_input_kernel<true>", t0, 10), kernel("streamed_linear_kernel<5>", t0 + 5, 25),
               kernel("rms_norm_vec_kernel<1>", t0 + 32, 3), kernel("route_fused_kernel", t0 + 12, 28, stream=9)]
    ks.append(kernel("attention_input_kernel<true>", 100, 10))  # the next layer's start marks layer 2's end
    report = {"decode": [{"batch": 1, "context": 8192, "step_ms": 0.2,
                          "kernel_timeline": {"host_span_us": 130.0, "kernels": ks}},
                         {"batch": 8, "context": 8192, "step_ms": 0.3}],
              "prefill": [{"prompt_len": 4096, "chunk_size": 2048, "time_ms": 1.5,
                           "kernel_timeline": {"host_span_us": 1400.0,
                                               "kernels": [kernel("moe_gemm", 0, 600), kernel("moe_gemm", 700, 650)]}}]}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(report, f)
    out = subprocess.run([sys.executable, SCRIPT, f.name], capture_output=True, text=True, check=True).stdout
    os.unlink(f.name)
    print(out)
    # Span 0-110; busy: [0, 40] + [50, 90] + [100, 110] = 90; idle 20.
    assert "kernels span 0.110 ms, 9 kernels on 2 streams; busy 0.090 ms, idle 0.020 ms" in out, out
    rows = {m.group(1): (int(m.group(3)), float(m.group(4)), float(m.group(5)))
            for m in re.finditer(r"^  (\S+)\s+(main|side \d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)}
    # Tails: gemv 20 a layer (it started at +5 but ran to +30), norm 3, attention_input 10 x 3,
    # the side kernel 28 each (its own chain).
    assert rows["streamed_linear_kernel<5>"] == (2, 40.0, 25.0), rows
    assert rows["rms_norm_vec_kernel<1>"] == (2, 6.0, 3.0), rows
    assert rows["attention_input_kernel<true>"] == (3, 30.0, 10.0), rows
    assert rows["route_fused_kernel"] == (2, 56.0, 28.0), rows
    assert "one layer (main stream, kernels 3-5): 50.0 us start to start" in out, out
    assert "side: +   12.0    28.0 us  route_fused_kernel" in out, out
    assert "b8" not in out, "a case without a timeline is left out"
    # The prefill prompt: two chunks' kernels, 100 us idle between them.
    assert ("prefill 4096 (chunks of 2048): prompt 1.5 ms (timed pass), recorded 1.400 ms on the host; kernels "
            "span 1.350 ms, 2 kernels on 1 streams; busy 1.250 ms, idle 0.100 ms") in out, out


if __name__ == "__main__":
    main()
