#!/usr/bin/env python3
"""The DSpark drafter of the bundled small model: PyTorch reference, training, export, evaluation.

What a DSpark drafter computes (the M3.1 drafter's contract, docs/speculative-decoding.md):
  - context: for each committed token t, the target's residual stream after the layers
    `dspark_target_layer_ids` (tap k = output of layer k, 0-based), concatenated -> fc ->
    hidden_norm (Gemma RMSNorm) = c_t. Each drafter layer's K/V of token t come from c_t through
    that layer's k_proj (then k_norm and RoPE at t) and v_proj: the drafter's own KV cache.
  - block: a request whose last committed token sits at position p and whose last sampled token
    (the anchor, not yet run by the target) is a: queries at positions p+1 .. p+N hold [a, noise,
    ..., noise] (N = dspark_block_size; noise = dspark_noise_token_id), embedded by the target's
    embed_tokens. Each layer: input_layernorm -> q/k/v (q_norm, k_norm, partial NeoX RoPE) ->
    attention of every block query over the context keys in its window (k_pos >= q_pos -
    (sliding_window - 1), k_pos <= p) and over all N block keys (non-causal) -> o_proj, residual
    -> post_attention_layernorm -> SwiGLU-OAI MLP, residual. Then norm -> the target's lm_head:
    base logits of query j, which predicts the token at position p+2+j.
  - Markov head (rank r): logits_j = base_j + w2 @ w1[prev_j], prev_0 = a, prev_j = draft j-1,
    applied in order (greedy: the argmax; probabilistic: a draw).
  - confidence head: sigmoid(proj([h_j, w1[prev_j]]) + bias), h_j the normed hidden of query j:
    the drafter's estimate that draft j is kept.

Commands (on the GPU machine; the target is models/minimax-m3-small):
  python3 tools/train/dspark.py train --tokens W/tokens --out DIR [--seconds 420]
  python3 tools/train/dspark.py eval --draft models/minimax-m3-small/dspark --tokens W/tokens
  python3 tools/train/dspark.py fixture --draft models/minimax-m3-small/dspark --tokens W/tokens \
      --out tests/model_small/dspark_reference.json
"""
import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import m3small as M  # noqa: E402
import export as E  # noqa: E402

PREFIX = "language_model.model.dspark."
TARGET = "models/minimax-m3-small"


@dataclass
class DraftConfig:
    vocab_size: int = 8192
    hidden_size: int = 384
    num_hidden_layers: int = 1
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 768
    partial_rotary_factor: float = 0.5
    rope_theta: float = 5000000.0
    rms_norm_eps: float = 1e-6
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    max_position_embeddings: int = 8192
    sliding_window: int = 2048
    target_layer_ids: list = field(default_factory=lambda: [1, 4, 7])
    block_size: int = 7
    noise_token_id: int = 8188
    markov_rank: int = 16

    @property
    def rotary_dim(self):
        return int(self.head_dim * self.partial_rotary_factor)

    def release_config(self):
        """dspark/config.json, in the M3.1 drafter's vocabulary (DSparkMiniMaxDraftModel)."""
        return {
            "architectures": ["DSparkMiniMaxDraftModel"], "model_type": "minimax_m3_dspark",
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size, "hidden_act": "swigluoai",
            "swiglu_alpha": self.swiglu_alpha, "swiglu_limit": self.swiglu_limit,
            "partial_rotary_factor": self.partial_rotary_factor, "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps, "max_position_embeddings": self.max_position_embeddings,
            "layer_types": ["sliding_attention"] * self.num_hidden_layers, "sliding_window": self.sliding_window,
            "moe_layer_freq": [0] * self.num_hidden_layers, "sparse_attention_config": None,
            "dspark_target_layer_ids": list(self.target_layer_ids), "dspark_block_size": self.block_size,
            "dspark_noise_token_id": self.noise_token_id, "dspark_markov_rank": self.markov_rank,
            "confidence_head_with_markov": True, "tie_word_embeddings": False,
            "quantization_config": {"quant_method": "mxfp8", "fmt": "e4m3", "weight_block_size": [1, 32],
                                    "scale_fmt": "ue8m0", "activation_scheme": "dynamic"},
        }

    @staticmethod
    def from_release(cfg):
        return DraftConfig(
            vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=cfg["num_attention_heads"], num_key_value_heads=cfg["num_key_value_heads"],
            head_dim=cfg["head_dim"], intermediate_size=cfg["intermediate_size"],
            partial_rotary_factor=cfg["partial_rotary_factor"], rope_theta=cfg["rope_theta"],
            rms_norm_eps=cfg["rms_norm_eps"], swiglu_alpha=cfg["swiglu_alpha"], swiglu_limit=cfg["swiglu_limit"],
            max_position_embeddings=cfg["max_position_embeddings"], sliding_window=cfg["sliding_window"],
            target_layer_ids=list(cfg["dspark_target_layer_ids"]), block_size=cfg["dspark_block_size"],
            noise_token_id=cfg["dspark_noise_token_id"], markov_rank=cfg["dspark_markov_rank"])


class DraftLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, d = c.hidden_size, c.head_dim
        self.input_layernorm = M.Norm(h)
        self.post_attention_layernorm = M.Norm(h)
        self.self_attn = nn.Module()
        a = self.self_attn
        a.q_proj = nn.Linear(h, c.num_attention_heads * d, bias=False)
        a.k_proj = nn.Linear(h, c.num_key_value_heads * d, bias=False)
        a.v_proj = nn.Linear(h, c.num_key_value_heads * d, bias=False)
        a.o_proj = nn.Linear(c.num_attention_heads * d, h, bias=False)
        a.q_norm = M.Norm(d)
        a.k_norm = M.Norm(d)
        self.mlp = M.DenseMlp(h, c.intermediate_size)


class DSparkDraft(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.config = c
        h = c.hidden_size
        self.fc = nn.Linear(len(c.target_layer_ids) * h, h, bias=False)
        self.hidden_norm = M.Norm(h)
        self.layers = nn.ModuleList([DraftLayer(c) for _ in range(c.num_hidden_layers)])
        self.norm = M.Norm(h)
        self.markov_head = nn.Module()
        self.markov_head.w1 = nn.Embedding(c.vocab_size, c.markov_rank)
        self.markov_head.w2 = nn.Linear(c.markov_rank, c.vocab_size, bias=False)
        self.confidence_head = nn.Module()
        self.confidence_head.proj = nn.Linear(h + c.markov_rank, 1, bias=True)

    def init_weights(self, seed):
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.zeros_(p)
            elif "markov_head.w2" in name or name.endswith("bias"):
                nn.init.zeros_(p)
            else:
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=g) * (0.02 if p.dim() < 2 else 1.0 / math.sqrt(p.shape[-1])))


# ----------------------------------------------------------------------------------------------
# The target's side: taps and logits of a batch of windows

def target_features(target, ids, tap_ids, o: M.ForwardOptions):
    """ids [B, T] -> (taps [B, T, n * H] (layer outputs, residual stream), logits [B, T, V])."""
    c = target.config
    cos, sin = M.rope_tables(c, ids.shape[1], ids.device)
    x = target.model.embed_tokens(ids)
    if o.emulate is not None:
        x = x.float()
    taps, aux = [], {}
    for i, layer in enumerate(target.model.layers):
        h = M.rms_norm(x, layer.input_layernorm.weight, c.rms_norm_eps)
        x = x + M.attention_block(layer.self_attn, h, cos, sin, c, o, aux)
        h = M.rms_norm(x, layer.post_attention_layernorm.weight, c.rms_norm_eps)
        x = x + (M.dense_mlp(layer.mlp, h, c) if isinstance(layer.mlp, M.DenseMlp) else M.moe(layer.mlp, h, c, aux))
        if i in tap_ids:
            taps.append(x)
    logits = target.lm_head(M.rms_norm(x, target.model.norm.weight, c.rms_norm_eps))
    return torch.cat(taps, -1), logits


# ----------------------------------------------------------------------------------------------
# The drafter's forward over blocks

def context_kv(layer, ctx, pos_cos, pos_sin, c):
    """Context features [B, T, H] -> K [B, G, T, D] (k_norm, RoPE), V [B, G, T, D] of one layer."""
    b, t, _ = ctx.shape
    a = layer.self_attn
    k = M.rms_norm(a.k_proj(ctx).view(b, t, c.num_key_value_heads, c.head_dim), a.k_norm.weight, c.rms_norm_eps)
    k = M.apply_rope(k.transpose(1, 2), pos_cos, pos_sin)
    v = a.v_proj(ctx).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
    return k, v


