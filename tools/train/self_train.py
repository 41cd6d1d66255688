"""Stage e of train.py: rejection-sampled self-training (expert iteration) on definition prompts
made from the train split.

Why: what the small model fails at is finishing a definition. Its greedy continuations run into
a loop (one line or argument repeated to max_tokens) and a loop never closes the definition.
Teacher-forced text of complete definitions (the definition documents) does not move that,
because the model never sees its own loops while training on it. Here the model writes
completions of train prompts itself. The ones that parse and do not loop become supervised
targets; the repeated lines of all of them get line-level unlikelihood. So the model is taught on
its own outputs what ends well and what does not.

Prompts and the check of a completion: definition_prompts.py (shared with gen_targets.py, which
generates through m3serve instead).

Each step (SelfTrainStep):
  1. gen_rows prompts, drawn at random, each left-filled to the batch's longest prompt with the
     tail of the definition stream up to an end-of-document id. A packed training row looks like
     this too, so the prompt needs no padding mask. Generation is greedy on gen_greedy_frac of the
     rows and at temperature 0.8 / top-p 0.95 on the rest, as eval_code.py samples. Each kind
     keeps eval_code.py's max_tokens, and a row ends at its stop strings, its end-of-turn id, or
     (function / class) once a line at column 0 follows the definition. Generation uses dense
     attention with the KV fake-quantized: past 512 positions MSA would select 4 of the blocks,
     a small difference for a data generator.
  2. A completion is accepted when it passes eval_code.py's own check (check_definition /
     check_chat: the same code, imported) and no line of it repeats (m3small.repeated_lines).
     Accepted completions are re-encoded as they end in a document: the definition, "\\n" and
     the end-of-document id; the chat answer up to its end-of-turn id. They go into a buffer of
     the most recent buffer_size.
  3. Loss: cross-entropy on the completion ids of sft_rows buffer examples (prompt ids masked),
     times sft_weight; plus, with ul_weight > 0, -log(1 - p) on the repeated-line and n-gram
     tokens of up to ul_rows generated rows that hold any (the same term as stage d); both through
     the training path (MSA, fake NVFP4 KV).
Offline form (--st-gen 0, load_targets): the buffer holds the targets gen_targets.py accepted from
m3serve's completions before the stage (expert_iteration.sh: rounds of generate, train, export),
and each step trains on sft_rows of them; nothing is generated. The unlikelihood term then takes
its rows from gen_targets.py's negatives (load_negatives: m3serve's completions that looped or ran
to max_tokens), ul_rows of them a step, on the same repeated-line and n-gram tokens.
m3serve on the GPU writes completions far faster than this generator (docs/small-model.md has the
rates), with the KV numerics and the MSA selection the model ships with.
Stage e adds these gradients to stage c's fine-tune step (language model + indexer KL on the train
stream), which holds the perplexity.
"""
import collections
import itertools
import json
import os
import random
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import definition_prompts as DP  # noqa: E402
import eval_code  # noqa: E402
import m3small as M  # noqa: E402

class Codec:
    """Text <-> ids through the tokenizers library's Tokenizer (special tokens kept)."""

    def __init__(self, tokenizer_dir):
        from tokenizers import Tokenizer
        self.tok = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts):
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode_batch(self, rows):
        return self.tok.decode_batch(rows, skip_special_tokens=False)


def prompt_pool(defs_jsonl, codec, size, max_prompt, seed):
    """Up to `size` prompts (kind, text, ids) of the definition documents, in a seeded random order,
    of at most max_prompt ids."""
    prompts, pool = DP.prompts_in_order(defs_jsonl, seed), []
    while len(pool) < size:
        found = list(itertools.islice(prompts, 4096))  # encoded a batch at a time
        if not found:
            break
        for (kind, text), ids in zip(found, codec.encode_batch([t for _, t in found])):
            if 0 < len(ids) <= max_prompt:
                pool.append((kind, text, ids))
    if not pool:
        raise SystemExit(f"{defs_jsonl}: no definition document gives a prompt")
    return pool[:size]


