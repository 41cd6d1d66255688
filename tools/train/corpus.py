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
  7. chat documents (train split only), rendered with text/templates/minimax_m3.jinja, made from
     top-level functions with a docstring (ast); files visited in sha1 order until the chat
     documents reach CHAT_FRACTION of the train bytes; interleaved at evenly spaced places of the
     train stream. The sha1 of a function's source picks one of two shapes (chat_documents):
     - a code request (one of REQUESTS, from the signature and the docstring's first paragraph)
       answered with the function's source in a ```python block;
     - a tool exchange (when every parameter has a JSON type: tool_spec): the function, and up
       to two other documented functions of its file, offered as tools; a user request with
       argument values (literal defaults, else values made from the parameter's type), named
       (`path="v2"`) or, in three of the seven request shapes, given as values only; the
       assistant's call in the M3 tool-call markup; a tool response; a one-line answer.
     The same hash sets the thinking mode (enabled / disabled / adaptive) and whether the
     assistant turn carries reasoning (always when enabled, never when disabled), so the
     reasoning and tool parsers see the markup the model writes.
     With --extra DIR (the unpacked archive of tools/train/debian_sources.py: <package>/<path>),
     the files there that pass the rules of step 2 and are not duplicates of a file above join the
     train split only (root "debian"; their document path is the part after dist-packages/), so
     the held-out split, the code prompts and their definitions check are exactly those of the
     machine's own files. An extra file is dropped when it could leak the held-out split: its
     document path equals a held-out file's, or it holds the definition line of a code prompt.
  8. code prompts (held-out split only, for tools/train/eval_code.py): top-level functions
     and small classes with a docstring, as a file prefix ending after the docstring, plus chat
     requests made like the code requests above; picked by sha1, PROMPT_COUNTS of each kind.
  9. definition documents (train split only): the functions and classes of the sizes step 8
     uses, each as "# file: <path>\n" + its source, files in sha1 order up to DEFS_MB, interleaved
     with the chat documents of step 7 (defs.jsonl; a second stream that train.py --defs-frac
     mixes into fine-tunes).
Outputs in --out: train.jsonl, defs.jsonl, heldout.jsonl (one JSON string per document), code_prompts.json,
manifest.tsv (split, sha1, bytes, root, path of every kept file), corpus.json (settings, roots,
interpreter and package versions, counts, sha256 of the outputs).

Usage: python3 tools/train/corpus.py --out DIR [--train-mb 1024] [--heldout-mb 3]
"""
import argparse
import ast
import hashlib
import importlib.metadata
import json
import multiprocessing
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
DEFS_MB = 96

PROMPT_COUNTS = {"function": 40, "class": 30, "chat": 30}
THINKING_MODES = ("adaptive", "enabled", "disabled")

REQUESTS = [
    "Write a Python function `{sig}` that does the following: {doc}",
    "Implement `{name}` in Python.\n\n{doc}",
    "{doc}\n\nPlease write this as a Python function named `{name}`.",
    "Can you write `{sig}`? It should work like this: {doc}",
]
# Requests for a tool call. The first four name every argument (`path="v2"`); the others give
# only the values, in the parameters' order, as a person would ("Count the lines of setup.py"),
# so the model learns to map values to parameters itself (the reasoning spells the mapping out).
TOOL_REQUESTS = [
    "Use `{name}` to do this: {doc} The inputs are {args}.",
    "Please call {name} with {args}.",
    "{doc}\n\nRun it for {args}.",
    "I need the result of {name} for {args}. Can you get it?",
    "{doc}\n\nDo it for {values}.",
    "Can you run {name} on {values}?",
    "{doc} I have {values}.",
]
WORDS = ("alpha", "report.txt", "main", "utf-8", "config", "users", "data/input.csv", "north", "id", "v2")


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


def read_source(path, seen_sha1):
    """(sha1, bytes, text) of a file that passes the rules of step 2 and is not a duplicate,
    "rejected" when it fails them, None when it is a duplicate or unreadable."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    text = accept(data)
    if text is None:
        return "rejected"
    sha = hashlib.sha1(data).hexdigest()
    if sha in seen_sha1:
        return None
    seen_sha1.add(sha)
    return sha, len(data), text


def collect(roots):
    seen, files = set(), []
    rejected = 0
    for root in roots:
        label = "stdlib" if root == os.path.realpath(sysconfig.get_paths()["stdlib"]) else "site"
        others = set(roots) - {root}
        for path in walk_root(root, others):
            got = read_source(path, seen)
            if got == "rejected":
                rejected += 1
            elif got is not None:
                sha, size, text = got
                files.append({"sha1": sha, "bytes": size, "root": label,
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


def collect_extra(extra_dir, seen_sha1):
    """Files of --extra DIR (<package>/<path>) by the rules of step 2, minus exact duplicates."""
    out, rejected = [], 0
    for path in walk_root(extra_dir, set()):
        got = read_source(path, seen_sha1)
        if got == "rejected":
            rejected += 1
        elif got is not None:
            sha, size, text = got
            rel = os.path.relpath(path, extra_dir)
            inner = rel.split("dist-packages/", 1)[1] if "dist-packages/" in rel else rel.split("/", 1)[1]
            out.append({"sha1": sha, "bytes": size, "root": "debian", "path": inner,
                        "package": rel.split("/")[0], "text": text})
    return sorted(out, key=lambda f: (f["package"], f["path"])), rejected


def leak_free(extra, held, prompts):
    """The extra files that cannot leak the held-out split (see step 7)."""
    held_paths = {f["path"] for f in held}
    prompt_lines = definition_lines({"text": p["prompt"]} for p in prompts)
    return [f for f in extra if f["path"] not in held_paths and not definition_lines([f]) & prompt_lines]


def document(f):
    return f"# file: {f['path']}\n{f['text']}"


def first_paragraph(doc):
    para = doc.strip().split("\n\n")[0]
    return " ".join(line.strip() for line in para.split("\n")).strip()


def parse(text):
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def documented_functions(f, tree, lo=150, hi=2500):
    """(node, source, docstring summary, signature) of the file's public documented top-level
    functions whose source is lo..hi bytes."""
    lines = f["text"].split("\n")  # ast.get_source_segment re-splits the file on every call
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        src = "\n".join(lines[node.lineno - 1:node.end_lineno]).rstrip()
        if not doc or not src or not (lo <= len(src) <= hi):
            continue
        summary = first_paragraph(doc)
        if not (20 <= len(summary) <= 400):
            continue
        try:
            sig = f"{node.name}({ast.unparse(node.args)})"
        except Exception:  # noqa: BLE001 - ast.unparse of odd nodes
            continue
        yield node, src, summary, sig


JSON_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "list": "array",
              "dict": "object", "Path": "string", "bytes": "string"}


def param_type(arg, default):
    """The JSON Schema type of a parameter from its annotation or literal default, or None."""
    if arg.annotation is not None:
        name = ast.unparse(arg.annotation).split("[")[0].split(".")[-1].strip("'\"")
        if "|" in name or name not in JSON_TYPES:
            return None
        return JSON_TYPES[name]
    if default is not None:
        try:
            value = ast.literal_eval(default)
        except Exception:  # noqa: BLE001 - any non-literal default
            return None
        for py, js in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
                       (list, "array"), (dict, "object")):
            if isinstance(value, py):
                return js
        return None
    return "string"  # an unannotated parameter without a default: the common case is text


def tool_spec(node, summary):
    """(OpenAI function tool, [(name, JSON type, literal default or None)]) or None when a
    parameter has no JSON type (*args, **kwargs, non-literal defaults, unusual annotations)."""
    a = node.args
    if a.vararg or a.kwarg or a.posonlyargs:
        return None
    positional = a.args[1:] if a.args and a.args[0].arg in ("self", "cls") else a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults[-len(positional):] if positional else [])
    params = list(zip(positional, defaults)) + list(zip(a.kwonlyargs, a.kw_defaults))
    if not params or len(params) > 5:
        return None
    props, required, out = {}, [], []
    for arg, default in params:
        t = param_type(arg, default)
        if t is None:
            return None
        props[arg.arg] = {"type": t}
        literal = None
        if default is None:
            required.append(arg.arg)
        else:
            try:
                literal = ast.literal_eval(default)
            except Exception:  # noqa: BLE001
                return None
        out.append((arg.arg, t, literal))
    fn = {"name": node.name, "description": summary,
          "parameters": {"type": "object", "properties": props, "required": required}}
    return {"type": "function", "function": fn}, out


def argument_values(params, h):
    """Concrete arguments for a tool call: literal defaults where given (sometimes overridden),
    else a value of the parameter's type; h (an int) makes the choice."""
    args = {}
    for i, (name, t, literal) in enumerate(params):
        k = (h >> (3 * i)) & 0xFFFF
        if literal is not None and k % 3:
            if isinstance(literal, (str, int, float, bool, list, dict)):
                args[name] = literal
            continue
        if literal is None and t != "string" and k % 5 == 0:
            continue  # leave a parameter out now and then only when it has a default
        args[name] = {"string": WORDS[k % len(WORDS)], "integer": k % 100, "number": (k % 40) / 4,
                      "boolean": bool(k & 1), "array": [WORDS[k % len(WORDS)]], "object": {"key": k % 10}}[t]
    return args


def reasoning_for(kind, name, summary, args=None):
    if kind == "tool":
        shown = ", ".join(f"{k}={json.dumps(v)}" for k, v in args.items()) or "no arguments"
        return f"The user wants {name}. {summary} I will call `{name}` with {shown}."
    return f"The user wants a Python function `{name}`. {summary} I will write it with a docstring."


def chat_documents(facts, render):
    """Yields rendered chat documents (the shapes of step 7) for documented top-level functions,
    visiting the files in sha1 order (content-random) so that stopping early still samples every
    package. facts: TrainFacts."""
    for _, found, _ in facts:
        for j, (name, src, summary, sig, spec) in enumerate(found):
            h = int(hashlib.sha1(src.encode()).hexdigest()[:12], 16)
            mode = THINKING_MODES[(h >> 8) % 3]
            think = mode == "enabled" or (mode == "adaptive" and (h >> 10) & 1)
            spec = spec if h % 5 >= 3 else None
            if spec is None:
                request = REQUESTS[h % len(REQUESTS)].format(sig=sig, name=name, doc=summary)
                answer = {"role": "assistant", "content": f"```python\n{src}\n```"}
                if think:
                    answer["reasoning_content"] = reasoning_for("code", name, summary)
                yield render([{"role": "user", "content": request}, answer], thinking_mode=mode)
                continue
            tool, params = spec
            decoys = [d[4] for d in found[j + 1:j + 4]]
            tools = [tool] + [d[0] for d in decoys if d is not None][:2]
            tools = tools[(h >> 12) % len(tools):] + tools[:(h >> 12) % len(tools)]
            args = argument_values(params, h >> 16)
            shown = ", ".join(f"{k}={json.dumps(v)}" for k, v in args.items()) or "the default arguments"
            values = ", ".join(v if isinstance(v, str) else json.dumps(v) for v in args.values()) or "the defaults"
            request = TOOL_REQUESTS[(h >> 4) % len(TOOL_REQUESTS)].format(name=name, doc=summary, args=shown,
                                                                          values=values)
            call = {"role": "assistant", "content": "",
                    "tool_calls": [{"type": "function", "function": {"name": name, "arguments": args}}]}
            if think:
                call["reasoning_content"] = reasoning_for("tool", name, summary, args)
            result = json.dumps({"status": "ok", "function": name})
            messages = [{"role": "user", "content": request}, call, {"role": "tool", "content": result},
                        {"role": "assistant", "content": f"`{name}` ran with {shown} and returned {result}."}]
            yield render(messages, tools=tools, thinking_mode=mode)


def definition_lines(files):
    """The top-level `def` / `class` lines of the files: a held-out definition whose first line
    occurs in the train split (a vendored copy, a near-duplicate file) is not a fresh prompt."""
    out = set()
    for f in files:
        for line in f["text"].split("\n"):
            if line.startswith(("def ", "async def ", "class ")):
                out.add(line.rstrip())
    return out


FUNCTION_BYTES = (120, 1200)  # source sizes of the definitions that prompts and definition documents use
CLASS_BYTES = (150, 1500)


def small_classes(tree, lines):
    """(node, source) of the top-level undecorated classes with a docstring and a statement after
    it, CLASS_BYTES in size."""
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or not ast.get_docstring(node) or len(node.body) < 2:
            continue
        src = "\n".join(lines[node.lineno - 1:node.end_lineno])
        if CLASS_BYTES[0] <= len(src) <= CLASS_BYTES[1] and not node.decorator_list:
            yield node, src


def definition_documents(facts):
    """Step 9: each small documented top-level function and class of the files as a document of
    its own, "# file: <path>\n" + its source, files in sha1 order (facts: TrainFacts). Whole files
    teach what follows a definition only as often as definitions end; these teach that a
    definition's body ends, and then the document does."""
    for _, _, definitions in facts:
        yield from definitions


def safe_tool_spec(node, summary):
    """tool_spec, or None where the function's signature is too odd for it to read (file_facts
    computes it for every function, also those that become code requests)."""
    try:
        return tool_spec(node, summary)
    except Exception:  # noqa: BLE001 - ast.unparse / literal_eval of unusual nodes
        return None


def file_facts(f):
    """What steps 7 and 9 take from one file's syntax tree, as plain data: (the documented
    functions of step 7 as (name, source, summary, signature, tool_spec or None), the definition
    documents of step 9), or None when the file does not parse."""
    tree = parse(f["text"])
    if tree is None:
        return None
    chat = [(node.name, src, summary, sig, safe_tool_spec(node, summary))
            for node, src, summary, sig in documented_functions(f, tree)]
    lines = f["text"].split("\n")
    defs = [f"# file: {f['path']}\n{src}\n" for _, src, _, _ in documented_functions(f, tree, *FUNCTION_BYTES)]
    defs += [f"# file: {f['path']}\n{src.rstrip()}\n" for _, src in small_classes(tree, lines)]
    return chat, defs


class TrainFacts:
    """file_facts of the train files in sha1 order, for steps 7 and 9, which both read them in that
    order and stop early. Parsing is most of the corpus's time, so worker processes parse every
    file once, ahead of the two readers, and the second reader reuses what the first one read.
    Iterating yields (file, chat, definitions) of the files that parse."""

    def __init__(self, files, processes=None):
        self.files = sorted(files, key=lambda f: f["sha1"])
        self.pool = multiprocessing.Pool(processes or os.cpu_count())
        self.results = self.pool.imap(file_facts, self.files, chunksize=8)
        self.done = []

    def __iter__(self):
        i = 0
        while i < len(self.files):
            if i == len(self.done):
                self.done.append(next(self.results))
            if self.done[i] is not None:
                yield (self.files[i], *self.done[i])
            i += 1

    def close(self):
        self.pool.terminate()
        self.pool.join()


def code_prompts(files, render, seen_lines):
    """Held-out prompts for the ast.parse check: `function` and `class` are a file prefix
    (header line + the definition down to the end of its docstring) that the model continues;
    `chat` is a code request rendered with the generation prompt. Definitions whose first line
    is in seen_lines are skipped."""
    found = {k: [] for k in PROMPT_COUNTS}
    for f in files:
        tree = parse(f["text"])
        if tree is None:
            continue
        lines = f["text"].split("\n")
        for node, src, summary, sig in documented_functions(f, tree, *FUNCTION_BYTES):
            if lines[node.lineno - 1].rstrip() in seen_lines:
                continue
            h = hashlib.sha1(src.encode()).hexdigest()
            body0 = node.body[0]
            head = "\n".join(lines[node.lineno - 1:body0.end_lineno]) + "\n"
            found["function"].append((h, {"kind": "function", "path": f["path"],
                                          "prompt": f"# file: {f['path']}\n{head}"}))
            request = REQUESTS[int(h[:4], 16) % len(REQUESTS)].format(sig=sig, name=node.name, doc=summary)
            found["chat"].append((h, {"kind": "chat", "path": f["path"], "request": request,
                                      "prompt": render([{"role": "user", "content": request}],
                                                       add_generation_prompt=True, thinking_mode="disabled")}))
        for node, src in small_classes(tree, lines):
            if lines[node.lineno - 1].rstrip() in seen_lines:
                continue
            head = "\n".join(lines[node.lineno - 1:node.body[0].end_lineno]) + "\n"
            h = hashlib.sha1(src.encode()).hexdigest()
            found["class"].append((h, {"kind": "class", "path": f["path"], "prompt": f"# file: {f['path']}\n{head}"}))
    out = []
    for kind, count in PROMPT_COUNTS.items():
        out += [p for _, p in sorted(found[kind], key=lambda x: x[0])[:count]]
    return out


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
    ap.add_argument("--train-mb", type=float, default=1024.0)
    ap.add_argument("--heldout-mb", type=float, default=3.0)
    ap.add_argument("--extra", help="unpacked tools/train/debian_sources.py archive: more train files")
    args = ap.parse_args()
    t0 = time.time()
    os.makedirs(args.out, exist_ok=True)
    roots = source_roots()
    files, rejected = collect(roots)
    held = [f for f in files if int(f["sha1"][:8], 16) % 100 < HELDOUT_PERCENT]
    train = [f for f in files if int(f["sha1"][:8], 16) % 100 >= HELDOUT_PERCENT]
    train = cap(sorted(train, key=lambda f: (f["root"], f["path"])), int(args.train_mb * 2**20))
    held = cap(sorted(held, key=lambda f: (f["root"], f["path"])), int(args.heldout_mb * 2**20))
    render = chat_renderer()
    # The prompts come from the machine's own split alone, so --extra leaves them unchanged.
    prompts = code_prompts(held, render, definition_lines(train))
    extra_info = None
    if args.extra:
        extra, extra_rejected = collect_extra(os.path.realpath(args.extra), {f["sha1"] for f in files})
        kept = leak_free(extra, held, prompts)
        extra_info = {"dir": args.extra, "files": len(extra), "rejected": extra_rejected,
                      "dropped_for_leaks": len(extra) - len(kept), "kept_files": len(kept),
                      "kept_bytes": sum(f["bytes"] for f in kept)}
        train = train + kept
    train_docs = [document(f) for f in train]
    train_bytes = sum(len(d) for d in train_docs)

    facts = TrainFacts(train)
    chats, chat_bytes = [], 0
    for text in chat_documents(facts, render):
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
                     "chat_fraction": CHAT_FRACTION, "defs_mb": DEFS_MB, "template": str(TEMPLATE.relative_to(REPO))},
        "files_seen_unique": len(files), "files_rejected": rejected,
        "train_files": len(train), "heldout_files": len(held), "train_bytes": train_bytes,
        "heldout_bytes": sum(f["bytes"] for f in held), "extra": extra_info, "chat_documents": len(chats), "chat_bytes": chat_bytes,
        "packages": sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
                           if d.metadata["Name"]),
    }
    info["train_jsonl_sha256"] = write_jsonl(os.path.join(args.out, "train.jsonl"), docs)
    info["heldout_jsonl_sha256"] = write_jsonl(os.path.join(args.out, "heldout.jsonl"), [document(f) for f in held])
    # Step 9: definition documents and the chat documents again, for fine-tunes that weight them
    # (train.py --defs-frac); train split only, so nothing here is held out.
    defs, defs_bytes = [], 0
    for text in definition_documents(facts):
        if defs_bytes + len(text) > DEFS_MB * 2**20:
            break
        defs.append(text)
        defs_bytes += len(text)
    facts.close()
    info["definition_documents"] = len(defs)
    info["definition_bytes"] = defs_bytes
    info["defs_jsonl_sha256"] = write_jsonl(os.path.join(args.out, "defs.jsonl"), interleave(defs, chats))
    info["code_prompts"] = {k: sum(p["kind"] == k for p in prompts) for k in PROMPT_COUNTS}
    with open(os.path.join(args.out, "code_prompts.json"), "w", encoding="utf-8") as fh:
        json.dump({"about": "held-out code prompts of tools/train/corpus.py (step 8), for tools/train/eval_code.py",
                   "prompts": prompts}, fh, indent=1, ensure_ascii=False)
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
