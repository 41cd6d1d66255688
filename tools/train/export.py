#!/usr/bin/env python3
"""Exports a train.py checkpoint in the release layout of M3.1 and reads such a directory back.

Export (quantization by tools/make_release_checkpoint.py, imported): `language_model.` tensor
names; attention, indexer, dense MLP and shared experts MXFP8 (E4M3 `weight` + UE8M0
`weight_scale_inv` per 1x32); routed experts NVFP4 compressed-tensors (`weight_packed`,
`weight_scale`, `weight_global_scale`); embeddings, lm_head and norms bf16; router fp32; MiniMax
`quantization_config`. The directory also gets the tokenizer files and generation_config.json.

Read back (`load_release`): every tensor dequantized to fp32 under transformers'
MiniMaxM3VLForCausalLM names, plus the SmallConfig the release config describes. export checks that
this equals the dequantized weights the quantizer reported, and (with transformers present) that
MiniMaxM3VLForCausalLM loads them strictly and survives save_pretrained / from_pretrained.

Usage: python3 tools/train/export.py --ckpt CKPT --tokenizer DIR --out DIR
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import m3small as M  # noqa: E402

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
PREFIX = "language_model."


def dequant_mxfp8(w, scale):
    n, k = w.shape
    return (w.float().reshape(n, k // 32, 32) * torch.exp2(scale.float() - 127)[..., None]).reshape(n, k)


def dequant_nvfp4(packed, scale, global_scale):
    n = packed.shape[0]
    codes = torch.stack([packed & 15, packed >> 4], -1).reshape(n, -1)
    k = codes.shape[1]
    vals = torch.tensor(E2M1)[(codes & 7).long()] * torch.where((codes & 8) != 0, -1.0, 1.0)
    return (vals.reshape(n, k // 16, 16) * scale.float()[..., None] / global_scale.float()).reshape(n, k)


def small_config_from_release(config):
    t = config["text_config"]
    s = t["sparse_attention_config"]
    moe = t["moe_layer_freq"]
    dense_layers = moe.index(1) if 1 in moe else len(moe)
    assert moe == [0] * dense_layers + [1] * (len(moe) - dense_layers), "dense MLP layers must come first"
    assert all(s["sparse_attention_freq"]), "every layer of the small model is sparse"
    eos = t["eos_token_id"]
    return M.SmallConfig(
        vocab_size=t["vocab_size"], hidden_size=t["hidden_size"], num_hidden_layers=t["num_hidden_layers"],
        num_attention_heads=t["num_attention_heads"], num_key_value_heads=t["num_key_value_heads"],
        head_dim=t["head_dim"], partial_rotary_factor=t["partial_rotary_factor"], rope_theta=t["rope_theta"],
        dense_layers=dense_layers, dense_intermediate_size=t["dense_intermediate_size"],
        intermediate_size=t["intermediate_size"], shared_intermediate_size=t["shared_intermediate_size"],
        num_local_experts=t["num_local_experts"], num_experts_per_tok=t["num_experts_per_tok"],
        routed_scaling_factor=t["routed_scaling_factor"], swiglu_alpha=t["swiglu_alpha"],
        swiglu_limit=t["swiglu_limit"], index_head_dim=s["sparse_index_dim"], index_block_size=s["sparse_block_size"],
        index_topk_blocks=s["sparse_topk_blocks"], index_local_blocks=s["sparse_local_block"],
        rms_norm_eps=t["rms_norm_eps"], max_position_embeddings=t["max_position_embeddings"],
        bos_token_id=t["bos_token_id"], eos_token_id=eos[0] if isinstance(eos, list) else eos,
        pad_token_id=config.get("pad_token_id", 0))


def load_release(model_dir):
    """(SmallConfig, fp32 state dict with MiniMaxM3VLForCausalLM names) of a release directory."""
    from safetensors.torch import load_file
    config = json.load(open(os.path.join(model_dir, "config.json")))
    cfg = small_config_from_release(config)
    t = load_file(os.path.join(model_dir, "model.safetensors"))
    used = set()

    def take(name):
        used.add(name)
        return t[name]

    def linear(name):
        if name + ".weight_scale_inv" in t:
            return dequant_mxfp8(take(name + ".weight"), take(name + ".weight_scale_inv"))
        return take(name + ".weight").float()

    sd = {"model.embed_tokens.weight": take(PREFIX + "model.embed_tokens.weight").float(),
          "model.norm.weight": take(PREFIX + "model.norm.weight").float(),
          "lm_head.weight": take(PREFIX + "lm_head.weight").float()}
    for i in range(cfg.num_hidden_layers):
        r, h = f"{PREFIX}model.layers.{i}.", f"model.layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm"):
            sd[h + n + ".weight"] = take(r + n + ".weight").float()
        for p in ("q", "k", "v", "o"):
            sd[h + f"self_attn.{p}_proj.weight"] = linear(r + f"self_attn.{p}_proj")
        for p in ("q", "k"):
            sd[h + f"self_attn.indexer.{p}_proj.weight"] = linear(r + f"self_attn.index_{p}_proj")
            sd[h + f"self_attn.indexer.{p}_norm.weight"] = take(r + f"self_attn.index_{p}_norm.weight").float()
        if cfg.mlp_layer_types[i] == "dense":
            sd[h + "mlp.gate_up_proj.weight"] = torch.cat([linear(r + "mlp.gate_proj"), linear(r + "mlp.up_proj")])
            sd[h + "mlp.down_proj.weight"] = linear(r + "mlp.down_proj")
            continue
        m = r + "block_sparse_moe."
        sd[h + "mlp.gate.weight"] = take(m + "gate.weight").float()
        sd[h + "mlp.gate.e_score_correction_bias"] = take(m + "e_score_correction_bias").float()
        sd[h + "mlp.shared_experts.gate_up_proj.weight"] = torch.cat(
            [linear(m + "shared_experts.gate_proj"), linear(m + "shared_experts.up_proj")])
        sd[h + "mlp.shared_experts.down_proj.weight"] = linear(m + "shared_experts.down_proj")
        gate_up, down = [], []
        for e in range(cfg.num_local_experts):
            w = {}
            for wn in ("w1", "w2", "w3"):
                b = m + f"experts.{e}.{wn}"
                w[wn] = dequant_nvfp4(take(b + ".weight_packed"), take(b + ".weight_scale"),
                                      take(b + ".weight_global_scale"))
            gate_up.append(torch.cat([w["w1"], w["w3"]]))
            down.append(w["w2"])
        sd[h + "mlp.experts.gate_up_proj"] = torch.stack(gate_up)
        sd[h + "mlp.experts.down_proj"] = torch.stack(down)
    unused = sorted(set(t) - used)
    assert not unused, f"{model_dir}: tensors not understood: {unused[:5]}"
    return cfg, sd


def hf_model(cfg, sd):
    """transformers' MiniMaxM3VLForCausalLM (fp32, eager) holding sd."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import golden_common as gc
    from transformers.models.minimax_m3_vl import modeling_minimax_m3_vl as hf
    model = hf.MiniMaxM3VLForCausalLM(gc.text_config(**cfg.hf_kwargs())).float()
    model.load_state_dict(sd, strict=True)
    return model.eval()


