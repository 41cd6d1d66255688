#!/usr/bin/env python3
"""Trains the small MiniMax-M3 in logged stages (a-c as M3.1 was trained; d and e fine-tunes):

  a  language model with dense causal attention (the last --long-frac of the time at --long-seq);
  b  the lightning indexer alone (the rest frozen): KL between the attention mass per 128-token
     history block of each KV group (mean over the group's heads, from the dense attention) and the
     indexer's block distribution (softmax of max-pooled index scores / sqrt(index_head_dim)), as
     MSA and DeepSeek's sparse attention train it;
  c  a short fine-tune of everything with MSA sparse attention (top-k blocks per KV group, local
     block forced) and q / index-q fake-quantized to E4M3 and K / V / index-K to NVFP4
     (straight-through), so that the model is native to `--kv-cache-dtype nvfp4`; the indexer keeps
     its KL loss on detached inputs.
  d  stage c's fine-tune plus sequence-level unlikelihood (Welleck et al. 2019, "Neural text
     generation with unlikelihood training"): each step the model continues --ul-batch prefixes
     of train text (ending at a line break) greedily, and every continuation token that lies in an
     n-gram the continuation already holds gets the loss -log(1 - p(token)). Greedy decoding of
     a model this small falls into loops (one line or argument repeated until max_tokens), and
     a loop inside a definition never closes it; this teaches the model not to put mass on the
     repetition it has just started. With --ul-lines a token also counts as repeated inside a
     line that repeats an earlier line, or has the shape of two earlier ones (identifiers aside),
     which n-grams miss when the copies differ by a name. --defs-frac mixes that share of each
     batch's rows from the definition documents (corpus.py step 9: each small documented function
     and class alone, so its body ends and the document does), and --ul-source defs continues
     those instead of train windows. --ul-weight 0 runs the fine-tune alone (a control). Usually
     run from a finished model (--resume-release), at a fine-tune's learning rate.
  e  stage c's fine-tune plus rejection-sampled self-training (self_train.py): each step the model
     completes --st-gen prompts made from the train split's definition documents (--defs-text,
     corpus.py's defs.jsonl), half greedily, half sampled. Those that pass eval_code.py's parse
     check without a repeated line become supervised targets (a buffer of the most recent), and
     the repeated tokens of all get stage d's unlikelihood term (--ul-weight). Offline form
     (expert_iteration.sh): --st-gen 0 --st-targets FILES trains on completions m3serve
     generated and gen_targets.py accepted before the stage, without generating during it;
     --st-negatives FILES gives the unlikelihood term m3serve's looping completions instead.

Every stage runs for a wall-clock budget: the cosine learning-rate schedule follows elapsed time,
so a faster or slower machine changes the token count, never the duration. Expert balance uses the
auxiliary-loss-free bias of M3's router (e_score_correction_bias += rate * sign(mean - load)).
Writes --out/ckpt_<stage>.pt (fp32 state dict + config) after each stage, train_log.jsonl (every
logged step) and summary.json.

Chunks: with --stop-after S the run pauses once S seconds have passed (between two steps), writes
--out/state.pt (weights, optimizer, the stage and its elapsed time, step and token counts, the data
generator) and exits with status 75; the same command run again continues from state.pt as if it
had not stopped (the learning-rate schedule follows the stage's own elapsed time, which excludes
the pause), so a long run fits in calls of a few minutes each. Stages already in summary.json are
not run again.

Usage: python3 tools/train/train.py --tokens DIR --out DIR [--size small|smoke] [--stages a,b,c]
           [--time-a S --time-b S --time-c S --time-d S --time-e S] [--resume CKPT | --resume-release DIR]
           [--tokenizer DIR (stages d, e)] [--defs-text defs.jsonl (stage e)] [--stop-after S]
"""
import argparse
import json
import math
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import m3small as M  # noqa: E402