def draft_hidden(draft, embed, ctx, block_ids, anchor_pos):
    """The drafter's normed hidden states of M blocks per row.

    ctx [B, T, H]: the context features of positions 0..T-1 (hidden_norm(fc(taps))).
    block_ids [B, M, N]: each block's query tokens (anchor, then noise).
    anchor_pos [B, M]: p + 1, the anchor's position; block m sees context positions <= p.
    Returns [B, M, N, H]."""
    c = draft.config
    b, m, n = block_ids.shape
    t = ctx.shape[1]
    dev = ctx.device
    q_pos = anchor_pos[:, :, None] + torch.arange(n, device=dev)  # [B, M, N]
    cos_t, sin_t = M.rope_tables(c, max(t, int(q_pos.max()) + 1), dev)
    # Masks over keys [T context | M * N block]: context keys at or before p within the window;
    # block keys of the same block.
    k_pos = torch.arange(t, device=dev)
    qp = q_pos.reshape(b, m * n)[:, :, None]
    p = (anchor_pos - 1)[:, :, None].expand(b, m, n).reshape(b, m * n)[:, :, None]
    ctx_mask = (k_pos[None, None, :] <= p) & (k_pos[None, None, :] >= qp - (c.sliding_window - 1))
    blk = torch.arange(m, device=dev)[:, None].expand(m, n).reshape(m * n)
    blk_mask = (blk[:, None] == blk[None, :])[None].expand(b, -1, -1)
    mask = torch.cat([ctx_mask, blk_mask], -1)[:, None]  # [B, 1, M*N, T + M*N]

    x = embed(block_ids).reshape(b, m * n, -1).to(ctx.dtype)
    qcos, qsin = cos_t[q_pos.reshape(b, m * n)][:, None], sin_t[q_pos.reshape(b, m * n)][:, None]
    hq, g, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    for layer in draft.layers:
        a = layer.self_attn
        kc, vc = context_kv(layer, ctx, cos_t[:t], sin_t[:t], c)
        h = M.rms_norm(x, layer.input_layernorm.weight, c.rms_norm_eps)
        q = M.rms_norm(a.q_proj(h).view(b, m * n, hq, d), a.q_norm.weight, c.rms_norm_eps).transpose(1, 2)
        k = M.rms_norm(a.k_proj(h).view(b, m * n, g, d), a.k_norm.weight, c.rms_norm_eps).transpose(1, 2)
        v = a.v_proj(h).view(b, m * n, g, d).transpose(1, 2)
        q, k = M.apply_rope(q, qcos, qsin), M.apply_rope(k, qcos, qsin)
        kk = torch.cat([kc, k], 2).repeat_interleave(hq // g, dim=1)
        vv = torch.cat([vc, v], 2).repeat_interleave(hq // g, dim=1)
        out = M.sdpa(q, kk, vv, attn_mask=mask)
        x = x + a.o_proj(out.transpose(1, 2).reshape(b, m * n, hq * d))
        h = M.rms_norm(x, layer.post_attention_layernorm.weight, c.rms_norm_eps)
        x = x + M.dense_mlp(layer.mlp, h, c)
    return M.rms_norm(x, draft.norm.weight, c.rms_norm_eps).reshape(b, m, n, -1)


def context_features(draft, taps):
    c = draft.config
    return M.rms_norm(draft.fc(taps.to(draft.fc.weight.dtype)), draft.hidden_norm.weight, c.rms_norm_eps)


def markov_logits(draft, prev):
    return draft.markov_head.w2(draft.markov_head.w1(prev))


def confidence(draft, hidden, prev):
    return torch.sigmoid(draft.confidence_head.proj(torch.cat([hidden, draft.markov_head.w1(prev).to(hidden.dtype)], -1)).float())[..., 0]


@torch.no_grad()
def propose_greedy(draft, target, hidden_states_ctx, anchor, anchor_pos, lm_head):
    """Greedy drafts of one block per row: ctx [B, T, H] (positions < anchor_pos valid), anchor
    [B], anchor_pos [B] -> (drafts [B, N], base logits [B, N, V], confidence [B, N])."""
    c = draft.config
    b = anchor.shape[0]
    ids = torch.full((b, 1, c.block_size), c.noise_token_id, dtype=torch.long, device=anchor.device)
    ids[:, 0, 0] = anchor
    hid = draft_hidden(draft, target.model.embed_tokens, hidden_states_ctx, ids, anchor_pos[:, None])[:, 0]
    base = lm_head(hid).float()
    drafts, conf, prev = [], [], anchor
    for j in range(c.block_size):
        logits = base[:, j] + markov_logits(draft, prev).float()
        conf.append(confidence(draft, hid[:, j], prev))
        prev = logits.argmax(-1)
        drafts.append(prev)
    return torch.stack(drafts, 1), base, torch.stack(conf, 1)


# ----------------------------------------------------------------------------------------------
# Training

def load_target(device):
    cfg, sd = E.load_release(TARGET)
    target = M.SmallM3(cfg)
    target.load_state_dict(sd)
    return target.to(device).eval().requires_grad_(False)


def block_batch(ids, c, blocks, gen):
    """Random blocks of windows ids [B, T]: anchor positions [B, M] (p + 1 >= 1), their query ids
    [B, M, N] and labels [B, M, N] (the token at p + 2 + j)."""
    b, t = ids.shape
    n = c.block_size
    anchor_pos = torch.randint(1, t - n, (b, blocks), generator=gen, device=ids.device)
    q = torch.full((b, blocks, n), c.noise_token_id, dtype=torch.long, device=ids.device)
    q[:, :, 0] = ids.gather(1, anchor_pos)
    lab_pos = anchor_pos[:, :, None] + 1 + torch.arange(n, device=ids.device)
    labels = ids.gather(1, lab_pos.reshape(b, -1)).reshape(b, blocks, n)
    prev_pos = lab_pos - 1
    prev = ids.gather(1, prev_pos.reshape(b, -1)).reshape(b, blocks, n)  # teacher forcing: the true previous token
    return anchor_pos, q, labels, prev, lab_pos


def train(args):
    dev = "cuda"
    torch.manual_seed(args.seed)
    target = load_target(dev).bfloat16()
    tc = target.config
    c = DraftConfig(vocab_size=tc.vocab_size, hidden_size=tc.hidden_size, rope_theta=tc.rope_theta,
                    rms_norm_eps=tc.rms_norm_eps, swiglu_alpha=tc.swiglu_alpha, swiglu_limit=tc.swiglu_limit,
                    max_position_embeddings=tc.max_position_embeddings,
                    target_layer_ids=[int(x) for x in args.taps.split(",")], block_size=args.block,
                    markov_rank=args.rank, intermediate_size=args.intermediate, num_hidden_layers=args.layers)
    draft = DSparkDraft(c)
    draft.init_weights(args.seed)
    draft = draft.to(dev)
    tokens = torch.from_numpy(np.load(os.path.join(args.tokens, "train.npy")).astype(np.int64)).to(dev)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    opt = torch.optim.AdamW(draft.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    o = M.ForwardOptions(attention="sparse")
    log = open(os.path.join(args.out, "dspark_train_log.jsonl"), "w")
    start, step = time.time(), 0
    while True:
        elapsed = time.time() - start
        if elapsed > args.seconds:
            break
        frac = elapsed / args.seconds
        lr = args.lr * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for gp in opt.param_groups:
            gp["lr"] = lr
        off = torch.randint(0, tokens.numel() - args.seq, (args.batch,), generator=gen, device=dev)
        ids = tokens[off[:, None] + torch.arange(args.seq, device=dev)]
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            taps, tlogits = target_features(target, ids, set(c.target_layer_ids), o)
        anchor_pos, q, labels, prev, lab_pos = block_batch(ids, c, args.blocks, gen)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ctx = context_features(draft, taps.float())
            hid = draft_hidden(draft, target.model.embed_tokens, ctx, q, anchor_pos)
            logits = (target.lm_head(hid.to(target.lm_head.weight.dtype)).float() + markov_logits(draft, prev).float())
        # Soft labels: the target's distribution at the query's predicted position (given the true
        # prefix), mixed with the data's token.
        tl = tlogits.float().gather(1, (lab_pos - 1).reshape(args.batch, -1)[:, :, None].expand(-1, -1, tlogits.shape[-1]))
        tl = tl.reshape(logits.shape)
        logp = F.log_softmax(logits, -1)
        kl = (F.softmax(tl, -1) * (F.log_softmax(tl, -1) - logp)).sum(-1).mean()
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        hit = (logits.argmax(-1) == tl.argmax(-1)).float()
        conf = confidence(draft, hid.float(), prev)
        bce = F.binary_cross_entropy(conf.clamp(1e-6, 1 - 1e-6), hit)
        loss = kl + args.ce_weight * ce + 0.1 * bce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 50 == 0:
            rec = {"step": step, "elapsed": round(elapsed, 1), "lr": lr, "kl": round(float(kl), 4),
                   "ce": round(float(ce), 4), "bce": round(float(bce), 4),
                   "top1_per_pos": [round(float(x), 3) for x in hit.mean((0, 1))]}
            print(json.dumps(rec), flush=True)
            log.write(json.dumps(rec) + "\n")
    torch.save({"config": asdict(c), "state_dict": draft.state_dict()}, os.path.join(args.out, "dspark.pt"))
    export_draft(draft, os.path.join(args.out, "dspark"))
    return draft


# ----------------------------------------------------------------------------------------------
# Export and read-back (MXFP8 linears as the M3.1 drafter; norms, Markov and confidence heads bf16)

def export_draft(draft, out):
    import make_release_checkpoint as mrc
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    t = {}
    sd = {k: v.detach().float().cpu() for k, v in draft.state_dict().items()}
    for k, v in sd.items():
        if k.endswith("mlp.gate_up_proj.weight"):
            gate, up = v.chunk(2, 0)
            for name, w in (("gate_proj", gate), ("up_proj", up)):
                q, s, _ = mrc.mxfp8(w.contiguous())
                base = PREFIX + k.replace("gate_up_proj.weight", name)
                t[base + ".weight"], t[base + ".weight_scale_inv"] = q, s
        elif v.dim() == 2 and "_proj" in k and "confidence" not in k or k == "fc.weight":
            q, s, _ = mrc.mxfp8(v.contiguous())
            t[PREFIX + k], t[PREFIX + k[:-len("weight")] + "weight_scale_inv"] = q, s
        elif k == "markov_head.w1.weight" or k == "markov_head.w2.weight":
            t[PREFIX + k] = v.bfloat16()  # both [V, r]: w2 is stored as the [V, r] matrix it multiplies by
        else:
            t[PREFIX + k] = v.bfloat16() if not k.startswith("confidence_head") else v.float()
    save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(draft.config.release_config(), f, indent=1)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"dspark export: {len(t)} tensors, {size / 2**20:.2f} MiB in {out}")


def load_draft(path, device):
    """The exported drafter, dequantized (exactly what m3serve reads), in fp32."""
    from safetensors.torch import load_file
    cfg = DraftConfig.from_release(json.load(open(os.path.join(path, "config.json"))))
    t = load_file(os.path.join(path, "model.safetensors"))
    draft = DSparkDraft(cfg)
    sd = {}
    for k in draft.state_dict():
        if k.endswith("mlp.gate_up_proj.weight"):
            parts = []
            for name in ("gate_proj", "up_proj"):
                base = PREFIX + k.replace("gate_up_proj.weight", name)
                parts.append(E.dequant_mxfp8(t[base + ".weight"], t[base + ".weight_scale_inv"]))
            sd[k] = torch.cat(parts)
        elif PREFIX + k[:-len("weight")] + "weight_scale_inv" in t:
            sd[k] = E.dequant_mxfp8(t[PREFIX + k], t[PREFIX + k[:-len("weight")] + "weight_scale_inv"])
        else:
            sd[k] = t[PREFIX + k].float()
    draft.load_state_dict(sd)
    return draft.to(device).eval().requires_grad_(False)


# ----------------------------------------------------------------------------------------------
# Evaluation: acceptance length on the target's own greedy continuations of held-out text

@torch.no_grad()
def evaluate(args):
    dev = "cuda"
    target = load_target(dev)
    draft = load_draft(args.draft, dev)
    c = draft.config
    held = torch.from_numpy(np.load(os.path.join(args.tokens, "heldout.npy")).astype(np.int64)).to(dev)
    gen = torch.Generator(device=dev).manual_seed(1)
    o = M.ForwardOptions(attention="sparse")
    rows, prompt, cont = args.rows, 192, 256
    off = torch.randint(0, held.numel() - prompt, (rows,), generator=gen, device=dev)
    prefix = held[off[:, None] + torch.arange(prompt, device=dev)]
    out = M.generate(target, prefix, cont, M.ForwardOptions(attention="dense"))  # within 4 x 128: MSA selects all
    seq = torch.cat([prefix, out], 1)
    taps, logits = target_features(target, seq, set(c.target_layer_ids), o)
    greedy_next = logits.argmax(-1)  # the target's greedy token after each position
    ctx = context_features(draft, taps)
    res = {}
    for k in (3, 7):
        kept_total, steps, per_pos = 0, 0, [0] * k
        for a in range(prompt, prompt + cont - k - 2, 5):
            anchor_pos = torch.full((rows,), a, device=dev)
            drafts, _, _ = propose_greedy(draft, target, ctx, seq[:, a], anchor_pos, target.lm_head)
            want = greedy_next[:, a:a + k]  # the target's greedy tokens at positions a+1 .. a+k
            ok = (drafts[:, :k] == want).long().cumprod(1)
            kept = ok.sum(1)
            kept_total += int(kept.sum())
            steps += rows
            for j in range(k):
                per_pos[j] += int(ok[:, j].sum())
        res[f"k{k}"] = {"mean_acceptance_length": round(1 + kept_total / steps, 3),
                        "per_position": [round(x / steps, 3) for x in per_pos]}
    print(json.dumps(res))
    if args.out:
        json.dump(res, open(args.out, "w"), indent=1)
    return res


# ----------------------------------------------------------------------------------------------
# The reference m3serve's drafter is checked against (fp32, the engine's f32 numerics)

@torch.no_grad()
def fixture(args):
    dev = "cuda"
    target = load_target(dev)
    draft = load_draft(args.draft, dev)
    c = draft.config
    held = np.load(os.path.join(args.tokens, "heldout.npy")).astype(np.int64)
    o = M.ForwardOptions(attention="sparse", emulate="f32")
    cases = []
    for i, (start, length) in enumerate([(100, 40), (5000, 150), (20000, 300), (40000, 520)]):
        ids = torch.tensor(held[start:start + length], device=dev)[None]
        taps, _ = target_features(target, ids[:, :-1], set(c.target_layer_ids), o)
        ctx = context_features(draft, taps.float())
        anchor_pos = torch.tensor([length - 1], device=dev)
        drafts, base, conf = propose_greedy(draft, target, ctx, ids[:, -1], anchor_pos, target.lm_head)
        top = base[0].topk(8, -1)
        cases.append({"prompt": ids[0].tolist(), "drafts": drafts[0].tolist(),
                      "confidence": [round(float(x), 6) for x in conf[0]],
                      "base_top_ids": top.indices.tolist(), "base_top_logits": [[float(x) for x in r] for r in top.values],
                      "base_logsumexp": [float(x) for x in torch.logsumexp(base[0], -1)]})
    json.dump({"note": "tools/train/dspark.py fixture: the drafter's block after each prompt (the last id is the "
                       "anchor; the target ran the rest with f32 numerics and MSA)", "cases": cases},
              open(args.out, "w"))
    print(f"fixture: {len(cases)} cases -> {args.out}")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--tokens", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--seconds", type=float, default=420)
    t.add_argument("--seed", type=int, default=1)
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--seq", type=int, default=1024)
    t.add_argument("--blocks", type=int, default=48)
    t.add_argument("--block", type=int, default=7)
    t.add_argument("--taps", default="1,4,7")
    t.add_argument("--rank", type=int, default=16)
    t.add_argument("--intermediate", type=int, default=768)
    t.add_argument("--layers", type=int, default=1)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--ce-weight", type=float, default=0.3)
    e = sub.add_parser("eval")
    e.add_argument("--draft", required=True)
    e.add_argument("--tokens", required=True)
    e.add_argument("--rows", type=int, default=64)
    e.add_argument("--out")
    f = sub.add_parser("fixture")
    f.add_argument("--draft", required=True)
    f.add_argument("--tokens", required=True)
    f.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.cmd == "train":
        os.makedirs(args.out, exist_ok=True)
        train(args)
    elif args.cmd == "eval":
        evaluate(args)
    else:
        fixture(args)


if __name__ == "__main__":
    main()
