#!/usr/bin/env python3
"""Writes a tiny random MiniMax-M3 checkpoint in the release (vendor) layout and records the
Hugging Face reference run on exactly its dequantized weights.

Layout (docs/reference.md 4): `language_model.model.layers.N...`, separate
q/k/v/o and index_q/index_k projections, dense `mlp.{gate,up,down}_proj`, MoE
`block_sparse_moe.{gate, e_score_correction_bias, shared_experts.*, experts.E.w1/w2/w3}`.
Formats: attention, indexer, dense MLP and shared experts in MXFP8 (E4M3 `weight` + UE8M0
`weight_scale_inv` per 1x32 block); routed experts in NVFP4 compressed-tensors (`weight_packed`,
E4M3 `weight_scale` per 16, fp32 `weight_global_scale`; w1 and w3 share one global scale); embeddings,
lm_head and norms BF16; router fp32. The config is the MiniMax VL schema with legacy field names
(`sparse_attention_config`, `moe_layer_freq`) and the MiniMax `quantization_config`.
A second directory holds the same values as ModelOpt NVFP4 experts (`weight`, `weight_scale`,
`weight_scale_2`, `input_scale`).

Usage (GPU machine): python3 tools/make_release_checkpoint.py --out tests/model_golden/data
"""
import argparse
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_common as gc  # noqa: E402
from transformers.models.minimax_m3_vl import modeling_minimax_m3_vl as hf  # noqa: E402
from transformers.models.minimax_m3_vl import configuration_minimax_m3_vl as hfc  # noqa: E402

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def to_e4m3(x):
    return x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def mxfp8(w):
    """[N, K] fp32 -> (E4M3 [N, K], UE8M0 uint8 [N, K/32], dequantized fp32)."""
    n, k = w.shape
    assert k % 32 == 0, f"MXFP8 needs in_features % 32 == 0, got {k}"
    b = w.reshape(n, k // 32, 32)
    amax = b.abs().amax(-1).clamp(min=2.0 ** -100)
    e = torch.ceil(torch.log2(amax / 448.0))
    # log2 may land one below for values just above a power of two: make sure amax/2^e <= 448
    e = torch.where(amax / torch.exp2(e) > 448.0, e + 1, e)
    q = to_e4m3(b / torch.exp2(e)[..., None])
    deq = q.float() * torch.exp2(e)[..., None]
    scale = (e + 127).to(torch.uint8)
    return q.reshape(n, k), scale, deq.reshape(n, k)


def e2m1_codes(x):
    """Round to the nearest E2M1 value, ties to even (formats/nvfp4.h), saturating at 6; +0 for 0."""
    a = x.abs()
    c = torch.zeros_like(a, dtype=torch.uint8)
    c = torch.where(a > 0.25, 1, c)
    c = torch.where(a >= 0.75, 2, c)
    c = torch.where(a > 1.25, 3, c)
    c = torch.where(a >= 1.75, 4, c)
    c = torch.where(a > 2.5, 5, c)
    c = torch.where(a >= 3.5, 6, c)
    c = torch.where(a > 5.0, 7, c)
    c = c.to(torch.uint8)
    sign = ((x < 0) & (c != 0)).to(torch.uint8) * 8
    return c | sign


def nvfp4(w, global_amax):
    """[N, K] -> (packed uint8 [N, K/2], E4M3 scale [N, K/16], weight_global_scale, dequantized)."""
    n, k = w.shape
    assert k % 16 == 0
    gs = torch.tensor(448.0 * 6.0 / float(global_amax), dtype=torch.float32)
    g = w.reshape(n, k // 16, 16)
    amax = g.abs().amax(-1)
    scale = to_e4m3((amax / 6.0 * gs).clamp(min=2.0 ** -9))
    sdec = scale.float() / gs
    codes = e2m1_codes(g / sdec[..., None])
    vals = E2M1[(codes & 7).long()] * torch.where((codes & 8) != 0, -1.0, 1.0)
    deq = (vals * scale.float()[..., None] / gs).reshape(n, k)
    codes = codes.reshape(n, k)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return packed.contiguous(), scale.contiguous(), gs.reshape(1), deq


def bf16(t):
    return t.to(torch.bfloat16)


def build(model, cfg):
    """Returns (release tensors, modelopt tensors, dequantized HF state dict)."""
    sd = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    rel, mo, deq = {}, {}, dict(sd)
    P = "language_model."

    def put_both(name, t):
        rel[name] = t
        mo[name] = t

    def put_bf16(hf_name, name):
        t = bf16(sd[hf_name])
        put_both(name, t)
        deq[hf_name] = t.float()

    def put_mxfp8(hf_name, name, rows=None):
        w = sd[hf_name] if rows is None else sd[hf_name][rows[0]:rows[1]]
        q, s, d = mxfp8(w)
        put_both(name + ".weight", q)
        put_both(name + ".weight_scale_inv", s)
        return d

    put_bf16("model.embed_tokens.weight", P + "model.embed_tokens.weight")
    put_bf16("model.norm.weight", P + "model.norm.weight")
    put_bf16("lm_head.weight", P + "lm_head.weight")
    ignored = [P + "lm_head", P + "model.embed_tokens"]
    modelopt_layers = {}
    for i in range(cfg.num_hidden_layers):
        h = f"model.layers.{i}."
        r = f"{P}model.layers.{i}."
        put_bf16(h + "input_layernorm.weight", r + "input_layernorm.weight")
        put_bf16(h + "post_attention_layernorm.weight", r + "post_attention_layernorm.weight")
        for p in ("q", "k", "v", "o"):
            deq[h + f"self_attn.{p}_proj.weight"] = put_mxfp8(h + f"self_attn.{p}_proj.weight", r + f"self_attn.{p}_proj")
            modelopt_layers[r + f"self_attn.{p}_proj"] = {"quant_algo": "MXFP8"}
        put_bf16(h + "self_attn.q_norm.weight", r + "self_attn.q_norm.weight")
        put_bf16(h + "self_attn.k_norm.weight", r + "self_attn.k_norm.weight")
        if cfg.layer_types[i] == "minimax_m3_sparse":
            for p in ("q", "k"):
                deq[h + f"self_attn.indexer.{p}_proj.weight"] = put_mxfp8(
                    h + f"self_attn.indexer.{p}_proj.weight", r + f"self_attn.index_{p}_proj")
                modelopt_layers[r + f"self_attn.index_{p}_proj"] = {"quant_algo": "MXFP8"}
                put_bf16(h + f"self_attn.indexer.{p}_norm.weight", r + f"self_attn.index_{p}_norm.weight")
        if cfg.mlp_layer_types[i] == "dense":
            inter = cfg.dense_intermediate_size
            gu = h + "mlp.gate_up_proj.weight"
            dg = put_mxfp8(gu, r + "mlp.gate_proj", (0, inter))
            du = put_mxfp8(gu, r + "mlp.up_proj", (inter, 2 * inter))
            deq[gu] = torch.cat([dg, du], 0)
            deq[h + "mlp.down_proj.weight"] = put_mxfp8(h + "mlp.down_proj.weight", r + "mlp.down_proj")
            for p in ("gate", "up", "down"):
                modelopt_layers[r + f"mlp.{p}_proj"] = {"quant_algo": "MXFP8"}
            continue
        m = r + "block_sparse_moe."
        put_both(m + "gate.weight", sd[h + "mlp.gate.weight"].float().contiguous())
        put_both(m + "e_score_correction_bias", sd[h + "mlp.gate.e_score_correction_bias"].float().contiguous())
        ignored.append(m + "gate")
        inter = cfg.shared_intermediate_size
        gu = h + "mlp.shared_experts.gate_up_proj.weight"
        dg = put_mxfp8(gu, m + "shared_experts.gate_proj", (0, inter))
        du = put_mxfp8(gu, m + "shared_experts.up_proj", (inter, 2 * inter))
        deq[gu] = torch.cat([dg, du], 0)
        deq[h + "mlp.shared_experts.down_proj.weight"] = put_mxfp8(
            h + "mlp.shared_experts.down_proj.weight", m + "shared_experts.down_proj")
        for p in ("gate", "up", "down"):
            modelopt_layers[m + f"shared_experts.{p}_proj"] = {"quant_algo": "MXFP8"}
        gate_up = sd[h + "mlp.experts.gate_up_proj"]  # [E, 2I, H]
        down = sd[h + "mlp.experts.down_proj"]  # [E, H, I]
        inter = cfg.intermediate_size
        dgu, ddn = torch.empty_like(gate_up), torch.empty_like(down)
        for e in range(cfg.num_local_experts):
            w1, w3, w2 = gate_up[e, :inter], gate_up[e, inter:], down[e]
            shared_amax = max(float(w1.abs().max()), float(w3.abs().max()))
            for wname, w, amax, rows in (("w1", w1, shared_amax, (0, inter)), ("w3", w3, shared_amax, (inter, 2 * inter)),
                                         ("w2", w2, float(w2.abs().max()), None)):
                packed, scale, gs, d = nvfp4(w, amax)
                base = m + f"experts.{e}.{wname}"
                rel[base + ".weight_packed"] = packed
                rel[base + ".weight_scale"] = scale
                rel[base + ".weight_global_scale"] = gs
                mo[base + ".weight"] = packed
                mo[base + ".weight_scale"] = scale
                mo[base + ".weight_scale_2"] = (1.0 / gs).reshape(())
                mo[base + ".input_scale"] = torch.tensor(1.0, dtype=torch.float32)
                modelopt_layers[base] = {"quant_algo": "NVFP4", "group_size": 16}
                if rows is None:
                    ddn[e] = d
                else:
                    dgu[e, rows[0]:rows[1]] = d
        deq[h + "mlp.experts.gate_up_proj"] = dgu
        deq[h + "mlp.experts.down_proj"] = ddn
    return rel, mo, deq, ignored, modelopt_layers


def release_config(cfg, quant):
    text = {
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim, "rotary_dim": cfg.rotary_dim,
        "partial_rotary_factor": cfg.rope_parameters["partial_rotary_factor"],
        "rope_theta": cfg.rope_parameters["rope_theta"], "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps, "use_gemma_norm": True, "use_qk_norm": True, "qk_norm_type": "per_head",
        "hidden_act": "swigluoai", "swiglu_alpha": cfg.swiglu_alpha, "swiglu_limit": cfg.swiglu_limit,
        "attention_output_gate": False,
        "num_local_experts": cfg.num_local_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
        "intermediate_size": cfg.intermediate_size, "shared_intermediate_size": cfg.shared_intermediate_size,
        "n_shared_experts": 1, "dense_intermediate_size": cfg.dense_intermediate_size,
        "scoring_func": "sigmoid", "use_routing_bias": True, "routed_scaling_factor": cfg.routed_scaling_factor,
        "moe_layer_freq": [1 if t == "sparse" else 0 for t in cfg.mlp_layer_types],
        "sparse_attention_config": {
            "use_sparse_attention": True, "sparse_index_dim": cfg.index_head_dim,
            "sparse_num_index_heads": cfg.index_n_heads, "sparse_topk_blocks": cfg.index_topk_blocks,
            "sparse_block_size": cfg.index_block_size, "sparse_score_type": "max", "sparse_init_block": 0,
            "sparse_local_block": cfg.index_local_blocks,
            "sparse_attention_freq": [1 if t == "minimax_m3_sparse" else 0 for t in cfg.layer_types],
            "sparse_disable_index_value": [1 if t == "minimax_m3_sparse" else 0 for t in cfg.layer_types],
        },
        "num_mtp_modules": 0, "num_nextn_predict_layers": 0,
        "tie_word_embeddings": False, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
        "model_type": "minimax_m3_vl_text",
    }
    return {
        "architectures": ["MiniMaxM3SparseForConditionalGeneration"],
        "model_type": "minimax_m3_vl",
        "text_config": text,
        "vision_config": {"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                          "num_hidden_layers": 1, "num_attention_heads": 2, "patch_size": 14, "image_size": 56,
                          "num_channels": 3},
        "image_token_index": cfg.vocab_size - 6, "video_token_index": cfg.vocab_size - 5,
        "projector_hidden_size": cfg.hidden_size, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "quantization_config": quant,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(min(16, os.cpu_count() or 1))
    seed = 2468
    cfg = gc.text_config(
        num_hidden_layers=4, hidden_size=64, head_dim=32, dense_intermediate_size=96, intermediate_size=32,
        shared_intermediate_size=64, index_head_dim=32, rope_theta=5000000.0,
        layer_types=["minimax_m3_sparse", "full_attention", "minimax_m3_sparse", "minimax_m3_sparse"],
        mlp_layer_types=["dense", "sparse", "sparse", "dense"])
    torch.manual_seed(seed)
    model = hf.MiniMaxM3VLForCausalLM(cfg).float()
    gc.randomize_(model, seed)
    rel, mo, deq, ignored, modelopt_layers = build(model, cfg)
    print("loaded dequantized weights:", model.load_state_dict(deq, strict=True))
    ignored += ["vision_tower", "multi_modal_projector"]

    quant = {"quant_method": "mxfp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [1, 32],
             "scale_fmt": "ue8m0", "moe_quant_algo": "NVFP4", "moe_quant_format": "nvfp4-pack-quantized",
             "ignored_layers": ignored}
    modelopt = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None,
                "producer": {"name": "modelopt"}, "quantized_layers": modelopt_layers,
                "exclude_modules": ignored}
    prompts = gc.random_prompts(seed + 1, [96, 230], cfg.vocab_size)
    for name, tensors, q in (("release-mxfp8-nvfp4", rel, quant), ("release-modelopt-nvfp4", mo, modelopt)):
        print(f"== {name}")
        out = os.path.join(args.out, name)
        os.makedirs(out, exist_ok=True)
        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, "model.safetensors"),
                  metadata={"format": "pt"})
        gc.write_json(os.path.join(out, "config.json"), release_config(cfg, q))
        # The HF config parser must read our release config back to the same text model.
        try:
            parsed = hfc.MiniMaxM3VLConfig(**{k: v for k, v in release_config(cfg, q).items()
                                              if k not in ("quantization_config",)}).text_config
            same = all(getattr(parsed, f) == getattr(cfg, f) for f in (
                "index_head_dim", "index_n_heads", "index_block_size", "index_topk_blocks", "index_local_blocks",
                "layer_types", "mlp_layer_types", "hidden_size", "num_hidden_layers"))
            print("  HF parses release config to the same text config:", same)
        except Exception as e:
            same = f"error: {e!r}"
            print("  HF config parse failed:", e)
        golden = gc.record_reference(model, prompts, out, extra={
            "name": name, "seed": seed, "hf_parses_same_config": same,
            "tensors": gc.tensor_manifest(os.path.join(out, "model.safetensors")),
            "reference": "transformers MiniMaxM3VLForCausalLM fp32 eager cpu on the dequantized weights",
        })
        gc.write_json(os.path.join(out, "golden.json"), golden)


if __name__ == "__main__":
    main()
