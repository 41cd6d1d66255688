#!/usr/bin/env python3
"""Makes the project's bundled small model, models/minimax-m3-tiny/: random weights (no training
yet), vocab 8192 (the tokenizer files are added separately), hidden 256, 4 layers, all layers sparse
attention (M3.1 style) with index_block_size 128 and 16 top-k blocks like the real model, the first
layer dense and the rest MoE. Saved with save_pretrained in bf16 (< 12 MiB).

It also records the Hugging Face reference on the saved bf16 weights, computed in fp32 (golden
logits of the last positions of one prompt and a greedy continuation) and in bf16 (same rows), into
tests/model_golden/data/bundled-tiny/.

Usage (GPU machine): python3 tools/make_bundled_model.py --model-out models/minimax-m3-tiny \
    --golden-out tests/model_golden/data/bundled-tiny
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_common as gc  # noqa: E402
from transformers.models.minimax_m3_vl import modeling_minimax_m3_vl as hf  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-out", required=True)
    ap.add_argument("--golden-out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(min(16, os.cpu_count() or 1))
    seed = 31337
    cfg = gc.text_config(
        vocab_size=8192, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, intermediate_size=32, shared_intermediate_size=32, dense_intermediate_size=128,
        num_local_experts=8, num_experts_per_tok=2, index_n_heads=2, index_head_dim=64, index_block_size=128,
        index_topk_blocks=16, index_local_blocks=1, rope_theta=5000000.0, max_position_embeddings=65536,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
        layer_types=["minimax_m3_sparse"] * 4, mlp_layer_types=["dense", "sparse", "sparse", "sparse"])
    torch.manual_seed(seed)
    model = hf.MiniMaxM3VLForCausalLM(cfg).float()
    gc.randomize_(model, seed)
    model = model.to(torch.bfloat16)
    model.save_pretrained(args.model_out)
    size = sum(os.path.getsize(os.path.join(args.model_out, f)) for f in os.listdir(args.model_out))
    print(f"bundled model: {size / 2**20:.2f} MiB in {args.model_out}")
    if size >= 12 * 2**20:
        print("WARNING: the bundled model must stay under 12 MiB")

    prompts = gc.random_prompts(seed + 1, [200], cfg.vocab_size)
    rows = list(range(-8, 0))
    golden = {}
    for tag, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        m = hf.MiniMaxM3VLForCausalLM.from_pretrained(args.model_out, dtype=dtype, attn_implementation="eager")
        gc.set_eager(m.config)
        golden[tag] = gc.record_reference(m, prompts, args.golden_out, n_greedy=16, logit_rows=rows, tag=tag)
    golden["tensors"] = gc.tensor_manifest(os.path.join(args.model_out, "model.safetensors"))
    golden["reference"] = "transformers MiniMaxM3VLForCausalLM eager cpu on the bf16 checkpoint (fp32 and bf16 compute)"
    gc.write_json(os.path.join(args.golden_out, "golden.json"), golden)


if __name__ == "__main__":
    main()
