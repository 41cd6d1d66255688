#!/usr/bin/env python3
"""Makes the tiny random MiniMax-M3 checkpoints of the CPU golden tests and records the Hugging Face
reference (transformers 5.17, fp32, eager attention, CPU) on them.

Each model is saved with save_pretrained (fp32 safetensors), reloaded with from_pretrained, and the
reloaded model's outputs are recorded (so the fixture describes exactly what is on disk).
Configs: mixed full/sparse attention and dense/MoE layers, index_block_size 8 with top-4 blocks so
sparsity bites beyond 32 tokens, partial RoPE 0.5; one config with index_local_blocks 2, an index
head dim smaller than the rotary dim and a small swiglu_limit (clamps bite); one VL wrapper.

Usage (GPU machine): python3 tools/make_golden_models.py --out tests/model_golden/data
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_common as gc  # noqa: E402
from transformers.models.minimax_m3_vl import modeling_minimax_m3_vl as hf  # noqa: E402
from transformers.models.minimax_m3_vl import configuration_minimax_m3_vl as hfc  # noqa: E402

PROMPT_LENGTHS = [75, 160, 290]


def make_text(name, out_root, seed, cfg, gain=1.0):
    print(f"== {name}")
    out = os.path.join(out_root, name)
    torch.manual_seed(seed)
    model = hf.MiniMaxM3VLForCausalLM(cfg).float()
    gc.randomize_(model, seed, gain)
    model.save_pretrained(out)
    reloaded = hf.MiniMaxM3VLForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    gc.set_eager(reloaded.config)
    prompts = gc.random_prompts(seed + 1, PROMPT_LENGTHS, cfg.vocab_size)
    reload_diff = gc.max_logit_diff(model, reloaded, prompts[:1])
    print(f"  reload max logit diff {reload_diff}")
    golden = gc.record_reference(reloaded, prompts, out, extra={
        "name": name, "seed": seed, "reload_max_logit_diff": reload_diff,
        "tensors": gc.tensor_manifest(os.path.join(out, "model.safetensors")),
        "reference": "transformers MiniMaxM3VLForCausalLM fp32 eager cpu",
    })
    gc.write_json(os.path.join(out, "golden.json"), golden)


def make_vl(name, out_root, seed):
    """The VL wrapper (model_type minimax_m3_vl, text under text_config) with a tiny vision tower."""
    print(f"== {name}")
    out = os.path.join(out_root, name)
    text = gc.text_config(num_hidden_layers=3, layer_types=["minimax_m3_sparse", "full_attention", "minimax_m3_sparse"],
                          mlp_layer_types=["sparse", "dense", "sparse"]).to_dict()
    for k in ("model_type", "transformers_version", "architectures", "_attn_implementation_autoset"):
        text.pop(k, None)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  patch_size=14, image_size=56, temporal_patch_size=2, spatial_merge_size=2)
    cfg = hfc.MiniMaxM3VLConfig(text_config=text, vision_config=vision, projector_hidden_size=64,
                                image_token_index=250, video_token_index=251)
    gc.set_eager(cfg)
    gc.set_eager(cfg.text_config)
    torch.manual_seed(seed)
    model = hf.MiniMaxM3SparseForConditionalGeneration(cfg).float()
    gc.randomize_(model, seed)
    model.save_pretrained(out)
    reloaded = hf.MiniMaxM3SparseForConditionalGeneration.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager")
    gc.set_eager(reloaded.config)
    gc.set_eager(reloaded.config.text_config)
    prompts = gc.random_prompts(seed + 1, [120], 250)
    reload_diff = gc.max_logit_diff(model, reloaded, prompts)
    golden = gc.record_reference(reloaded, prompts, out, n_greedy=12, extra={
        "name": name, "seed": seed, "reload_max_logit_diff": reload_diff,
        "tensors": gc.tensor_manifest(os.path.join(out, "model.safetensors")),
        "reference": "transformers MiniMaxM3SparseForConditionalGeneration fp32 eager cpu (text only)",
    })
    gc.write_json(os.path.join(out, "golden.json"), golden)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(min(16, os.cpu_count() or 1))
    os.makedirs(args.out, exist_ok=True)

    # A: mixed attention and MLP kinds, local 1, index dim == rotary dims of the main heads * 2.
    make_text("tiny-mixed", args.out, 1234, gc.text_config(
        layer_types=["full_attention", "minimax_m3_sparse", "minimax_m3_sparse", "full_attention"],
        mlp_layer_types=["dense", "sparse", "dense", "sparse"]))
    # B: all sparse (M3.1 style), local 2, index_head_dim 16 < rotary 32 (truncated indexer RoPE),
    # one KV head (GQA 4), small swiglu_limit so the clamps bite, routed scaling 2.5.
    make_text("tiny-sparse-local2", args.out, 4321, gc.text_config(
        num_hidden_layers=3, head_dim=64, num_key_value_heads=1, index_n_heads=1, index_head_dim=16,
        index_local_blocks=2, index_topk_blocks=5, swiglu_limit=0.75, routed_scaling_factor=2.5,
        num_experts_per_tok=3, rope_theta=5000000.0,
        layer_types=["minimax_m3_sparse"] * 3, mlp_layer_types=["dense", "sparse", "sparse"]), gain=1.5)
    try:
        make_vl("tiny-vl", args.out, 777)
    except Exception as e:  # recorded so the gap is documented, never silently skipped
        import traceback
        traceback.print_exc()
        os.makedirs(os.path.join(args.out, "tiny-vl"), exist_ok=True)
        with open(os.path.join(args.out, "tiny-vl", "FAILED.txt"), "w") as f:
            f.write(f"VL wrapper could not be built with a tiny vision config: {e!r}\n")


if __name__ == "__main__":
    main()