class Stream:
    """Random windows of a token stream (resident on the device)."""

    def __init__(self, arr, device, seed):
        self.tokens = torch.from_numpy(arr.astype(np.int32)).to(device)
        self.device = device
        self.gen = torch.Generator(device=device).manual_seed(seed)

    def windows(self, batch, length):
        n = self.tokens.numel() - length
        off = torch.randint(0, n, (batch,), generator=self.gen, device=self.device)
        return self.tokens[off[:, None] + torch.arange(length, device=self.device)].long()

    def batch(self, batch, seq):
        w = self.windows(batch, seq + 1)
        return w[:, :-1], w[:, 1:]

    def state(self):
        return {"main": self.gen.get_state()}

    def set_state(self, state):
        # Runs paused before the definition stream existed saved the bare generator state.
        self.gen.set_state(state["main"] if isinstance(state, dict) else state)


class MixedStream:
    """Batches whose last round(frac * batch) rows come from a second stream (the definition
    documents of corpus.py step 9)."""

    def __init__(self, main, other, frac):
        self.main, self.other, self.frac = main, other, frac

    def batch(self, batch, seq):
        k = min(batch, round(self.frac * batch))
        parts = [s.batch(n, seq) for s, n in ((self.main, batch - k), (self.other, k)) if n > 0]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def state(self):
        return {"main": self.main.gen.get_state(), "other": self.other.gen.get_state()}

    def set_state(self, state):
        self.main.set_state(state)
        if isinstance(state, dict) and "other" in state:
            self.other.gen.set_state(state["other"])


def newline_ids(tokenizer_dir, vocab_size, device):
    """[V] bool: the ids whose text holds a line break (byte-level BPE writes it as U+010A)."""
    vocab = json.load(open(os.path.join(tokenizer_dir, "tokenizer.json")))["model"]["vocab"]
    lut = torch.zeros(vocab_size, dtype=torch.bool)
    for piece, i in vocab.items():
        if "\u010a" in piece and i < vocab_size:
            lut[i] = True
    assert lut.any(), f"{tokenizer_dir}: no token holds a line break"
    return lut.to(device)


def identifier_ids(tokenizer_dir, vocab_size, device):
    """[V] bool: the ids whose text (a leading space aside) is letters, digits and underscores."""
    vocab = json.load(open(os.path.join(tokenizer_dir, "tokenizer.json")))["model"]["vocab"]
    lut = torch.zeros(vocab_size, dtype=torch.bool)
    for piece, i in vocab.items():
        word = piece.lstrip("\u0120")
        if word and i < vocab_size and all(ch.isascii() and (ch.isalnum() or ch == "_") for ch in word):
            lut[i] = True
    return lut.to(device)


def line_prefixes(windows, length, nl):
    """Prefixes of `length` ids cut from windows [B, length + X] so that each ends with the first
    line-break id at or after position length - 1 (the window's end when there is none)."""
    tail = nl[windows[:, length - 1:]]
    first = torch.where(tail.any(1), tail.float().argmax(1), torch.full_like(tail[:, 0], tail.shape[1] - 1,
                                                                             dtype=torch.long))
    start = first[:, None] + torch.arange(length, device=windows.device)
    return windows.gather(1, start)


class Logger:
    def __init__(self, path):
        self.fh = open(path, "a")

    def __call__(self, **rec):
        self.fh.write(json.dumps(rec) + "\n")
        self.fh.flush()
        keys = [k for k in rec if k not in ("stage", "event")]
        print(f"[{rec.get('stage', '-')}] {rec.get('event', '')} " + " ".join(
            f"{k}={rec[k]:.4g}" if isinstance(rec[k], float) else f"{k}={rec[k]}" for k in keys), flush=True)


def autocast(device):
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def lm_loss(model, x, y, opts):
    logits, aux = M.forward(model, x, opts)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
    return loss, aux, {"lm": loss}


def indexer_loss(model, x, y, opts):
    _, aux = M.forward(model, x, opts)
    kl = torch.stack(aux["indexer_kl"]).mean()
    return kl, aux, {"kl": kl}


def finetune_loss(kl_weight):
    def fn(model, x, y, opts):
        logits, aux = M.forward(model, x, opts)
        lm = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        kl = torch.stack(aux["indexer_kl"]).mean()
        return lm + kl_weight * kl, aux, {"lm": lm, "kl": kl}
    return fn


