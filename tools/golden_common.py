"""Shared helpers of the golden-fixture scripts (make_golden_models.py, make_release_checkpoint.py,
make_bundled_model.py). They run where torch and transformers 5.17 are installed (the GPU machine),
always on the CPU in fp32 with eager attention so that the recorded outputs are deterministic.

Fixture layout written by `record_reference` (read by tests/model_golden/):
  golden.json   prompts, greedy continuations, top-2 margins, sparsity statistics, tensor list
  logits_<i>.f32  raw little-endian float32 logits [rows, vocab] of prompt i (rows listed in json)
"""
import json
import math
import os

import numpy as np
import torch

from transformers.models.minimax_m3_vl import modeling_minimax_m3_vl as hf


def text_config(**overrides):
    """A MiniMaxM3VLTextConfig with tiny defaults; `partial_rotary_factor` goes into rope_parameters."""
    kw = dict(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=32,
        shared_intermediate_size=32,
        dense_intermediate_size=96,
        num_local_experts=8,
        num_experts_per_tok=2,
        routed_scaling_factor=2.0,
        swiglu_alpha=1.702,
        swiglu_limit=7.0,
        index_n_heads=2,
        index_head_dim=32,
        index_block_size=8,
        index_topk_blocks=4,
        index_local_blocks=1,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    theta = overrides.pop("rope_theta", 10000.0)
    partial = overrides.pop("partial_rotary_factor", 0.5)
    kw.update(overrides)
    kw["rotary_dim"] = int(kw["head_dim"] * partial)
    kw["rope_parameters"] = {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": partial}
    cfg = hf.MiniMaxM3VLTextConfig(**kw)
    set_eager(cfg)
    return cfg


def set_eager(cfg):
    cfg._attn_implementation = "eager"
    try:
        cfg._experts_implementation = "eager"
    except Exception as e:  # older/newer attribute handling: the default is equivalent in fp32
        print("note: could not force eager experts:", e)


def randomize_(model, seed, gain=1.0):
    """Replaces the default init (zero norms, zero router bias, std 0.02) with weights that make
    every part of the graph matter: norm weights U(-0.5, 0.5), router bias N(0, 0.3), linears
    N(0, gain^2 / fan_in) so activations stay O(1), embeddings N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(torch.rand(p.shape, generator=g) - 0.5)
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) * (gain / math.sqrt(fan_in)))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.3)


def random_prompts(seed, lengths, vocab, low=3):
    g = np.random.default_rng(seed)
    return [g.integers(low, vocab, size=n).tolist() for n in lengths]


def _indexer_stats_hook(stats):
    """Forward hook on every MiniMaxM3VLIndexer during a cache-free prefill: recomputes the block
    scores as the module does and records how often sparsity bites (a query row selects fewer
    blocks than it can see) and the smallest gap between the last selected and the first rejected
    free block (a near tie there would make selections fragile across summation orders)."""

    def hook(module, args, output):
        hidden, (cos, sin), pkv, position_ids = args
        if pkv is not None:
            return
        b, q_len, _ = hidden.shape
        d = module.head_dim
        iq = module.q_norm(module.q_proj(hidden).view(b, q_len, -1, d)).transpose(1, 2)
        ik = module.k_norm(module.k_proj(hidden).view(b, q_len, 1, d)).transpose(1, 2)
        iq, ik = hf.apply_rotary_pos_emb(iq, ik, cos[..., :d], sin[..., :d])
        scores = torch.matmul(iq.double(), ik.double().transpose(-1, -2))[0]  # [H, S, S]
        bs = module.block_size
        nb = -(-q_len // bs)
        pos = position_ids[0]
        kpos = torch.arange(q_len)
        scores = scores.masked_fill(kpos[None, None, :] > pos[None, :, None], float("-inf"))
        scores = torch.nn.functional.pad(scores, (0, nb * bs - q_len), value=float("-inf"))
        block = scores.view(scores.shape[0], q_len, nb, bs).amax(-1).numpy()
        topk = min(module.topk_blocks, nb)
        for h in range(block.shape[0]):
            for t in range(q_len):
                local = int(pos[t]) // bs
                visible = local + 1
                stats["rows"] += 1
                if visible <= topk:
                    continue
                stats["sparse_rows"] += 1
                forced = {max(local - i, 0) for i in range(module.local_blocks)}
                free = sorted((block[h, t, j] for j in range(visible) if j not in forced), reverse=True)
                n_free = topk - len(forced)
                if 0 < n_free < len(free):
                    gap = free[n_free - 1] - free[n_free]
                    stats["min_gap"] = min(stats["min_gap"], float(gap))
        sel = output[0].numpy()
        stats["selected_max_valid"] = max(stats["selected_max_valid"], int((sel >= 0).sum(-1).max()))

    return hook


def record_reference(model, prompts, out_dir, n_greedy=20, logit_rows=None, extra=None, tag="fp32"):
    """Runs the reference on each prompt: full-prompt logits (cache-free prefill) and a greedy
    continuation through generate() (KV + index cache path), with the top-2 margin of each greedy
    step. logit_rows: which positions to keep (default: all)."""
    os.makedirs(out_dir, exist_ok=True)
    model.eval()
    stats = {"rows": 0, "sparse_rows": 0, "min_gap": float("inf"), "selected_max_valid": 0}
    hooks = [m.register_forward_hook(_indexer_stats_hook(stats))
             for m in model.modules() if isinstance(m, hf.MiniMaxM3VLIndexer)]
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    entries = []
    for i, ids in enumerate(prompts):
        x = torch.tensor([ids])
        with torch.no_grad():
            logits = model(input_ids=x, use_cache=False).logits[0].float()
        rows = list(range(len(ids))) if logit_rows is None else [r if r >= 0 else len(ids) + r for r in logit_rows]
        fname = f"logits_{tag}_{i}.f32"
        logits[rows].numpy().astype("<f4").tofile(os.path.join(out_dir, fname))
        with torch.no_grad():
            gen = model.generate(x, max_new_tokens=n_greedy, min_new_tokens=n_greedy, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True, eos_token_id=None,
                                 pad_token_id=0)
        new_ids = gen.sequences[0, len(ids):].tolist()
        margins = []
        for step_logits in gen.logits:
            top2 = torch.topk(step_logits[0].float(), 2).values
            margins.append(float(top2[0] - top2[1]))
        first = gen.logits[0][0].float()
        decode_vs_prefill = float((first - logits[-1]).abs().max()) if (logit_rows is None or len(ids) - 1 in rows) else None
        entries.append({
            "ids": ids,
            "logits_file": fname,
            "logit_rows": rows,
            "greedy": new_ids,
            "greedy_margins": margins,
            "generate_first_step_vs_prefill_maxdiff": decode_vs_prefill,
        })
        print(f"  prompt {i}: len {len(ids)} greedy {new_ids[:8]}... min margin {min(margins):.4g}")
    for hk in hooks:
        hk.remove()
    stats["min_gap"] = None if stats["min_gap"] == float("inf") else stats["min_gap"]
    print(f"  indexer: {stats['sparse_rows']}/{stats['rows']} rows sparse, min selection gap {stats['min_gap']}")
    return {"prompts": entries, "indexer_stats": stats, **(extra or {})}


def tensor_manifest(path):
    from safetensors import safe_open
    out = {}
    with safe_open(path, "pt") as f:
        for k in f.keys():
            t = f.get_slice(k)
            out[k] = {"dtype": t.get_dtype(), "shape": list(t.get_shape())}
    return out


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")


def max_logit_diff(a, b, prompts):
    d = 0.0
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            la = a(input_ids=x, use_cache=False).logits.float()
            lb = b(input_ids=x, use_cache=False).logits.float()
            d = max(d, float((la - lb).abs().max()))
    return d
