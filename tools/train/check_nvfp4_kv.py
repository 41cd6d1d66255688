#!/usr/bin/env python3
"""Checks m3small.nvfp4_kv_round, the training and emulation form of m3serve's NVFP4 KV encoder
(formats/nvfp4.h: the E4M3 scale searched among E4M3(amax / 6) and five neighbouring bytes for the
least squared error of the group as the Q8KV4 kernels read it back):

- no group decodes further from its input than with the amax / 6 scale alone (scale_search=False,
  m3serve's encoder before session 20), on Gaussian, heavy-tailed (Student t, 3 degrees of
  freedom) and tiny groups (where the scale clamps at 2^-9);
- the signal-to-noise ratio of both encoders, which is what the search buys.

The engine's encoder is checked against a brute-force reference in tests/formats (byte for byte)
and the CUDA encoders against the CPU one in the op harness (tests/kernels_cuda); eval_torch.py's
perplexities against `m3serve score` close the loop (tests/model_small/check_score.py).

Needs torch. Usage: python3 tools/train/check_nvfp4_kv.py [--seed 0]
"""
import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import m3small as M  # noqa: E402


def check_scale_search(device, gen):
    ok = True
    t3 = torch.distributions.StudentT(torch.tensor(3.0))
    for name, x in (("gaussian", torch.randn(4096, 64, generator=gen)),
                    ("student-t 3", t3.sample((4096, 64))),
                    ("small (scale clamp)", torch.randn(512, 64, generator=gen) * 1e-3)):
        x = x.to(device)
        plain, search = M.nvfp4_kv_round(x, scale_search=False), M.nvfp4_kv_round(x)
        e_plain = (plain - x).square().view(-1, 16).sum(-1)
        e_search = (search - x).square().view(-1, 16).sum(-1)
        worse = int((e_search > e_plain).sum())
        snr = lambda e: 10 * math.log10(float(x.square().sum() / e.sum().clamp(min=1e-30)))  # noqa: E731
        print(f"scale search, {name}: SNR {snr(e_plain):.2f} dB -> {snr(e_search):.2f} dB; groups worse {worse}")
        ok = ok and worse == 0
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    ok = check_scale_search(device, gen)
    print("check_nvfp4_kv:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