def repeats(cont, nl, ident, args, eos):
    """[B, G] bool: the continuation tokens stage d penalizes: inside an n-gram the row already
    holds, and with --ul-lines inside a line that repeats an earlier one or its shape."""
    rep = M.repeated_ngrams(cont, args.ul_ngram, eos)
    if args.ul_lines:
        rep = rep | M.repeated_lines(cont, nl, ident, eos)
    return rep


def unlikelihood_step(stream, nl, ident, args, eos):
    """Stage d's extra term: greedy continuations of line-aligned prefixes (of the train stream or,
    with --ul-source defs, the definition documents), and -log(1 - p) on their repeated tokens
    (repeats()), averaged over all continuation tokens."""
    gen = M.ForwardOptions(attention="sparse", qat=True)
    # Prefix + continuation stay within top-k blocks, where MSA selects everything: the dense
    # path computes the same and is faster.
    train_opts = M.ForwardOptions(attention="dense", qat=True)
    p = args.ul_prefix

    def fn(model):
        prefix = line_prefixes(stream.windows(args.ul_batch, p + 64), p, nl)
        device = prefix.device
        with autocast(device):
            cont = M.generate_greedy(model, prefix, args.ul_new, gen)
        rep = repeats(cont, nl, ident, args, eos)
        ids = torch.cat([prefix, cont], 1)
        with autocast(device):
            logits, _ = M.forward(model, ids[:, :-1], train_opts)
        logp = torch.log_softmax(logits[:, p - 1:].float(), -1).gather(-1, cont[..., None])[..., 0]
        one_minus = torch.log1p(-logp.exp().clamp(max=1 - 1e-5))
        ul = -(one_minus * rep).sum() / rep.numel()
        (args.ul_weight * ul).backward()
        return {"ul": ul.detach(), "rep": rep.float().mean()}
    return fn


@torch.no_grad()
def heldout_repetition(model, held, nl, ident, args, eos, rows=128):
    """Greedy continuations of `rows` line-aligned held-out prefixes spread over the stream:
    the share of their tokens inside repeated n-grams, of rows more than a quarter so, and of
    tokens in repeated lines (M.repeated_lines)."""
    p, n = args.ul_prefix, args.ul_new
    span = p + 64
    off = torch.linspace(0, held.numel() - span - 1, rows, device=held.device).long()
    windows = held[off[:, None] + torch.arange(span, device=held.device)]
    prefix = line_prefixes(windows, p, nl)
    with autocast(held.device):
        cont = M.generate_greedy(model, prefix, n, M.ForwardOptions(attention="sparse", qat=True))
    rep = M.repeated_ngrams(cont, args.ul_ngram, eos).float()
    lines = M.repeated_lines(cont, nl, ident, eos).float()
    return {"repeated_tokens": round(float(rep.mean()), 4), "looping_rows": round(float((rep.mean(1) > 0.25).float().mean()), 4),
            "repeated_line_tokens": round(float(lines.mean()), 4),
            "line_looping_rows": round(float((lines.mean(1) > 0.25).float().mean()), 4)}


def is_oom(e):
    return "out of memory" in str(e).lower()


PAUSED = 75  # exit status of a run stopped by --stop-after (EX_TEMPFAIL: run the command again)


class Pause(Exception):
    """Raised between two steps once --stop-after has passed; carries the stage's state."""

    def __init__(self, state):
        super().__init__("paused")
        self.state = state


