"""The small MiniMax-M3 of m3serve in plain PyTorch: its configuration, a parameter container whose
state_dict has exactly the names of transformers' MiniMaxM3VLForCausalLM, and one forward pass used
three ways:

  training   bf16 autocast; dense causal attention (SDPA) or MSA block-sparse attention with the
             indexer's per-KV-group selection; optional fake quantization of q / index-q to E4M3 and
             of K / V / index-K to NVFP4 with straight-through gradients (quantization-aware tuning);
             optional indexer KL loss against the attention mass per 128-token block. (The
             probabilities stay exact: m3serve's P8 rounding of them costs 0.02% perplexity,
             eval_torch.py's nvfp4-nop8 diagnostic, so training does not model it.)
  emulation  fp32, reproducing m3serve's CPU numerics for each KV-cache dtype (docs/reference.md
             D2-D4): bf16 / fp8 / nvfp4 K, V and index-K, E4M3 queries where m3serve uses
             them, and the Q8KV4 probability path for nvfp4. eval_torch.py compares it with
             `m3serve score`.
  reference  the same module loaded into transformers checks that both compute the same model.

Block selection is the engine's: index head g chooses blocks for the query heads of KV head g; the
local block is forced and counts inside top-k; history blocks score max over their keys of
dot(index_q, index_k).
"""
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint


@dataclass
class SmallConfig:
    vocab_size: int = 8192
    hidden_size: int = 384
    num_hidden_layers: int = 8
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    head_dim: int = 64
    partial_rotary_factor: float = 0.5
    rope_theta: float = 5000000.0
    dense_layers: int = 1  # the first layers use a dense MLP (M3: 3 of 60), the rest MoE
    dense_intermediate_size: int = 1024
    intermediate_size: int = 256
    shared_intermediate_size: int = 256
    num_local_experts: int = 12
    num_experts_per_tok: int = 2
    routed_scaling_factor: float = 2.0
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    index_head_dim: int = 64
    index_block_size: int = 128
    index_topk_blocks: int = 4
    index_local_blocks: int = 1
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 8192
    bos_token_id: int = 1
    eos_token_id: int = 2
    pad_token_id: int = 0

    @property
    def rotary_dim(self):
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def index_n_heads(self):
        return self.num_key_value_heads  # one index head per KV group (docs/reference.md D2)

    @property
    def layer_types(self):
        return ["minimax_m3_sparse"] * self.num_hidden_layers  # M3.1: every layer sparse

    @property
    def mlp_layer_types(self):
        return ["dense"] * self.dense_layers + ["sparse"] * (self.num_hidden_layers - self.dense_layers)

    def to_dict(self):
        return asdict(self)

    def hf_kwargs(self):
        """Arguments of transformers' MiniMaxM3VLTextConfig (through golden_common.text_config)."""
        skip = {"dense_layers"}
        kw = {k: v for k, v in asdict(self).items() if k not in skip}
        kw.update(index_n_heads=self.index_n_heads, layer_types=self.layer_types,
                  mlp_layer_types=self.mlp_layer_types, tie_word_embeddings=False)
        return kw


# Sizes of the smoke pass: every code path, tiny shapes that still meet the MXFP8 (K % 32) and
# NVFP4 (K % 16) export constraints.
SMOKE = dict(vocab_size=2048, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=32, dense_intermediate_size=64, intermediate_size=32, shared_intermediate_size=32,
             index_head_dim=32, index_topk_blocks=2)


# ----------------------------------------------------------------------------------------------
# Parameters (names = transformers' MiniMaxM3VLForCausalLM state_dict)

class Norm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))  # Gemma style: scale is 1 + w


class DenseMlp(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)


class Router(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(c.num_local_experts, c.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(c.num_local_experts))


class Experts(nn.Module):
    def __init__(self, c):
        super().__init__()
        e, i, h = c.num_local_experts, c.intermediate_size, c.hidden_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, i))


