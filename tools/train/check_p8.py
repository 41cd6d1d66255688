#!/usr/bin/env python3
"""Checks m3small.attention_p8, the training attention that rounds its probabilities as m3serve's
NVFP4 attention does (train.py --qat-p8), and times it against the SDPA path it replaces.

1. Forward: on fresh random q, k, v and a random MSA block selection, attention_p8 of the
   fake-quantized inputs equals attention_emulated(..., "nvfp4") (the fp32 emulation of m3serve's
   Q8KV4 path that eval_torch.py scores with) to fp32 rounding, dense and sparse.
2. Backward: the chunked, recomputed form gives the gradients of one unchunked pass, and they are
   finite.
3. Time of forward + backward at a training shape (8 x 8192 ids, 6 query heads, 2 KV heads, 64
   dims, top-4 of 128-token blocks) against attention_train (SDPA) on the same inputs.

Needs torch (runs on the GPU machine, or on the CPU without the timing: --no-timing).

Usage: python3 tools/train/check_p8.py [--seed 0] [--no-timing]
"""
import argparse
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import m3small as M  # noqa: E402


def selection(b, g, s, bs, topk, gen):
    scores = torch.randn(b, g, s, -(-s // bs), generator=gen)
    return M.select_blocks(scores, topk, bs)


def check_forward(device, gen, c):
    worst = 0.0
    for s, topk in ((700, 2), (700, 1 << 20), (1500, 4)):
        q = (torch.randn(1, 6, s, 64, generator=gen) * 2).to(device)
        k = (torch.randn(1, 2, s, 64, generator=gen) * 2).to(device)
        v = torch.randn(1, 2, s, 64, generator=gen).to(device)
        keep = selection(1, 2, s, c.index_block_size, topk, gen).to(device)
        want = M.attention_emulated(q, k, v, keep, c, "nvfp4")
        q8, k4, v4 = M.e4m3_round(q), M.nvfp4_kv_round(k), M.nvfp4_kv_round(v)
        got = M.attention_p8(q8, k4, v4, keep, c, chunk=256)
        err = float((got - want).abs().max() / want.abs().max())
        print(f"forward s={s} topk={topk}: max |diff| / max |out| = {err:.2e}")
        worst = max(worst, err)
    return worst < 1e-5


def check_backward(device, gen, c):
    s = 900
    base = [torch.randn(1, 6, s, 64, generator=gen), torch.randn(1, 2, s, 64, generator=gen),
            torch.randn(1, 2, s, 64, generator=gen)]
    keep = selection(1, 2, s, c.index_block_size, 3, gen).to(device)
    weight = torch.randn(1, 6, s, 64, generator=gen).to(device)
    grads = []
    for chunk in (128, s):
        x = [t.clone().to(device).requires_grad_(True) for t in base]
        q8 = M.fake_quant(x[0], M.e4m3_round)
        k4, v4 = M.fake_quant(x[1], M.nvfp4_kv_round), M.fake_quant(x[2], M.nvfp4_kv_round)
        (M.attention_p8(q8, k4, v4, keep, c, chunk=chunk) * weight).sum().backward()
        grads.append([t.grad for t in x])
    ok = True
    for name, a, b in zip("qkv", *grads):
        err = float((a - b).abs().max() / b.abs().max())
        finite = bool(torch.isfinite(a).all())
        print(f"backward d{name}: chunked against one pass {err:.2e}, finite {finite}")
        ok = ok and finite and err < 1e-5
    return ok


def timing(device, gen, c):
    b, s = 8, 8192
    q = torch.randn(b, 6, s, 64, generator=gen).to(device, torch.bfloat16).requires_grad_(True)
    k = torch.randn(b, 2, s, 64, generator=gen).to(device, torch.bfloat16).requires_grad_(True)
    v = torch.randn(b, 2, s, 64, generator=gen).to(device, torch.bfloat16).requires_grad_(True)
    keep = selection(b, 2, s, c.index_block_size, 4, gen).to(device)
    for name, fn in (("attention_train (SDPA)", M.attention_train), ("attention_p8", M.attention_p8)):
        for it in range(3):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.time()
            fn(q, k, v, keep, c).float().square().mean().backward()
            torch.cuda.synchronize()
            if it == 2:
                print(f"{name}: forward + backward {1e3 * (time.time() - t0):.0f} ms, "
                      f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB (8 x 8192, one layer)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-timing", action="store_true")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator().manual_seed(args.seed)
    c = types.SimpleNamespace(index_block_size=128)
    ok = check_forward(device, gen, c)
    ok = check_backward(device, gen, c) and ok
    if device.type == "cuda" and not args.no_timing:
        timing(device, gen, c)
    print("check_p8:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
