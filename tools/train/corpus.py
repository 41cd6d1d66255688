#!/usr/bin/env python3
"""Builds the training corpus of the small model from the Python sources installed on the machine
it runs on (the GPU machine: the standard library and site-packages, torch and transformers among
them).

Exactly what it does, so that the same machine image rebuilds the same corpus:
  1. roots: the interpreter's stdlib, purelib and platlib directories (sysconfig) and
     site.getsitepackages(), realpath-deduplicated; a root nested in another is walked on its own.
  2. files: every *.py below a root (sorted walk, symlinks not followed) of 200 B .. 1 MB that is
     UTF-8, has no NUL byte, and no line over 1000 characters (generated tables, minified data).
  3. dedup: exact content (sha1 of the bytes); the first path in sorted order names the file.
  4. split by file: held-out when int(sha1[:8], 16) % 100 < HELDOUT_PERCENT, else train.
  5. caps: when a split exceeds its byte cap, the files with the smallest sha1 are kept until the
     cap (a content-random subsample), then put back in path order, so that files of one package
     stay next to each other (the held-out stream is evaluated in 8K-token windows).
  6. documents: "# file: <path relative to its root>\n" + text.
  7. chat documents (train split only): for top-level functions with a docstring (ast), a user
     request made from the signature and the docstring's first paragraph (one of REQUESTS, picked
     by sha1 of the source) and an assistant answer with the function's source, rendered with
     text/templates/minimax_m3.jinja; files visited in sha1 order until the chat documents reach
     CHAT_FRACTION of the train bytes; interleaved at evenly spaced places of the train stream.
Outputs in --out: train.jsonl, heldout.jsonl (one JSON string per document), manifest.tsv
(split, sha1, bytes, root, path of every kept file), corpus.json (settings, roots, interpreter and
package versions, counts, sha256 of the outputs).

Usage: python3 tools/train/corpus.py --out DIR [--train-mb 110] [--heldout-mb 3]
"""
import argparse
import ast
import hashlib
import importlib.metadata
import json
import os
import platform
import site
import sys
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "text" / "templates" / "minimax_m3.jinja"
HELDOUT_PERCENT = 2
MIN_BYTES, MAX_BYTES, MAX_LINE = 200, 1_000_000, 1000
CHAT_FRACTION = 0.10

REQUESTS = [
    "Write a Python function `{sig}` that does the following: {doc}",
    "Implement `{name}` in Python.\n\n{doc}",
    "{doc}\n\nPlease write this as a Python function named `{name}`.",
    "Can you write `{sig}`? It should work like this: {doc}",
]


def source_roots():
    paths = sysconfig.get_paths()
    cands = [paths.get("stdlib"), paths.get("purelib"), paths.get("platlib")]
    try:
        cands += site.getsitepackages()
    except AttributeError:
        pass
    roots = []
    for p in cands:
        if p and os.path.isdir(p):
            r = os.path.realpath(p)
            if r not in roots:
                roots.append(r)
    return sorted(roots)


def walk_root(root, other_roots):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if os.path.join(dirpath, d) not in other_roots
                             and d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith(".py"):
                yield os.path.join(dirpath, f)


def accept(data):
    if not (MIN_BYTES <= len(data) <= MAX_BYTES) or b"\0" in data:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if max(len(line) for line in text.split("\n")) > MAX_LINE:
        return None
    return text


def collect(roots):
    seen, files = set(), []
    rejected = 0
    for root in roots:
        label = "stdlib" if root == os.path.realpath(sysconfig.get_paths()["stdlib"]) else "site"
        others = set(roots) - {root}
        for path in walk_root(root, others):
            try:
                data = Path(path).read_bytes()
            except OSError:
                continue
            text = accept(data)
            if text is None:
                rejected += 1
                continue
            sha = hashlib.sha1(data).hexdigest()
            if sha in seen:
                continue
            seen.add(sha)
            files.append({"sha1": sha, "bytes": len(data), "root": label,
                          "path": os.path.relpath(path, root), "text": text})
    return files, rejected


def cap(files, limit):
    if sum(f["bytes"] for f in files) <= limit:
        return files
    kept, total = [], 0
    for f in sorted(files, key=lambda f: f["sha1"]):
        if total + f["bytes"] > limit:
            continue
        kept.append(f)
        total += f["bytes"]
    return sorted(kept, key=lambda f: (f["root"], f["path"]))


def document(f):
    return f"# file: {f['path']}\n{f['text']}"


def first_paragraph(doc):
    para = doc.strip().split("\n\n")[0]
    return " ".join(line.strip() for line in para.split("\n")).strip()