class Moe(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate = Router(c)
        self.experts = Experts(c)
        self.shared_experts = DenseMlp(c.hidden_size, c.shared_intermediate_size)


class Indexer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.q_proj = nn.Linear(c.hidden_size, c.index_n_heads * c.index_head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.index_head_dim, bias=False)
        self.q_norm = Norm(c.index_head_dim)
        self.k_norm = Norm(c.index_head_dim)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, d = c.hidden_size, c.head_dim
        self.q_proj = nn.Linear(h, c.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(h, c.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(h, c.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * d, h, bias=False)
        self.q_norm = Norm(d)
        self.k_norm = Norm(d)
        self.indexer = Indexer(c)


class Layer(nn.Module):
    def __init__(self, c, i):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = DenseMlp(c.hidden_size, c.dense_intermediate_size) if c.mlp_layer_types[i] == "dense" else Moe(c)
        self.input_layernorm = Norm(c.hidden_size)
        self.post_attention_layernorm = Norm(c.hidden_size)


class Backbone(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([Layer(c, i) for i in range(c.num_hidden_layers)])
        self.norm = Norm(c.hidden_size)


class SmallM3(nn.Module):
    def __init__(self, c: SmallConfig):
        super().__init__()
        self.config = c
        self.model = Backbone(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def init_weights(self, seed):
        """GPT-2 style: N(0, 0.02), residual projections scaled by 1/sqrt(2 * layers), norms 0
        (scale 1), router bias 0."""
        g = torch.Generator().manual_seed(seed)
        resid = 0.02 / math.sqrt(2 * self.config.num_hidden_layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.zero_()
                elif name.endswith(("o_proj.weight", "down_proj.weight", "experts.down_proj")):
                    p.copy_(torch.randn(p.shape, generator=g) * resid)
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            for name, b in self.named_buffers():
                b.zero_()

    def moe_layers(self):
        return [l.mlp for l in self.model.layers if isinstance(l.mlp, Moe)]

    def indexer_parameters(self):
        return [p for n, p in self.named_parameters() if ".indexer." in n]

    def main_parameters(self):
        return [p for n, p in self.named_parameters() if ".indexer." not in n]


# ----------------------------------------------------------------------------------------------
# Number formats (bit-exact with formats/*.h, written with float ops so they run anywhere)

E2M1_STEPS = ((0.25, True, 0.0), (0.75, False, 0.5), (1.25, True, 1.0), (1.75, False, 1.5),
              (2.5, True, 2.0), (3.5, False, 3.0), (5.0, True, 4.0))


def e4m3_round(x):
    """fp32 -> nearest E4M3 value, ties to even, saturating at +-448, with subnormals."""
    a = x.abs().clamp(max=448.0)
    _, e = torch.frexp(a)  # a = m * 2^e, m in [0.5, 1)
    e = (e - 1).clamp(min=-6)  # below 2^-6 the quantum stays 2^-9
    quantum = torch.exp2((e - 3).to(a.dtype))
    return torch.copysign(torch.round(a / quantum) * quantum, x)  # torch.round: half to even


def bf16_round(x):
    return x.to(torch.bfloat16).to(x.dtype)


def e2m1_round(y):
    """Nearest E2M1 value (0, .5, 1, 1.5, 2, 3, 4, 6), ties to even, saturating at 6."""
    a = y.abs()
    v = torch.full_like(a, 6.0)
    for limit, inclusive, value in reversed(E2M1_STEPS):
        inside = a <= limit if inclusive else a < limit
        v = torch.where(inside, torch.full_like(a, value), v)
    return torch.copysign(v, y)


def e4m3_positive(device):
    """Every positive finite E4M3 value, ascending (subnormals k 2^-9, then (1 + m/8) 2^e up to 448):
    the codes' order, so neighbouring scales are neighbouring entries."""
    sub = [k * 2.0 ** -9 for k in range(1, 8)]
    normal = [(8 + m) / 8.0 * 2.0 ** e for e in range(-6, 9) for m in range(8) if (8 + m) / 8.0 * 2.0 ** e <= 448.0]
    return torch.tensor(sub + normal, dtype=torch.float32, device=device)


# The scale search's candidates, in the order ties are settled: E4M3 steps from E4M3(amax / 6).
NVFP4_SCALE_STEPS = (0, -1, 1, 2, 3, 4)


def nvfp4_kv_round(x, e4m3_view=True, scale_search=True):
    """m3serve's NVFP4 KV encoding (formats/nvfp4.h, docs/reference.md D4) and back: groups of 16
    along the last dim, E2M1 codes of x / scale, and the scale searched: of the E4M3 bytes
    E4M3(clamp(amax / 6, 2^-9, 448)) + NVFP4_SCALE_STEPS, the one whose decoded group is nearest
    the input in squared error (summed in element order without fused multiply-adds, as the
    engine sums it; the first on a tie). With e4m3_view, code * scale is rounded to E4M3 as the
    Q8KV4 kernels read it (docs/reference.md 3.1), for the error as for the result.
    scale_search=False: the amax / 6 scale alone, m3serve's encoding before session 20."""
    shape = x.shape
    g = x.float().reshape(*shape[:-1], shape[-1] // 16, 16)
    amax = g.abs().amax(-1, keepdim=True)
    scale = e4m3_round((amax / 6.0).clamp(min=2.0 ** -9, max=448.0))

    def decode(s):
        v = e2m1_round(g / s) * s
        return e4m3_round(v) if e4m3_view else v

    def error(v):
        sq = (v - g) * (v - g)
        err = sq[..., 0:1]
        for i in range(1, 16):
            err = err + sq[..., i:i + 1]
        return err

    v = decode(scale)
    if scale_search:
        table = e4m3_positive(g.device)
        idx = torch.searchsorted(table, scale)
        err = error(v)
        for step in NVFP4_SCALE_STEPS[1:]:
            cand = decode(table[(idx + step).clamp(0, table.numel() - 1)])
            cand_err = error(cand)
            better = cand_err < err
            v, err = torch.where(better, cand, v), torch.where(better, cand_err, err)
    return v.reshape(shape).to(x.dtype)


def fake_quant(x, fn):
    """Forward: fn(x); backward: identity (straight-through)."""
    with torch.no_grad():
        q = fn(x.float()).to(x.dtype)
    return x + (q - x).detach()


# How each KV-cache dtype treats q, K, V, index-q and index-K in m3serve (kernels/cpu/attention.cc),
# and whether the probabilities take the Q8KV4 path (P8): fp8 and nvfp4 index caches meet E4M3
# index queries; only the nvfp4 main cache meets E4M3 queries and uses P8.
@dataclass(frozen=True)
class Numerics:
    q: object
    k: object
    v: object
    iq: object
    ik: object
    p8: bool


def _ident(t):
    return t


def _nvfp4_amax6(t):
    return nvfp4_kv_round(t, scale_search=False)


# Diagnostics, not m3serve dtypes: where nvfp4's cost comes from. "nvfp4-nop8" leaves P8 out;
# "nvfp4-amax6" encodes K, V and index-K with the amax / 6 scale alone (no scale search, m3serve
# before session 20); "only-X" is f32 with one part of nvfp4's numerics (q: E4M3 queries; index:
# E4M3 index-q and NVFP4 index-K).
DIAGNOSTIC_KV = ("nvfp4-nop8", "nvfp4-amax6", "only-q", "only-k", "only-v", "only-index", "only-p8")


def kv_codec(kv_dtype):
    f = _ident
    if kv_dtype == "f32":
        return Numerics(f, f, f, f, f, False)
    if kv_dtype == "bf16":
        return Numerics(f, bf16_round, bf16_round, f, bf16_round, False)
    if kv_dtype == "fp8":
        return Numerics(f, e4m3_round, e4m3_round, e4m3_round, e4m3_round, False)
    if kv_dtype == "nvfp4":
        return Numerics(e4m3_round, nvfp4_kv_round, nvfp4_kv_round, e4m3_round, nvfp4_kv_round, True)
    if kv_dtype == "nvfp4-nop8":
        return Numerics(e4m3_round, nvfp4_kv_round, nvfp4_kv_round, e4m3_round, nvfp4_kv_round, False)
    if kv_dtype == "nvfp4-amax6":
        return Numerics(e4m3_round, _nvfp4_amax6, _nvfp4_amax6, e4m3_round, _nvfp4_amax6, True)
    only = {"only-q": dict(q=e4m3_round), "only-k": dict(k=nvfp4_kv_round), "only-v": dict(v=nvfp4_kv_round),
            "only-index": dict(iq=e4m3_round, ik=nvfp4_kv_round), "only-p8": dict(p8=True)}
    if kv_dtype in only:
        parts = dict(q=f, k=f, v=f, iq=f, ik=f, p8=False)
        parts.update(only[kv_dtype])
        return Numerics(**parts)
    raise ValueError(f"unknown KV dtype {kv_dtype!r} (f32, bf16, fp8, nvfp4, or a diagnostic: {', '.join(DIAGNOSTIC_KV)})")


# ----------------------------------------------------------------------------------------------
# Forward

@dataclass
class ForwardOptions:
    attention: str = "dense"  # dense | sparse
    qat: bool = False  # fake-quantize q, index-q (E4M3) and K, V, index-K (NVFP4) with STE
    indexer_kl: bool = False  # add the indexer's KL loss (inputs detached) to aux["indexer_kl"]
    emulate: str = None  # None (training path) | f32 | bf16 | fp8 | nvfp4 (fp32 engine numerics)
    topk_blocks: int = None  # override of config.index_topk_blocks
    logits: bool = True


def rms_norm(x, w, eps):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (1.0 + w.float())).to(x.dtype)


def rope_tables(c, seq_len, device):
    rd = c.rotary_dim
    inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, rd, 2, dtype=torch.float32, device=device) / rd))
    pos = torch.arange(seq_len, dtype=torch.float32, device=device)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    """NeoX rotate-half on the first cos.shape[-1] channels of x [B, H, S, D]."""
    rd = cos.shape[-1]
    xr, xp = x[..., :rd], x[..., rd:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    half = rd // 2
    rot = torch.cat([-xr[..., half:], xr[..., :half]], -1)
    return torch.cat([xr * cos + rot * sin, xp], -1)


def history_block_scores(iq, ik, bs):
    """Max over each block's keys of dot(iq, ik), fp32: [B, G, S, nb]. No token mask: a history
    block lies wholly before its query; future and local blocks are handled by the caller."""
    b, g, s, _ = iq.shape
    nb = -(-s // bs)
    scores = torch.matmul(iq.float(), ik.float().transpose(-1, -2))  # [B, G, S, S]
    if nb * bs != s:
        scores = F.pad(scores, (0, nb * bs - s), value=float("-inf"))
    return scores.view(b, g, s, nb, bs).amax(-1)


def block_masks(s, bs, device):
    """query block [S]; history [S, nb] (block < query block); visible [S, nb] (block <= query block)."""
    nb = -(-s // bs)
    qb = torch.arange(s, device=device) // bs
    blk = torch.arange(nb, device=device)
    return qb, blk[None, :] < qb[:, None], blk[None, :] <= qb[:, None]


def select_blocks(bscore, topk, bs):
    """Engine selection from block scores [B, G, S, nb]: local block forced, top-k over the visible
    blocks. Returns keep [B, G, S, nb] bool."""
    b, g, s, nb = bscore.shape
    qb, _, visible = block_masks(s, bs, bscore.device)
    sc = bscore.masked_fill(~visible, float("-inf"))
    sc = sc.masked_fill((torch.arange(nb, device=bscore.device)[None, :] == qb[:, None]), float("inf"))
    k = min(topk, nb)
    vals, idx = sc.topk(k, dim=-1)
    keep = torch.zeros_like(sc, dtype=torch.bool)
    return keep.scatter_(-1, idx, vals > float("-inf"))


def key_mask(keep, s, bs):
    """Block keep [B, G, S, nb] -> key-level mask [B, G, S, S] with the causal mask."""
    m = keep.repeat_interleave(bs, dim=-1)[..., :s]
    causal = torch.ones(s, s, dtype=torch.bool, device=keep.device).tril()
    return m & causal


def indexer_kl(bscore, q, k, c, stats):
    """KL(attention mass per history block || indexer distribution), per KV group, averaged over
    the query rows that have history. q [B, Hq, S, D], k [B, G, S, D] are the main attention's
    (post norm / RoPE, as the attention sees them); the target carries no gradient."""
    b, hq, s, d = q.shape
    g = k.shape[1]
    bs = c.index_block_size
    nb = bscore.shape[-1]
    _, history, _ = block_masks(s, bs, q.device)
    rows = slice(bs, s)  # queries of block 0 have no history
    with torch.no_grad():
        causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
        mass = []
        for j in range(g):
            qg = q[:, j * (hq // g):(j + 1) * (hq // g), rows].float()
            logits = torch.matmul(qg, k[:, j:j + 1].float().transpose(-1, -2)) / math.sqrt(d)
            p = torch.softmax(logits.masked_fill(~causal[rows], float("-inf")), -1).mean(1)  # [B, R, S]
            if nb * bs != s:
                p = F.pad(p, (0, nb * bs - s))
            mass.append(p.view(b, -1, nb, bs).sum(-1))
        mass = torch.stack(mass, 1) * history[rows]  # [B, G, R, nb]
        target = mass / mass.sum(-1, keepdim=True).clamp(min=1e-12)
    logits = (bscore[:, :, rows] / math.sqrt(c.index_head_dim)).masked_fill(~history[rows], float("-inf"))
    logp = torch.log_softmax(logits, -1).masked_fill(~history[rows], 0.0)
    kl = (torch.xlogy(target, target) - target * logp).sum(-1).mean()
    if stats is not None:
        with torch.no_grad():
            # Recall of attention mass on rows where selection bites (more history blocks than
            # the topk - 1 free slots): mass in the indexer's picks / mass in the best picks.
            n = c.index_topk_blocks - 1
            sel_rows = slice((n + 1) * bs - bs, None)  # rows of query block >= n + 1 (offset by bs)
            t, lg = target[:, :, sel_rows], logits[:, :, sel_rows]
            if t.shape[2] > 0 and n > 0:
                got = t.gather(-1, lg.topk(n, -1).indices).sum(-1)
                best = t.topk(n, -1).values.sum(-1)
                stats.setdefault("recall", []).append(float((got / best.clamp(min=1e-12)).mean()))
    return kl


def attention_emulated(q, k, v, keep, c, kv_dtype):
    """fp32 attention as m3serve computes it for one KV dtype. q [1, Hq, S, D]; k, v [1, G, S, D]."""
    n = kv_codec(kv_dtype)
    _, hq, s, d = q.shape
    g = k.shape[1]
    hg = hq // g
    scale = 1.0 / math.sqrt(d)
    q, k, v = n.q(q), n.k(k), n.v(v)
    out = torch.empty_like(q)
    mask = key_mask(keep, s, c.index_block_size)  # [1, G, S, S]
    for j in range(g):
        logits = torch.matmul(q[:, j * hg:(j + 1) * hg], k[:, j:j + 1].transpose(-1, -2))  # unscaled
        logits = logits.masked_fill(~mask[:, j:j + 1], float("-inf"))
        if n.p8:
            p = p8_round(logits, scale)
        else:
            p = torch.softmax(logits * scale, -1)
        out[:, j * hg:(j + 1) * hg] = torch.matmul(p, v[:, j:j + 1])
    return out


def p8_round(logits, scale):
    """The Q8KV4 path's probabilities of logits [..., T] (unscaled; -inf masked):
    P8 = E4M3(448 exp(s - m)) multiplies V; the normaliser sums the unquantized terms."""
    e = 448.0 * torch.exp(scale * (logits - logits.amax(-1, keepdim=True)))
    return e4m3_round(e) / e.sum(-1, keepdim=True)


def sdpa(q, k, v, attn_mask=None, is_causal=False):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    # torch < 2.0 (CPU runs of these scripts): the same attention, materialized.
    s = q.shape[-2]
    if is_causal:
        attn_mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    logits = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    logits = logits.masked_fill(~attn_mask, float("-inf"))
    return torch.matmul(torch.softmax(logits.float(), -1).to(v.dtype), v)


def attention_train(q, k, v, keep, c):
    """bf16 training attention through SDPA. keep None: dense causal."""
    hq, g = q.shape[1], k.shape[1]
    hg = hq // g
    if keep is None:
        k = k.repeat_interleave(hg, dim=1)
        v = v.repeat_interleave(hg, dim=1)
        return sdpa(q, k, v, is_causal=True)
    mask = key_mask(keep, q.shape[2], c.index_block_size)
    outs = []
    for j in range(g):  # one call per KV group: the mask broadcasts over the group's heads
        kj = k[:, j:j + 1].expand(-1, hg, -1, -1)
        vj = v[:, j:j + 1].expand(-1, hg, -1, -1)
        outs.append(sdpa(q[:, j * hg:(j + 1) * hg], kj, vj, attn_mask=mask[:, j:j + 1]))
    return torch.cat(outs, 1)


def swiglu_oai(gate_up, c):
    gate, up = gate_up.chunk(2, dim=-1)
    gate = gate.clamp(max=c.swiglu_limit)
    up = up.clamp(min=-c.swiglu_limit, max=c.swiglu_limit)
    return (up + 1.0) * (gate * torch.sigmoid(gate * c.swiglu_alpha))


def dense_mlp(m, x, c):
    return m.down_proj(swiglu_oai(m.gate_up_proj(x), c))


def route(m, x, c):
    """M3's router on x [T, H]: the top-k experts by sigmoid score + selection bias, and their
    scores normalised over the k (the bias only selects)."""
    probs = torch.sigmoid(F.linear(x.to(m.gate.weight.dtype), m.gate.weight).float())
    _, top_i = torch.topk(probs + m.gate.e_score_correction_bias, c.num_experts_per_tok, dim=-1)
    top_w = probs.gather(1, top_i)
    return top_i, top_w / top_w.sum(-1, keepdim=True)


def moe(m, x, c, aux):
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    shared = dense_mlp(m.shared_experts, x, c)
    top_i, top_w = route(m, x, c)
    out = torch.zeros_like(x, dtype=shared.dtype)
    flat = top_i.reshape(-1)
    order = torch.argsort(flat)
    counts = torch.bincount(flat, minlength=c.num_local_experts)
    aux.setdefault("expert_load", []).append(counts)
    token = order // c.num_experts_per_tok
    weight = top_w.reshape(-1)[order]
    bounds = counts.cumsum(0).tolist()
    start = 0
    for e, end in enumerate(bounds):
        if end > start:
            idx = token[start:end]
            h = swiglu_oai(F.linear(x[idx], m.experts.gate_up_proj[e]), c)
            y = F.linear(h, m.experts.down_proj[e]) * weight[start:end, None].to(h.dtype)
            out.index_add_(0, idx, y.to(out.dtype))
        start = end
    return (out * c.routed_scaling_factor + shared).reshape(shape)


def project_qkv(a, h, cos, sin, c):
    """q [B, Hq, S, D], k, v [B, G, S, D] after the q/k norms and partial RoPE."""
    b, s, _ = h.shape
    hq, g, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    q = rms_norm(a.q_proj(h).view(b, s, hq, d), a.q_norm.weight, c.rms_norm_eps).transpose(1, 2)
    k = rms_norm(a.k_proj(h).view(b, s, g, d), a.k_norm.weight, c.rms_norm_eps).transpose(1, 2)
    v = a.v_proj(h).view(b, s, g, d).transpose(1, 2)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def attention_block(a, h, cos, sin, c, o, aux):
    b, s, _ = h.shape
    hq, g, d, di = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.index_head_dim
    q, k, v = project_qkv(a, h, cos, sin, c)

    need_index = o.attention == "sparse" or o.indexer_kl
    keep = None
    if need_index:
        ix = a.indexer
        hi = h.detach() if (o.indexer_kl and o.emulate is None) else h
        iq = rms_norm(ix.q_proj(hi).view(b, s, g, di), ix.q_norm.weight, c.rms_norm_eps).transpose(1, 2)
        ik = rms_norm(ix.k_proj(hi).view(b, s, 1, di), ix.k_norm.weight, c.rms_norm_eps).transpose(1, 2)
        iq, ik = apply_rope(iq, cos[:, :di], sin[:, :di]), apply_rope(ik, cos[:, :di], sin[:, :di])
        if o.emulate is not None:
            n = kv_codec(o.emulate)
            iq, ik = n.iq(iq), n.ik(ik)
        elif o.qat:
            iq, ik = fake_quant(iq, e4m3_round), fake_quant(ik, nvfp4_kv_round)
        bscore = history_block_scores(iq, ik, c.index_block_size)
        if o.indexer_kl:
            qt, kt = (fake_quant(q, e4m3_round), fake_quant(k, nvfp4_kv_round)) if o.qat else (q, k)
            aux.setdefault("indexer_kl", []).append(indexer_kl(bscore, qt.detach(), kt.detach(), c, aux))
        if o.attention == "sparse":
            keep = select_blocks(bscore.detach(), o.topk_blocks or c.index_topk_blocks, c.index_block_size)

    if o.emulate is not None:
        if keep is None:
            keep = select_blocks(torch.zeros(b, g, s, -(-s // c.index_block_size), device=h.device), 1 << 30,
                                 c.index_block_size)
        out = attention_emulated(q, k, v, keep, c, o.emulate)
    else:
        if o.qat:
            q, k, v = fake_quant(q, e4m3_round), fake_quant(k, nvfp4_kv_round), fake_quant(v, nvfp4_kv_round)
        out = attention_train(q, k, v, keep, c)
    return a.o_proj(out.transpose(1, 2).reshape(b, s, hq * d))


def forward(model, ids, o: ForwardOptions):
    """ids [B, S] -> (logits [B, S, V] or None, aux dict)."""
    c = model.config
    aux = {}
    cos, sin = rope_tables(c, ids.shape[1], ids.device)
    x = model.model.embed_tokens(ids)
    if o.emulate is not None:
        x = x.float()
    for layer in model.model.layers:
        h = rms_norm(x, layer.input_layernorm.weight, c.rms_norm_eps)
        x = x + attention_block(layer.self_attn, h, cos, sin, c, o, aux)
        h = rms_norm(x, layer.post_attention_layernorm.weight, c.rms_norm_eps)
        x = x + (dense_mlp(layer.mlp, h, c) if isinstance(layer.mlp, DenseMlp) else moe(layer.mlp, h, c, aux))
    if not o.logits:
        return None, aux
    x = rms_norm(x, model.model.norm.weight, c.rms_norm_eps)
    return model.lm_head(x), aux


def update_router_bias(model, aux, rate):
    """Auxiliary-loss-free balancing (as M2/M3's e_score_correction_bias): raise the bias of
    under-loaded experts, lower over-loaded ones."""
    with torch.no_grad():
        for m, load in zip(model.moe_layers(), aux.get("expert_load", [])):
            load = load.float()
            m.gate.e_score_correction_bias += rate * torch.sign(load.mean() - load)


def sequence_nll(model, ids, o: ForwardOptions):
    """Sum of next-token NLL of one [1, W] window (W - 1 predicted positions) and the count."""
    logits, _ = forward(model, ids[:, :-1], o)
    nll = F.cross_entropy(logits[0].float(), ids[0, 1:], reduction="sum")
    return float(nll), ids.shape[1] - 1


# ----------------------------------------------------------------------------------------------
# Greedy continuation (the unlikelihood stage of train.py)

def moe_all_experts(m, x, c):
    """moe() for a few tokens, with no host sync: every expert runs on every token (batched
    matmuls) and the router's weights, zero off the top-k, combine them. moe()'s per-expert loop
    reads the expert counts on the host once per layer, which dominated a generated token."""
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    shared = dense_mlp(m.shared_experts, x, c)
    top_i, top_w = route(m, x, c)
    weights = torch.zeros(x.shape[0], c.num_local_experts, device=x.device).scatter_(1, top_i, top_w)  # [T, E]
    h = swiglu_oai(torch.einsum("th,eih->eti", x, m.experts.gate_up_proj.to(x.dtype)), c)
    y = torch.einsum("eti,ehi->eth", h, m.experts.down_proj.to(h.dtype))  # [E, T, H]
    out = torch.einsum("eth,te->th", y.float(), weights).to(shared.dtype)
    return (out * c.routed_scaling_factor + shared).reshape(shape)


def cached_attention(a, h, cos, sin, c, o, cache):
    """Attention of S new positions over `cache` (a dict holding k, v [B, G, T, D] of the earlier
    positions, extended here) and themselves, causal. Dense: exact for MSA only while every visible
    block is selected, which generate_greedy checks."""
    b, s, _ = h.shape
    hq, g = c.num_attention_heads, c.num_key_value_heads
    q, k, v = project_qkv(a, h, cos, sin, c)
    if o.qat:
        q, k, v = fake_quant(q, e4m3_round), fake_quant(k, nvfp4_kv_round), fake_quant(v, nvfp4_kv_round)
    if "k" in cache:
        k, v = torch.cat([cache["k"], k], 2), torch.cat([cache["v"], v], 2)
    cache["k"], cache["v"] = k, v
    t = k.shape[2]
    mask = torch.ones(s, t, dtype=torch.bool, device=h.device).tril(t - s)
    hg = hq // g
    out = sdpa(q, k.repeat_interleave(hg, dim=1), v.repeat_interleave(hg, dim=1), attn_mask=mask)
    return a.o_proj(out.transpose(1, 2).reshape(b, s, -1))


@torch.no_grad()
def generate_greedy(model, prefix, new_tokens, o: ForwardOptions):
    """prefix [B, P] -> the model's greedy continuation [B, new_tokens], with a KV cache. With
    o.attention == "sparse" the length must stay within index_topk_blocks blocks, where MSA selects
    every visible block and dense attention is the same computation."""
    return generate(model, prefix, new_tokens, o)


def sample_top_p(logits, temperature, top_p, generator):
    """One id per row of logits [B, V]: argmax where temperature [B] is 0, else a draw from the
    softmax at that temperature cut to the smallest set of ids holding top_p of the mass."""
    greedy = logits.argmax(-1)
    t = temperature.clamp(min=1e-5)[:, None]
    probs = torch.softmax(logits.float() / t, -1)
    sorted_p, order = probs.sort(-1, descending=True)
    drop = sorted_p.cumsum(-1) - sorted_p > top_p  # the most likely id always stays
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    pick = torch.multinomial(sorted_p, 1, generator=generator)
    drawn = order.gather(1, pick)[:, 0]
    return torch.where(temperature > 0, drawn, greedy)


@torch.no_grad()
def generate(model, prefix, new_tokens, o: ForwardOptions, temperature=None, top_p=1.0, generator=None,
             finished=None, check_every=32):
    """prefix [B, P] -> continuation [B, <= new_tokens] with a KV cache: greedy, or per row at
    temperature [B] (0: greedy) with top-p. finished(ids [B, G]) -> bool, asked every check_every
    tokens, ends the loop early once every row is done (the caller cuts the rows). With
    o.attention == "sparse" the length must stay within index_topk_blocks blocks, where MSA selects
    every visible block and dense attention is the same computation."""
    c = model.config
    total = prefix.shape[1] + new_tokens
    if o.attention == "sparse" and total > c.index_topk_blocks * c.index_block_size:
        raise ValueError(f"{total} positions exceed the {c.index_topk_blocks} x {c.index_block_size} "
                         "that sparse attention selects whole")
    cos, sin = rope_tables(c, total, prefix.device)
    caches = [{} for _ in model.model.layers]
    ids, pos, out = prefix, 0, []
    for step in range(new_tokens):
        s = ids.shape[1]
        cs, sn = cos[pos:pos + s], sin[pos:pos + s]
        x = model.model.embed_tokens(ids)
        for layer, cache in zip(model.model.layers, caches):
            h = rms_norm(x, layer.input_layernorm.weight, c.rms_norm_eps)
            x = x + cached_attention(layer.self_attn, h, cs, sn, c, o, cache)
            h = rms_norm(x, layer.post_attention_layernorm.weight, c.rms_norm_eps)
            if isinstance(layer.mlp, DenseMlp):
                x = x + dense_mlp(layer.mlp, h, c)
            elif s == 1:
                x = x + moe_all_experts(layer.mlp, h, c)
            else:  # the prefix: enough tokens that the per-expert loop is the cheaper one
                x = x + moe(layer.mlp, h, c, {})
        x = rms_norm(x[:, -1:], model.model.norm.weight, c.rms_norm_eps)
        logits = model.lm_head(x)
        if temperature is None:
            ids = logits.argmax(-1)
        else:
            ids = sample_top_p(logits[:, 0], temperature, top_p, generator)[:, None]
        out.append(ids)
        pos += s
        if finished is not None and (step + 1) % check_every == 0 and finished(torch.cat(out, 1)):
            break
    return torch.cat(out, 1)


def repeated_lines(cont, nl, ident, stop_id=None, min_tokens=4, near_after=2):
    """[B, G] bool: the tokens of each row's lines that repeat an earlier line of the row exactly, or
    that have the shape of `near_after` earlier lines (the same ids with every identifier id
    masked, so `elif isinstance(a, str):` after `elif isinstance(b, str):`). A line is the ids
    after a line-break id (nl [V] bool) up to the next one; lines of fewer than min_tokens ids
    are ignored. ident [V] bool marks the identifier-like ids. Two or three lines of one shape are
    ordinary code (a chain of elif, a run of assignments); more than near_after is the loop that
    never ends a definition."""
    rows, nls, ids_ = cont.tolist(), nl.tolist(), ident.tolist()
    mask = torch.zeros(cont.shape, dtype=torch.bool)
    for r, row in enumerate(rows):
        if stop_id is not None and stop_id in row:
            row = row[:row.index(stop_id)]
        exact, shapes, start = set(), {}, 0
        for t in range(len(row) + 1):
            if t < len(row) and not nls[row[t]]:
                continue
            line = row[start:t]
            if len(line) >= min_tokens:
                key, shape = tuple(line), tuple(-1 if ids_[i] else i for i in line)
                if key in exact or shapes.get(shape, 0) >= near_after:
                    mask[r, start:t] = True
                exact.add(key)
                shapes[shape] = shapes.get(shape, 0) + 1
            start = t + 1
    return mask.to(cont.device)


def repeated_ngrams(cont, n, stop_id=None):
    """[B, G] bool: the tokens of each row that lie in an n-gram occurring earlier in the same row
    (the later occurrences, as sequence-level unlikelihood training penalizes them), up to the
    first stop_id."""
    rows = cont.tolist()
    mask = torch.zeros(cont.shape, dtype=torch.bool)
    for r, row in enumerate(rows):
        if stop_id is not None and stop_id in row:
            row = row[:row.index(stop_id)]
        seen = set()
        for t in range(n - 1, len(row)):
            gram = tuple(row[t - n + 1:t + 1])
            if gram in seen:
                mask[r, t - n + 1:t + 1] = True
            seen.add(gram)
    return mask.to(cont.device)
