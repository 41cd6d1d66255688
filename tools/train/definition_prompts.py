"""Definition prompts made from the train split, and what counts as a good completion of one: the
shared part of stage e's two generators (self_train.py on the training path, gen_targets.py
through m3serve). Plain Python (no torch, no numpy), so gen_targets.py runs anywhere m3serve does.

Prompts (prompt_of_document) come from the definition documents of corpus.py step 9 (defs.jsonl,
train split only), in the shapes of the held-out code prompts of step 8:
  function / class  "# file: <path>\\n" + the definition down to the end of its docstring;
  chat              a code request in the M3 chat format, cut after the assistant marker (and the
                    closed think tag in thinking-disabled turns).
Tool-call exchanges are left to the language-model stream.

A completion is a target (target_text) when it passes eval_code.py's own check (the same
functions, imported) and no line of it loops (looping_lines): a model that is taught its own
loops as targets learns to loop.
"""
import ast
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
import eval_code  # noqa: E402

CHAT_START = "]~!b["
ASSISTANT = "]~b]ai\n"
THINK_CLOSED = "</mm:think>"
KINDS = ("function", "class", "chat")


def prompt_of_document(doc):
    """(kind, prompt text) of a definition document, or None when it is not one of the prompt
    shapes (a tool exchange, a definition without a docstring and a statement after it)."""
    if doc.startswith(CHAT_START):
        i = doc.find(ASSISTANT)
        if i < 0:
            return None
        cut = i + len(ASSISTANT)
        if doc.startswith(THINK_CLOSED, cut):
            cut += len(THINK_CLOSED)
        if "```python\n" not in doc[cut:] or "<tool_call>" in doc[cut:]:
            return None
        return "chat", doc[:cut]
    if not doc.startswith("# file: "):
        return None
    header, src = doc.split("\n", 1)
    tree = corpus.parse(src)
    if tree is None or not tree.body:
        return None
    node = tree.body[0]
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return None
    if ast.get_docstring(node) is None or len(node.body) < 2:
        return None
    lines = src.split("\n")
    head = "\n".join(lines[node.lineno - 1:node.body[0].end_lineno]) + "\n"
    kind = "class" if isinstance(node, ast.ClassDef) else "function"
    return kind, f"{header}\n{head}"


def prompts_in_order(defs_jsonl, seed):
    """(kind, prompt text) of the definition documents of defs.jsonl that give a prompt, in a seeded
    random order (a generator: callers stop when they have enough)."""
    with open(defs_jsonl, encoding="utf-8") as fh:
        docs = [json.loads(line) for line in fh if line.strip()]
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    for i in order:
        p = prompt_of_document(docs[i])
        if p is not None:
            yield p


def cut_completion(kind, text):
    """The completion as m3serve's stop strings would end it (function / class), and whether the
    row is finished: a stop string, or a column-0 line after the definition, has appeared."""
    if kind == "chat":
        return text, False
    ends = [i for i in (text.find(s) for s in eval_code.STOPS) if i >= 0]
    if ends:
        return text[:min(ends)], True
    return text, False


IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
LITERAL = re.compile(r"\d+(\.\d*)?|'[^']*'|\"[^\"]*\"")


def looping_lines(text, min_chars=12, near_after=3):
    """Indices of the lines of text that repeat an earlier line exactly, or that have the shape of
    more than `near_after` earlier lines (identifiers, numbers and strings masked, so
    `elif isinstance(a, str):` after `elif isinstance(b, str):`). Lines shorter than min_chars once
    stripped (`else:`, `return None`, `)`) are ordinary repeats and are ignored. The text form of
    m3small.repeated_lines, which works on token ids."""
    exact, shapes, out = set(), {}, []
    for i, line in enumerate(text.split("\n")):
        s = line.strip()
        if len(s) < min_chars:
            continue
        shape = IDENTIFIER.sub("x", LITERAL.sub("0", line.rstrip()))
        if s in exact or shapes.get(shape, 0) >= near_after:
            out.append(i)
        exact.add(s)
        shapes[shape] = shapes.get(shape, 0) + 1
    return out


def target_text(kind, prompt, text, ended):
    """(passed, target) of one completion `text` of `prompt`, as m3serve returned it (stop strings
    applied) or cut_completion cut it; ended: the end-of-turn id came. passed is eval_code.py's
    verdict; target is the text to train on after the prompt (the caller adds the end-of-turn id)
    or None: the definition down to where it ends, or the chat answer down to its closing fence
    (all of it when it ended there). A looping target is None even when it parses."""
    if kind == "chat":
        ok, _ = eval_code.check_chat(text)
        if not ok:
            return False, None
        start = text.find("```python\n")
        body = text if ended else text[:text.find("\n```", start + 10) + 4]
    else:
        ok, parsed = eval_code.check_definition(prompt, text)
        head = prompt.split("\n", 1)[1]
        if not ok or not parsed.startswith(head) or len(parsed) <= len(head):
            return ok, None
        body = parsed[len(head):]
    return True, (None if looping_lines(body) else body)
