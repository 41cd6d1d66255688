#!/usr/bin/env python3
"""Trains the small model's tokenizer on the corpus of corpus.py and encodes the corpus with it.

The tokenizer has the pipeline of the project's bundled tokenizer (tools/make_tokenizer_golden.py,
shape `minimax_bundled`, imported from there): NFC, the GPT-4 split regex, byte-level BPE, and
every MiniMax-M3 special token and chat marker as a special added token after the trained vocab
(ids vocab_size - 18 .. vocab_size - 1). BPE is trained on an evenly strided sample of the train
documents (chat documents included, so the markers' neighbourhoods are learned). The chat template
of tokenizer_config.json is text/templates/minimax_m3.jinja.

Outputs: --out/tokenizer.json, tokenizer_config.json; --tokens-out/train.npy, heldout.npy and,
when the corpus has defs.jsonl, defs.npy (uint16 ids; every file document is followed by the
end-of-turn token `[e~[`, chat documents already end with it) and tokens.json (counts, special
ids, bytes per token).

With --tokenizer-from DIR the BPE step is skipped and DIR's tokenizer.json is used as it is: a
retrained model then keeps the ids of the one before it, so held-out perplexities per token compare
across runs (the committed models/minimax-m3-small tokenizer was trained by this script on the
first, 110 MiB corpus: tools/train/README.md).

Usage: python3 tools/train/train_tokenizer.py --corpus DIR --out DIR --tokens-out DIR [--vocab-size 8192]
           [--tokenizer-from DIR]
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import make_tokenizer_golden as mtg  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import TEMPLATE, chat_renderer  # noqa: E402


def read_jsonl(path):
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def sample(docs, megabytes):
    total = sum(len(d) for d in docs)
    stride = max(1, round(total / (megabytes * 2**20)))
    return docs[::stride]


def encode_stream(tok, docs, eos):
    out = []
    for i in range(0, len(docs), 2000):
        chunk = docs[i:i + 2000]
        for doc, enc in zip(chunk, tok.encode_batch(chunk, add_special_tokens=False)):
            out.append(np.asarray(enc.ids, dtype=np.uint16))
            if not doc.startswith("]~!b["):
                out.append(np.asarray([eos], dtype=np.uint16))
    return np.concatenate(out)


def check_with_transformers(out_dir, tok, docs):
    """Reports whether transformers loads the directory, encodes like `tokenizers`, and renders
    chats like the jinja environment of corpus.py."""
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(out_dir)
    text = docs[0][:2000]
    same_ids = hf.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False).ids
    messages = [{"role": "user", "content": "Write hello world in Python."}]
    ours = chat_renderer()(messages, add_generation_prompt=True)
    theirs = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    print(f"transformers {type(hf).__name__}: len {len(hf)} bos {hf.bos_token_id} eos {hf.eos_token_id}; "
          f"same ids {same_ids}; same chat rendering {ours == theirs}")
    if not (same_ids and ours == theirs):
        print("WARNING: transformers disagrees with the trained tokenizer or the chat rendering")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens-out", required=True)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--sample-mb", type=float, default=24.0)
    ap.add_argument("--max-docs", type=int, help="encode only the first N train documents (smoke runs)")
    ap.add_argument("--tokenizer-from", help="reuse DIR/tokenizer.json instead of training BPE")
    args = ap.parse_args()
    from tokenizers import Tokenizer, pre_tokenizers, trainers

    t0 = time.time()
    train_docs = read_jsonl(os.path.join(args.corpus, "train.jsonl"))
    held_docs = read_jsonl(os.path.join(args.corpus, "heldout.jsonl"))
    if args.max_docs:
        train_docs = train_docs[:args.max_docs]
    if args.tokenizer_from:
        tok = Tokenizer.from_file(os.path.join(args.tokenizer_from, "tokenizer.json"))
    else:
        shape = dict(next(s for s in mtg.SHAPES if s["name"] == "minimax_bundled"), vocab_size=args.vocab_size)
        tok = Tokenizer.from_str(json.dumps(mtg.build_skeleton(shape)))
        trainer = trainers.BpeTrainer(vocab_size=mtg.base_vocab_size(shape), min_frequency=2, show_progress=False,
                                      special_tokens=shape["specials"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(sample(train_docs, args.sample_mb), trainer=trainer)
        tok = Tokenizer.from_str(json.dumps(mtg.finalize(shape, json.loads(tok.to_str()))))
    vocab = tok.get_vocab_size(with_added_tokens=True)
    assert vocab == args.vocab_size, f"tokenizer has {vocab} ids, expected {args.vocab_size}"
    t1 = time.time()

    os.makedirs(args.out, exist_ok=True)
    tok.save(os.path.join(args.out, "tokenizer.json"))
    config = mtg.tokenizer_config()
    config["chat_template"] = TEMPLATE.read_text()
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
        fh.write("\n")

    specials = {name: tok.token_to_id(config[name]) for name in ("bos_token", "eos_token", "pad_token")}
    os.makedirs(args.tokens_out, exist_ok=True)
    train = encode_stream(tok, train_docs, specials["eos_token"])
    held = encode_stream(tok, held_docs, specials["eos_token"])
    np.save(os.path.join(args.tokens_out, "train.npy"), train)
    np.save(os.path.join(args.tokens_out, "heldout.npy"), held)
    defs_path = os.path.join(args.corpus, "defs.jsonl")
    defs = encode_stream(tok, read_jsonl(defs_path), specials["eos_token"]) if os.path.exists(defs_path) else None
    if defs is not None:
        np.save(os.path.join(args.tokens_out, "defs.npy"), defs)
    train_bytes = sum(len(d.encode("utf-8")) for d in train_docs)
    info = {"vocab_size": vocab, "specials": specials, "train_tokens": int(train.size),
            "heldout_tokens": int(held.size), "defs_tokens": None if defs is None else int(defs.size), "train_bytes_per_token": train_bytes / train.size,
            "bpe_seconds": round(t1 - t0, 1), "encode_seconds": round(time.time() - t1, 1),
            "sample_mb": args.sample_mb, "tokenizer_from": args.tokenizer_from}
    with open(os.path.join(args.tokens_out, "tokens.json"), "w") as fh:
        json.dump(info, fh, indent=1)
    print(f"tokenizer: {vocab} ids (bos {specials['bos_token']}, eos {specials['eos_token']}, pad "
          f"{specials['pad_token']}); BPE {info['bpe_seconds']} s; train {train.size / 1e6:.2f}M tokens "
          f"({info['train_bytes_per_token']:.2f} B/token), held-out {held.size / 1e6:.3f}M; encode "
          f"{info['encode_seconds']} s")
    check_with_transformers(args.out, tok, held_docs)


if __name__ == "__main__":
    main()