def export(ckpt_path, tokenizer_dir, out):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import golden_common as gc
    import make_release_checkpoint as mrc
    ck = torch.load(ckpt_path, map_location="cpu")
    cfg = M.SmallConfig(**ck["config"])
    model = M.SmallM3(cfg)
    model.load_state_dict(ck["state_dict"])
    hf_cfg = gc.text_config(**cfg.hf_kwargs())
    rel, _, deq, ignored, _ = mrc.build(model, hf_cfg)
    quant = {"quant_method": "mxfp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [1, 32],
             "scale_fmt": "ue8m0", "moe_quant_algo": "NVFP4", "moe_quant_format": "nvfp4-pack-quantized",
             "ignored_layers": ignored}
    config = mrc.release_config(hf_cfg, quant)
    tok_config = json.load(open(os.path.join(tokenizer_dir, "tokenizer_config.json")))
    vocab = json.load(open(os.path.join(tokenizer_dir, "tokenizer.json")))
    added = {a["content"]: a["id"] for a in vocab["added_tokens"]}
    config["image_token_index"] = added["]<]image[>["]
    config["video_token_index"] = added["]<]video[>["]
    config["pad_token_id"] = cfg.pad_token_id
    os.makedirs(out, exist_ok=True)
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in rel.items()}, os.path.join(out, "model.safetensors"),
              metadata={"format": "pt"})
    gc.write_json(os.path.join(out, "config.json"), config)
    gc.write_json(os.path.join(out, "generation_config.json"), {
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id,
        "do_sample": False})
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_dir, f), os.path.join(out, f))
    assert added[tok_config["eos_token"]] == cfg.eos_token_id

    # Read back: the files must hold exactly the quantizer's dequantized weights.
    cfg2, sd = load_release(out)
    assert cfg2 == cfg, f"release config reads back as {cfg2}, trained {cfg}"
    worst = max(float((sd[k] - deq[k].float()).abs().max()) for k in deq)
    assert set(sd) == set(deq) and worst == 0.0, f"read-back differs from the quantizer's weights by {worst}"
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"export: {len(rel)} tensors, {size / 2**20:.2f} MiB in {out}; read-back exact")
    try:
        hf = hf_model(cfg, sd)
        with tempfile.TemporaryDirectory() as tmp:
            hf.save_pretrained(tmp)
            from transformers.models.minimax_m3_vl import modeling_minimax_m3_vl as hfm
            again = hfm.MiniMaxM3VLForCausalLM.from_pretrained(tmp, dtype=torch.float32)
            same = all(torch.equal(a, b) for a, b in zip(hf.state_dict().values(), again.state_dict().values()))
        print(f"export: transformers MiniMaxM3VLForCausalLM loads the dequantized weights strictly; "
              f"save_pretrained/from_pretrained round trip identical: {same}")
    except ImportError as e:
        print(f"export: transformers check skipped ({e})")
    return size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-mib", type=float, default=40.0)
    args = ap.parse_args()
    size = export(args.ckpt, args.tokenizer, args.out)
    if size > args.max_mib * 2**20:
        raise SystemExit(f"the model directory is {size / 2**20:.1f} MiB, over {args.max_mib} MiB")


if __name__ == "__main__":
    main()