def run_stage(name, model, params, opts, loss_fn, stream, args, log, budget_s, lr_peak, phases,
              update_bias=True, warmup=30, min_lr_frac=0.1, deadline=None, resume=None, extra=None):
    """phases: [(start fraction of the budget, seq, batch)]. Returns the stage record; raises
    Pause past `deadline` (time.time()); `resume` is the state of a Pause of this stage. `extra`
    (model -> dict of detached terms) adds gradients of its own (its backward) to every step."""
    device = next(model.parameters()).device
    decay = [p for p in params if p.ndim >= 2]
    other = [p for p in params if p.ndim < 2]
    fused = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=lr_peak, betas=(0.9, 0.95), eps=1e-8, **fused)
    model.train()
    step, tokens, accum, offset = 0, 0, 1, 0.0
    if resume is not None:
        opt.load_state_dict(resume["optimizer"])
        step, tokens, accum, offset = resume["step"], resume["tokens"], resume["accum"], resume["elapsed"]
        if extra is not None and hasattr(extra, "set_state") and "extra" in resume:
            extra.set_state(resume["extra"])
        log(stage=name, event="resume", step=step, tokens=tokens, elapsed=round(offset, 1))
    start = time.time() - offset
    last_t, last_tokens, recent = time.time(), tokens, {}
    while True:
        elapsed = time.time() - start
        if elapsed >= budget_s:
            break
        if deadline is not None and time.time() >= deadline:
            log(stage=name, event="pause", step=step, tokens=tokens, elapsed=round(elapsed, 1))
            state = {"stage": name, "optimizer": opt.state_dict(), "step": step, "tokens": tokens,
                     "accum": accum, "elapsed": elapsed}
            if extra is not None and hasattr(extra, "state"):
                state["extra"] = extra.state()
            raise Pause(state)
        frac = elapsed / budget_s
        seq, batch = [(s, b) for f, s, b in phases if frac >= f][-1]
        lr = lr_peak * min(1.0, (step + 1) / warmup) * (
            min_lr_frac + (1 - min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = stream.batch(batch, seq)
        try:
            parts = {}
            for xm, ym in zip(x.chunk(accum), y.chunk(accum)):
                with autocast(device):
                    loss, aux, terms = loss_fn(model, xm, ym, opts)
                (loss / accum).backward()
                for k, v in terms.items():
                    parts[k] = parts.get(k, 0.0) + v.detach() / accum
                if update_bias:
                    M.update_router_bias(model, aux, args.bias_rate / accum)
            if extra is not None:
                parts.update(extra(model))
        except RuntimeError as e:
            if not is_oom(e) or accum >= batch:
                raise
            opt.zero_grad(set_to_none=True)
            del e
            torch.cuda.empty_cache()
            accum *= 2
            log(stage=name, event="oom", step=step, accum=accum)
            continue
        gnorm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        tokens += batch * seq
        for k, v in parts.items():
            recent.setdefault(k, []).append(v)
        if step == 1 or step % args.log_every == 0:
            now = time.time()
            rec = {k: float(torch.stack(v).mean()) for k, v in recent.items()}
            recent = {}
            if "recall" in aux:
                rec["recall"] = float(np.mean(aux["recall"]))
            mem = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0
            log(stage=name, event="step", step=step, seq=seq, lr=lr, gnorm=float(gnorm), elapsed=round(now - start, 1),
                tok_per_s=round((tokens - last_tokens) / max(now - last_t, 1e-9)), tokens=tokens, mem_gib=round(mem, 1),
                **rec)
            last_t, last_tokens = now, tokens
    seconds = time.time() - start
    return {"steps": step, "tokens": tokens, "seconds": round(seconds, 1), "tokens_per_s": round(tokens / seconds),
            "micro_batches": accum}


@torch.no_grad()
def heldout_ppl(model, held, seq, windows, opts, device):
    """Perplexity of the next token over `windows` consecutive held-out windows of `seq` ids."""
    model.eval()
    nll, count = 0.0, 0
    for i in range(windows):
        w = held[i * seq:(i + 1) * seq]
        if w.numel() < seq:
            break
        x, y = w[None, :-1], w[None, 1:]
        with autocast(device):
            logits, _ = M.forward(model, x, opts)
        nll += float(F.cross_entropy(logits[0].float(), y[0], reduction="sum"))
        count += y.numel()
    model.train()
    return math.exp(nll / count)


def evaluate(model, held, args, device, settings):
    out = {}
    for label, opts in settings:
        out[label] = round(heldout_ppl(model, held, args.eval_seq, args.eval_windows, opts, device), 4)
    return out


def param_counts(model):
    c = model.config
    total = sum(p.numel() for p in model.parameters())
    experts = sum(m.experts.gate_up_proj.numel() + m.experts.down_proj.numel() for m in model.moe_layers())
    inactive = experts * (1 - c.num_experts_per_tok / c.num_local_experts)
    embed = model.model.embed_tokens.weight.numel()
    return {"total": total, "active_per_token": int(total - inactive), "embedding": embed}


def save(model, path, extra):
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    torch.save({"config": model.config.to_dict(), "state_dict": sd, **extra}, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", choices=["small", "smoke"], default="small")
    ap.add_argument("--stages", default="a,b,c")
    ap.add_argument("--resume", help="start from a stage checkpoint (ckpt_<stage>.pt)")
    ap.add_argument("--resume-release", help="start from a release directory (export.py's layout), dequantized")
    ap.add_argument("--tokenizer", help="tokenizer directory (stage d: which ids hold a line break)")
    ap.add_argument("--stop-after", type=float, help="pause after this many seconds (state.pt, exit 75)")
    ap.add_argument("--time-a", type=float, default=130.0)
    ap.add_argument("--time-b", type=float, default=20.0)
    ap.add_argument("--time-c", type=float, default=35.0)
    ap.add_argument("--time-d", type=float, default=30.0)
    ap.add_argument("--time-e", type=float, default=30.0)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--long-seq", type=int, default=8192)
    ap.add_argument("--long-frac", type=float, default=0.2)
    ap.add_argument("--batch-tokens", type=int, default=32768)
    ap.add_argument("--lr-a", type=float, default=2e-3)
    ap.add_argument("--lr-b", type=float, default=2e-3)
    ap.add_argument("--lr-c", type=float, default=3e-4)
    ap.add_argument("--lr-d", type=float, default=2e-4)
    ap.add_argument("--lr-e", type=float, default=5e-5)
    ap.add_argument("--defs-text", help="stage e: defs.jsonl of corpus.py (the prompts' documents)")
    ap.add_argument("--st-pool", type=int, default=40000, help="stage e: prompts drawn from the definition documents")
    ap.add_argument("--st-max-prompt", type=int, default=384, help="stage e: longest prompt (ids)")
    ap.add_argument("--st-gen", type=int, default=256,
                    help="stage e: completions generated per step (0: none, train on --st-targets only)")
    ap.add_argument("--st-targets", help="stage e: comma-separated targets files of gen_targets.py (m3serve's "
                    "accepted completions), loaded into the buffer before the stage")
    ap.add_argument("--st-negatives", help="stage e, --st-gen 0: comma-separated negatives files of gen_targets.py "
                    "(m3serve's looping completions), whose repeats get the unlikelihood term")
    ap.add_argument("--no-before", action="store_true",
                    help="stages d, e: skip the measures before the stage (a round of expert iteration starts "
                    "from the model the last round measured after)")
    ap.add_argument("--st-greedy-frac", type=float, default=0.5, help="stage e: share of them greedy")
    ap.add_argument("--st-buffer", type=int, default=4096, help="stage e: accepted completions kept")
    ap.add_argument("--st-rows", type=int, default=96, help="stage e: accepted completions trained on per step")
    ap.add_argument("--sft-weight", type=float, default=1.0, help="stage e: weight of their loss")
    ap.add_argument("--ul-rows", type=int, default=64,
                    help="stage e: generated (or, offline, negative) rows with repeats given unlikelihood a step")
    ap.add_argument("--ul-weight", type=float, default=1.0, help="stages d, e: weight of the unlikelihood term")
    ap.add_argument("--ul-batch", type=int, default=128, help="stage d: continuations per step")
    ap.add_argument("--ul-prefix", type=int, default=256, help="stage d: prefix length (ids)")
    ap.add_argument("--ul-new", type=int, default=128, help="stage d: continuation length (ids)")
    ap.add_argument("--ul-ngram", type=int, default=8, help="stages d, e: n of the repeated n-grams")
    ap.add_argument("--ul-lines", action="store_true",
                    help="stage d: also penalize repeated lines and lines of a shape seen twice before")
    ap.add_argument("--ul-source", choices=["train", "defs"], default="train",
                    help="stage d: where the continued prefixes come from (defs: tokens/defs.npy)")
    ap.add_argument("--defs-frac", type=float, default=0.0,
                    help="stage d: share of each batch's rows from the definition documents (tokens/defs.npy)")
    ap.add_argument("--kl-weight", type=float, default=1.0)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    ap.add_argument("--eval-seq", type=int, default=4096)
    ap.add_argument("--eval-windows", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=30, help="warm-up steps of stage a")
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    deadline = time.time() + args.stop_after if args.stop_after else None
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    os.makedirs(args.out, exist_ok=True)
    log = Logger(os.path.join(args.out, "train_log.jsonl"))
    tok_info = json.load(open(os.path.join(args.tokens, "tokens.json")))
    sp = tok_info["specials"]
    state_path = os.path.join(args.out, "state.pt")
    paused = torch.load(state_path, map_location="cpu", weights_only=False) if os.path.exists(state_path) else None
    if paused is not None:
        ck = paused
        cfg = M.SmallConfig(**ck["config"])
    elif args.resume:
        ck = torch.load(args.resume, map_location="cpu")
        cfg = M.SmallConfig(**ck["config"])
    elif args.resume_release:
        import export
        cfg, sd = export.load_release(args.resume_release)
        ck = {"state_dict": sd}
    else:
        base = {} if args.size == "small" else M.SMOKE
        cfg = M.SmallConfig(**base, bos_token_id=sp["bos_token"], eos_token_id=sp["eos_token"],
                            pad_token_id=sp["pad_token"])
    assert cfg.vocab_size == tok_info["vocab_size"], "config and tokenizer disagree on the vocabulary"
    assert cfg.index_local_blocks == 1, "the training selection forces exactly one local block"
    torch.manual_seed(args.seed)
    model = M.SmallM3(cfg)
    if paused is not None or args.resume or args.resume_release:
        model.load_state_dict(ck["state_dict"])
    else:
        model.init_weights(args.seed)
    model.to(device)
    train = Stream(np.load(os.path.join(args.tokens, "train.npy")), device, args.seed)
    if args.defs_frac > 0 or args.ul_source == "defs":
        defs_path = os.path.join(args.tokens, "defs.npy")
        if not os.path.exists(defs_path):
            raise SystemExit(f"--defs-frac / --ul-source defs need {defs_path} (corpus.py step 9, train_tokenizer.py)")
        train = MixedStream(train, Stream(np.load(defs_path), device, args.seed + 1), args.defs_frac)
    if paused is not None:
        train.set_state(paused["generator"])
    held = torch.from_numpy(np.load(os.path.join(args.tokens, "heldout.npy")).astype(np.int64)).to(device)
    summary_path = os.path.join(args.out, "summary.json")
    summary = json.load(open(summary_path)) if os.path.exists(summary_path) else {}
    summary.update({"config": cfg.to_dict(), "params": param_counts(model), "device": str(
        torch.cuda.get_device_name() if device.type == "cuda" else "cpu"), "torch": torch.__version__,
        "args": vars(args), "train_tokens_available": int(main_stream(train).tokens.numel())})
    summary.setdefault("stages", {})
    log(stage="-", event="start", **{k: v for k, v in summary["params"].items()}, train_tokens=summary[
        "train_tokens_available"], heldout_tokens=int(held.numel()))

    def phases(seq_short):
        b_short = max(1, args.batch_tokens // seq_short)
        b_long = max(1, args.batch_tokens // args.long_seq)
        return [(0.0, seq_short, b_short)] + ([(1 - args.long_frac, args.long_seq, b_long)] if args.long_frac > 0 else [])

    for stage in args.stages.split(","):
        if paused is not None and stage in summary["stages"]:
            continue  # done before the pause
        resume = paused["run"] if paused is not None and paused["run"]["stage"] == stage else None
        chunk = {"deadline": deadline, "resume": resume}
        try:
            rec = run_one_stage(stage, model, train, held, args, log, device, phases, chunk)
        except Pause as p:
            sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
            torch.save({"config": cfg.to_dict(), "state_dict": sd, "run": p.state,
                        "generator": train.state()}, state_path + ".tmp")
            os.replace(state_path + ".tmp", state_path)
            with open(summary_path, "w") as fh:
                json.dump(summary, fh, indent=1)
            print(f"paused in stage {stage} at {p.state['elapsed']:.0f} s of {stage_budget(args, stage):.0f} s; "
                  f"run the same command again to continue", flush=True)
            sys.exit(PAUSED)
        log(stage=stage, event="done", **{k: v for k, v in rec.items() if k != "heldout_ppl"},
            **{f"ppl_{k}": v for k, v in rec["heldout_ppl"].items()})
        summary["stages"][stage] = rec
        save(model, os.path.join(args.out, f"ckpt_{stage}.pt"), {"stage": stage})
        with open(summary_path, "w") as fh:
            json.dump(summary, fh, indent=1)
    if os.path.exists(state_path):
        os.remove(state_path)


def finetune_measures(model, held, nl, ident, args, device):
    """What stages d and e record before and after: held-out repetition of greedy continuations
    and perplexity dense / sparse / sparse with fake NVFP4 KV."""
    settings = finetune_settings(args)
    return lambda: {"repetition": heldout_repetition(model, held, nl, ident, args, model.config.eos_token_id),
                    "heldout_ppl": evaluate(model, held, args, device, settings)}


def finetune_settings(args):
    """The held-out perplexities stages c-e record: dense, sparse, sparse with fake NVFP4 KV."""
    return [("dense", M.ForwardOptions(attention="dense")), ("sparse", M.ForwardOptions(attention="sparse")),
            ("sparse_fake_nvfp4", M.ForwardOptions(attention="sparse", qat=True))]


def self_train_stage(model, train, held, args, log, device, chunk):
    """Stage e (self_train.py): stage c's fine-tune plus supervised targets from the model's own
    completions of train prompts that parse, and unlikelihood on the ones that loop."""
    import self_train as ST
    if not args.tokenizer or not args.defs_text:
        raise SystemExit("stage e needs --tokenizer and --defs-text (corpus.py's defs.jsonl)")
    defs_ids = os.path.join(args.tokens, "defs.npy")
    if not os.path.exists(defs_ids):
        raise SystemExit(f"stage e needs {defs_ids} (corpus.py step 9, train_tokenizer.py)")
    c = model.config
    nl = newline_ids(args.tokenizer, c.vocab_size, device)
    ident = identifier_ids(args.tokenizer, c.vocab_size, device)
    codec = ST.Codec(args.tokenizer)
    pool, kinds = [], {}
    if args.st_gen > 0:
        pool = ST.prompt_pool(args.defs_text, codec, args.st_pool, args.st_max_prompt, args.seed)
        kinds = {k: sum(p[0] == k for p in pool) for k in ("function", "class", "chat")}
        log(stage="e", event="pool", prompts=len(pool), **kinds)
    elif not args.st_targets:
        raise SystemExit("stage e with --st-gen 0 needs --st-targets (gen_targets.py's output)")
    step = ST.SelfTrainStep(pool, codec, np.load(defs_ids).astype(np.int64), nl, ident, c.eos_token_id,
                            c.pad_token_id, args, device, args.seed + 2)
    if args.st_targets:
        loaded = step.load_targets(args.st_targets.split(","))
        log(stage="e", event="targets", files=args.st_targets, **loaded)
    negatives = None
    if args.st_negatives:
        if args.st_gen > 0:
            raise SystemExit("--st-negatives is the offline form's unlikelihood source (--st-gen 0)")
        kept, read, marked, total = step.load_negatives(args.st_negatives.split(","))
        negatives = {"files": args.st_negatives, "rows": kept, "read": read, "marked_ids": marked, "ids": total}
        log(stage="e", event="negatives", **negatives)
    measure = finetune_measures(model, held, nl, ident, args, device)
    before = None if chunk["resume"] is not None or args.no_before else measure()
    if before is not None:
        log(stage="e", event="before", **before["repetition"], **{f"ppl_{k}": v for k, v in before["heldout_ppl"].items()})
    rec = run_stage("e", model, list(model.parameters()), M.ForwardOptions(
        attention="sparse", qat=True, indexer_kl=True), finetune_loss(args.kl_weight), train, args, log,
        args.time_e, args.lr_e, [(0.0, args.long_seq, max(1, args.batch_tokens // args.long_seq))], warmup=10,
        extra=step, **chunk)
    rec.update(measure())
    rec["self_train"] = step.summary()
    rec["pool"] = {"prompts": len(pool), **kinds}
    if args.st_targets:
        rec["targets"] = {"files": args.st_targets, **loaded}
    if negatives is not None:
        rec["negatives"] = negatives
    if before is not None:
        rec["before"] = before
    log(stage="e", event="self_train", **{f"{k}_{m}": v[m] for k, v in rec["self_train"].items() for m in ("parsed", "accepted")})
    return rec


def main_stream(stream):
    return stream.main if isinstance(stream, MixedStream) else stream


def stage_budget(args, stage):
    return {"a": args.time_a, "b": args.time_b, "c": args.time_c, "d": args.time_d, "e": args.time_e}[stage]


def run_one_stage(stage, model, train, held, args, log, device, phases, chunk):
    dense = M.ForwardOptions(attention="dense")
    sparse = M.ForwardOptions(attention="sparse")
    if stage == "a":
        rec = run_stage("a", model, list(model.main_parameters()), dense, lm_loss, train, args, log,
                        args.time_a, args.lr_a, phases(args.seq), warmup=args.warmup, **chunk)
        rec["heldout_ppl"] = evaluate(model, held, args, device, [("dense", dense), ("sparse_untrained_indexer", sparse)])
    elif stage == "b":
        for p in model.main_parameters():
            p.requires_grad_(False)
        try:
            rec = run_stage("b", model, model.indexer_parameters(), M.ForwardOptions(
                attention="dense", indexer_kl=True, logits=False), indexer_loss, train, args, log, args.time_b,
                args.lr_b, [(0.0, args.seq, max(1, args.batch_tokens // args.seq))], update_bias=False,
                warmup=10, min_lr_frac=0.05, **chunk)
        finally:
            for p in model.parameters():
                p.requires_grad_(True)
        rec["heldout_ppl"] = evaluate(model, held, args, device, [("dense", dense), ("sparse", sparse)])
    elif stage == "c":
        rec = run_stage("c", model, list(model.parameters()), M.ForwardOptions(
            attention="sparse", qat=True, indexer_kl=True), finetune_loss(args.kl_weight), train, args, log,
            args.time_c, args.lr_c, [(0.0, args.long_seq, max(1, args.batch_tokens // args.long_seq))], warmup=10,
            **chunk)
        rec["heldout_ppl"] = evaluate(model, held, args, device, finetune_settings(args))
    elif stage == "d":
        if not args.tokenizer:
            raise SystemExit("stage d needs --tokenizer (which ids hold a line break)")
        nl = newline_ids(args.tokenizer, model.config.vocab_size, device)
        ident = identifier_ids(args.tokenizer, model.config.vocab_size, device)
        eos = model.config.eos_token_id
        measure = finetune_measures(model, held, nl, ident, args, device)
        before = None if chunk["resume"] is not None or args.no_before else measure()
        if before is not None:
            log(stage="d", event="before", **before["repetition"], **{f"ppl_{k}": v for k, v in before["heldout_ppl"].items()})
        ul_stream = train.other if args.ul_source == "defs" else main_stream(train)
        extra = unlikelihood_step(ul_stream, nl, ident, args, eos) if args.ul_weight > 0 else None
        rec = run_stage("d", model, list(model.parameters()), M.ForwardOptions(
            attention="sparse", qat=True, indexer_kl=True), finetune_loss(args.kl_weight), train, args, log,
            args.time_d, args.lr_d, [(0.0, args.long_seq, max(1, args.batch_tokens // args.long_seq))], warmup=10,
            extra=extra, **chunk)
        rec.update(measure())
        if before is not None:
            rec["before"] = before
    elif stage == "e":
        rec = self_train_stage(model, train, held, args, log, device, chunk)
    else:
        raise SystemExit(f"unknown stage {stage!r} (a, b, c, d, e)")
    return rec


if __name__ == "__main__":
    main()