def read_jsonl(paths):
    """The records of the jsonl files, in order."""
    records = []
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            records += [json.loads(line) for line in fh if line.strip()]
    return records


class SelfTrainStep:
    """The extra gradient term of stage e (the module docstring)."""

    def __init__(self, pool, codec, filler, nl, ident, eos, pad, args, device, seed):
        self.pool, self.codec, self.filler = pool, codec, filler
        self.nl, self.ident, self.eos, self.pad = nl, ident, eos, pad
        self.args, self.device = args, device
        self.buffer = collections.deque(maxlen=args.st_buffer)
        self.rng = random.Random(seed)
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.ends = np.flatnonzero(filler == eos)
        self.gen_opts = M.ForwardOptions(attention="dense", qat=True)
        self.train_opts = M.ForwardOptions(attention="sparse", qat=True)
        self.totals = collections.Counter()
        self.negatives = []  # offline unlikelihood rows: (prompt ids, completion ids, repeated [bool])

    def state(self):
        return {"buffer": list(self.buffer), "rng": self.rng.getstate(), "gen": self.gen.get_state(),
                "totals": dict(self.totals)}

    def set_state(self, state):
        self.buffer.clear()
        self.buffer.extend(state["buffer"])
        self.rng.setstate(state["rng"])
        self.gen.set_state(state["gen"])
        self.totals.update(state["totals"])

    def fill(self, n):
        """The last n ids of the definition stream before a random end-of-document id (inclusive)."""
        if n == 0:
            return []
        ends = self.ends[self.ends >= n - 1]
        e = int(ends[self.rng.randrange(len(ends))])
        return self.filler[e - n + 1:e + 1].tolist()

    def _texts(self, rows, cont):
        """Per row: (completion text up to the end-of-turn id, whether that id came)."""
        out = []
        ids = cont.tolist()
        for r, row in enumerate(ids):
            ended = self.eos in row
            out.append((row[:row.index(self.eos)] if ended else row, ended))
        texts = self.codec.decode_batch([x for x, _ in out])
        return [(t, ended) for t, (_, ended) in zip(texts, out)]

    def _finished(self, rows):
        limits = [eval_code.MAX_TOKENS[kind] for kind, _, _ in rows]

        def fn(cont):
            n = cont.shape[1]
            for (kind, prompt, _), (text, ended), limit in zip(rows, self._texts(rows, cont), limits):
                if ended or n >= limit:
                    continue
                text, stopped = DP.cut_completion(kind, text)
                if stopped:
                    continue
                if kind != "chat":
                    lines = (prompt.split("\n", 1)[1] + text).split("\n")
                    if eval_code.definition_end(lines) < len(lines) - 1:
                        continue
                return False
            return True
        return fn

    def generate(self, model):
        a = self.args
        rows = [self.pool[self.rng.randrange(len(self.pool))] for _ in range(a.st_gen)]
        p = max(len(ids) for _, _, ids in rows)
        prefix = torch.tensor([self.fill(p - len(ids)) + ids for _, _, ids in rows], device=self.device)
        n_greedy = round(a.st_greedy_frac * len(rows))
        temp = torch.tensor([0.0] * n_greedy + [eval_code.SAMPLED["temperature"]] * (len(rows) - n_greedy),
                            device=self.device)
        new = max(eval_code.MAX_TOKENS[kind] for kind, _, _ in rows)
        was_training = model.training
        model.eval()
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16):
            cont = M.generate(model, prefix, new, self.gen_opts, temperature=temp,
                              top_p=eval_code.SAMPLED["top_p"], generator=self.gen, finished=self._finished(rows))
        model.train(was_training)
        return rows, prefix, cont, n_greedy

    def judge(self, rows, cont, n_greedy, lines_rep):
        """Per row: the accepted target ids or None; and keep [B, G], the ids of cont up to where
        each row ended. Counts into self.totals. lines_rep: M.repeated_lines of cont."""
        keep = torch.zeros(cont.shape, dtype=torch.bool)
        verdicts = []
        lines_rep = lines_rep.cpu()
        for r, ((kind, prompt, ids), (text, ended)) in enumerate(zip(rows, self._texts(rows, cont))):
            limit = eval_code.MAX_TOKENS[kind]
            text, _ = DP.cut_completion(kind, text)
            ok, body = DP.target_text(kind, prompt, text, ended)
            n_kept = min(limit, cont.shape[1], len(self.codec.encode(text)) + int(ended))
            keep[r, :n_kept] = True
            looped = bool(lines_rep[r, :n_kept].any())
            mode = "greedy" if r < n_greedy else "sampled"
            self.totals[f"{mode}_{kind}_n"] += 1
            self.totals[f"{mode}_{kind}_parsed"] += int(ok)
            target = None if body is None or looped else self.codec.encode(body) + [self.eos]
            if target is not None:
                self.totals[f"{mode}_{kind}_accepted"] += 1
                self.buffer.append((ids, target))
            verdicts.append(target)
        return verdicts, keep.to(cont.device)

    def sft_loss(self, model):
        a = self.args
        picks = [self.buffer[self.rng.randrange(len(self.buffer))] for _ in range(min(a.st_rows, len(self.buffer)))]
        length = max(len(p) + len(t) for p, t in picks)
        ids = torch.full((len(picks), length), self.pad, dtype=torch.long)
        labels = torch.full((len(picks), length), -100, dtype=torch.long)
        for r, (p, t) in enumerate(picks):
            row = p + t
            ids[r, :len(row)] = torch.tensor(row)
            labels[r, len(p):len(row)] = torch.tensor(t)
        ids, labels = ids.to(self.device), labels.to(self.device)
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16):
            logits, _ = M.forward(model, ids[:, :-1], self.train_opts)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1))

    def ul_loss(self, model, prefix, cont, keep, lines_rep):
        a = self.args
        rep = (M.repeated_ngrams(cont, a.ul_ngram, self.eos) | lines_rep) & keep
        rows = torch.nonzero(rep.any(1))[:, 0][:a.ul_rows]
        if rows.numel() == 0:
            return None, rep
        p = prefix.shape[1]
        ids = torch.cat([prefix[rows], cont[rows]], 1)
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16):
            logits, _ = M.forward(model, ids[:, :-1], self.train_opts)
        logp = torch.log_softmax(logits[:, p - 1:].float(), -1).gather(-1, cont[rows][..., None])[..., 0]
        one_minus = torch.log1p(-logp.exp().clamp(max=1 - 1e-5))
        return -(one_minus * rep[rows]).sum() / keep[rows].sum().clamp(min=1), rep

    def load_targets(self, paths):
        """Fills the buffer with the targets of gen_targets.py (jsonl: prompt, target) and makes it
        hold all of them: the offline form of stage e (--st-gen 0), where m3serve generated them
        before the stage. Returns how many of each kind were loaded."""
        records = read_jsonl(paths)
        if not records:
            raise SystemExit(f"{', '.join(paths)}: no targets")
        self.buffer = collections.deque(maxlen=max(self.args.st_buffer, len(records)))
        prompts = self.codec.encode_batch([r["prompt"] for r in records])
        targets = self.codec.encode_batch([r["target"] for r in records])
        for p, t in zip(prompts, targets):
            self.buffer.append((p, t + [self.eos]))
        return {k: sum(r["kind"] == k for r in records) for k in DP.ALL_KINDS}

    def load_negatives(self, paths):
        """Loads gen_targets.py's negatives (jsonl: kind, prompt, completion): m3serve's completions
        that looped or ran to max_tokens. Each completion is encoded, cut at its kind's max_tokens,
        and marked as ul_loss marks a generated row (repeated n-grams and repeated lines); rows with
        nothing marked are dropped. Not part of state(): the files are read again on resume.
        Returns (rows kept, rows read, marked ids, completion ids)."""
        records = read_jsonl(paths)
        if not records:
            return 0, 0, 0, 0
        prompts = self.codec.encode_batch([r["prompt"] for r in records])
        conts = self.codec.encode_batch([r["completion"] for r in records])
        conts = [c[:DP.MAX_TOKENS[r["kind"]]] for r, c in zip(records, conts)]
        rows = torch.full((len(conts), max(len(c) for c in conts) + 1), self.eos, dtype=torch.long)
        for r, c in enumerate(conts):
            rows[r, :len(c)] = torch.tensor(c, dtype=torch.long)
        rep = (M.repeated_ngrams(rows, self.args.ul_ngram, self.eos)
               | M.repeated_lines(rows, self.nl, self.ident, self.eos).cpu())
        self.negatives, marked, total = [], 0, 0
        for r, (p, cont) in enumerate(zip(prompts, conts)):
            m = rep[r, :len(cont)]
            if p and m.any():
                self.negatives.append((p, cont, m.tolist()))
                marked += int(m.sum())
                total += len(cont)
        return len(self.negatives), len(records), marked, total

    def negatives_ul_loss(self, model):
        """The unlikelihood term of the offline form: -log(1 - p) on the marked ids of ul_rows
        negatives drawn at random, right-padded in one batch, over all their completion ids (as
        ul_loss normalises)."""
        a = self.args
        picks = [self.negatives[self.rng.randrange(len(self.negatives))]
                 for _ in range(min(a.ul_rows, len(self.negatives)))]
        length = max(len(p) + len(c) for p, c, _ in picks)
        ids = torch.full((len(picks), length), self.pad, dtype=torch.long)
        marked = torch.zeros((len(picks), length), dtype=torch.bool)
        n_ids = 0
        for r, (p, cont, rep) in enumerate(picks):
            ids[r, :len(p) + len(cont)] = torch.tensor(p + cont)
            marked[r, len(p):len(p) + len(cont)] = torch.tensor(rep)
            n_ids += len(cont)
        ids, marked = ids.to(self.device), marked.to(self.device)
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16):
            logits, _ = M.forward(model, ids[:, :-1], self.train_opts)
        logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        one_minus = torch.log1p(-logp.exp().clamp(max=1 - 1e-5))
        return -(one_minus * marked[:, 1:]).sum() / n_ids

    def __call__(self, model):
        a = self.args
        out = {}
        if a.st_gen > 0:
            rows, prefix, cont, n_greedy = self.generate(model)
            lines_rep = M.repeated_lines(cont, self.nl, self.ident, self.eos)
            verdicts, keep = self.judge(rows, cont, n_greedy, lines_rep)
            out["accepted"] = torch.tensor(sum(v is not None for v in verdicts) / len(verdicts), device=self.device)
            out["gen_len"] = torch.tensor(float(cont.shape[1]), device=self.device)
        if self.buffer:
            sft = self.sft_loss(model)
            (a.sft_weight * sft).backward()
            out["sft"] = sft.detach()
        if a.st_gen > 0 and a.ul_weight > 0:
            ul, rep = self.ul_loss(model, prefix, cont, keep, lines_rep)
            if ul is not None:
                (a.ul_weight * ul).backward()
                out["ul"] = ul.detach()
            out["rep"] = rep.sum().float() / keep.sum().clamp(min=1)
        if a.st_gen == 0 and a.ul_weight > 0 and self.negatives:
            ul = self.negatives_ul_loss(model)
            (a.ul_weight * ul).backward()
            out["ul"] = ul.detach()
        return out

    def summary(self):
        """Pass and acceptance rates per mode and kind over the whole stage."""
        out = {}
        for mode in ("greedy", "sampled"):
            for kind in eval_code.MAX_TOKENS:
                n = self.totals.get(f"{mode}_{kind}_n", 0)
                if n:
                    out[f"{mode}_{kind}"] = {"n": n, "parsed": round(self.totals[f"{mode}_{kind}_parsed"] / n, 4),
                                             "accepted": round(self.totals[f"{mode}_{kind}_accepted"] / n, 4)}
        return out