def chat_pairs(files):
    """Yields (user request, assistant answer) for documented top-level functions, visiting the
    files in sha1 order (content-random) so that stopping early still samples every package."""
    for f in sorted(files, key=lambda f: f["sha1"]):
        try:
            tree = ast.parse(f["text"])
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        lines = f["text"].split("\n")  # ast.get_source_segment re-splits the file on every call
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            src = "\n".join(lines[node.lineno - 1:node.end_lineno]).rstrip()
            if not doc or not src or not (150 <= len(src) <= 2500):
                continue
            summary = first_paragraph(doc)
            if not (20 <= len(summary) <= 400):
                continue
            try:
                sig = f"{node.name}({ast.unparse(node.args)})"
            except Exception:  # noqa: BLE001 - ast.unparse of odd nodes
                continue
            pick = int(hashlib.sha1(src.encode()).hexdigest()[:4], 16) % len(REQUESTS)
            yield REQUESTS[pick].format(sig=sig, name=node.name, doc=summary), f"```python\n{src}\n```"


def chat_renderer():
    import jinja2

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    # The environment transformers' apply_chat_template uses.
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(TEMPLATE.read_text())
    return lambda messages, **kw: template.render(messages=messages, **kw)


def interleave(docs, extra):
    if not extra:
        return docs
    out, step, j = [], len(docs) / len(extra), 0
    for i, d in enumerate(docs):
        out.append(d)
        while j < len(extra) and j * step <= i:
            out.append(extra[j])
            j += 1
    out.extend(extra[j:])
    return out


def write_jsonl(path, docs):
    h = hashlib.sha256()
    with open(path, "w", encoding="utf-8") as fh:
        for d in docs:
            line = json.dumps(d, ensure_ascii=False) + "\n"
            fh.write(line)
            h.update(line.encode("utf-8"))
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--train-mb", type=float, default=110.0)
    ap.add_argument("--heldout-mb", type=float, default=3.0)
    args = ap.parse_args()
    t0 = time.time()
    os.makedirs(args.out, exist_ok=True)
    roots = source_roots()
    files, rejected = collect(roots)
    held = [f for f in files if int(f["sha1"][:8], 16) % 100 < HELDOUT_PERCENT]
    train = [f for f in files if int(f["sha1"][:8], 16) % 100 >= HELDOUT_PERCENT]
    train = cap(sorted(train, key=lambda f: (f["root"], f["path"])), int(args.train_mb * 2**20))
    held = cap(sorted(held, key=lambda f: (f["root"], f["path"])), int(args.heldout_mb * 2**20))
    train_docs = [document(f) for f in train]
    train_bytes = sum(len(d) for d in train_docs)

    render = chat_renderer()
    chats, chat_bytes = [], 0
    for request, answer in chat_pairs(train):
        text = render([{"role": "user", "content": request}, {"role": "assistant", "content": answer}])
        if chat_bytes + len(text) > CHAT_FRACTION * train_bytes:
            break
        chats.append(text)
        chat_bytes += len(text)
    docs = interleave(train_docs, chats)

    info = {
        "built_by": "tools/train/corpus.py", "seconds": None,
        "python": sys.version, "platform": platform.platform(), "roots": roots,
        "settings": {"heldout_percent": HELDOUT_PERCENT, "min_bytes": MIN_BYTES, "max_bytes": MAX_BYTES,
                     "max_line": MAX_LINE, "train_mb": args.train_mb, "heldout_mb": args.heldout_mb,
                     "chat_fraction": CHAT_FRACTION, "template": str(TEMPLATE.relative_to(REPO))},
        "files_seen_unique": len(files), "files_rejected": rejected,
        "train_files": len(train), "heldout_files": len(held), "train_bytes": train_bytes,
        "heldout_bytes": sum(f["bytes"] for f in held), "chat_documents": len(chats), "chat_bytes": chat_bytes,
        "packages": sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
                           if d.metadata["Name"]),
    }
    info["train_jsonl_sha256"] = write_jsonl(os.path.join(args.out, "train.jsonl"), docs)
    info["heldout_jsonl_sha256"] = write_jsonl(os.path.join(args.out, "heldout.jsonl"), [document(f) for f in held])
    with open(os.path.join(args.out, "manifest.tsv"), "w") as fh:
        fh.write("split\tsha1\tbytes\troot\tpath\n")
        for split, group in (("train", train), ("heldout", held)):
            for f in group:
                fh.write(f"{split}\t{f['sha1']}\t{f['bytes']}\t{f['root']}\t{f['path']}\n")
    info["seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(args.out, "corpus.json"), "w") as fh:
        json.dump(info, fh, indent=1)
    print(f"corpus: {len(files)} unique files ({rejected} rejected) -> train {len(train)} files "
          f"{train_bytes / 2**20:.1f} MiB + {len(chats)} chat docs {chat_bytes / 2**20:.1f} MiB; held-out "
          f"{len(held)} files {info['heldout_bytes'] / 2**20:.2f} MiB; {info['seconds']} s")


if __name__ == "__main__":
    main()
