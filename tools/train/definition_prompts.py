"""Definition prompts made from the train split, and what counts as a good completion of one: the
shared part of stage e's two generators (self_train.py on the training path, gen_targets.py
through m3serve). Plain Python (no torch, no numpy), so gen_targets.py runs anywhere m3serve does.

Prompts (prompt_of_document) come from the definition documents of corpus.py step 9 (defs.jsonl,
train split only), in the shapes of the held-out code prompts of step 8:
  function / class  "# file: <path>\\n" + the definition down to the end of its docstring;
  chat              a code request in the M3 chat format, cut after the assistant marker (and the
                    closed think tag in thinking-disabled turns);
  tool              a tool exchange in the M3 chat format (tools offered in the developer turn, a
                    request for one of them), cut the same way: the model writes its reasoning,
                    if any, and the call (the shape tools/train/eval_tool_calls.py measures).
prompts_in_order yields the code kinds (KINDS) unless asked for others.

A completion is a target (target_text) when it passes eval_code.py's own check (the same
functions, imported; for a tool prompt, check_tool_call: the turn ends in one well-formed call
of an offered tool) and it does not loop: no line of it loops (looping_lines) and no stretch of
it repeats itself within a line (repeated_runs). A model that is taught its own loops as targets
learns to loop.
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
TURN_END = "[e~["
THINK_OPEN, THINK_CLOSED = eval_code.THINK_OPEN, eval_code.THINK_CLOSED
NS = "]<]minimax[>["  # the namespace of every tool-call tag (text/templates/minimax_m3.jinja)
CALL_OPEN, CALL_CLOSE = NS + "<tool_call>\n", NS + "</tool_call>"
KINDS = ("function", "class", "chat")  # the kinds of eval_code.py's held-out prompts
ALL_KINDS = KINDS + ("tool",)
# The longest completion of each kind: eval_code.py's, and eval_tool_calls.py's for a tool call.
MAX_TOKENS = {**eval_code.MAX_TOKENS, "tool": 200}


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
        turn = doc[cut:doc.find(TURN_END, cut)] if TURN_END in doc[cut:] else doc[cut:]
        if CALL_OPEN in turn and offered_tools(doc[:cut]):
            return "tool", doc[:cut]
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


def prompts_in_order(defs_jsonl, seed, kinds=KINDS):
    """(kind, prompt text) of the definition documents of defs.jsonl that give a prompt of one of
    `kinds`, in a seeded random order (a generator: callers stop when they have enough)."""
    with open(defs_jsonl, encoding="utf-8") as fh:
        docs = [json.loads(line) for line in fh if line.strip()]
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    for i in order:
        p = prompt_of_document(docs[i])
        if p is not None and p[0] in kinds:
            yield p


TOOL_LINE = re.compile(r"^<tool>(.*)</tool>$", re.M)


def offered_tools(prompt):
    """{name: (parameter names, required names)} of the <tools> list in the prompt's developer
    turn (the template writes one JSON function per <tool> line)."""
    out = {}
    for m in TOOL_LINE.finditer(prompt):
        try:
            fn = json.loads(m.group(1))
            params = fn.get("parameters") or {}
            out[fn["name"]] = (set(params.get("properties") or {}), set(params.get("required") or []))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


def parse_tags(text, i=0):
    """The NS-tagged elements at text[i:] as [(tag, value)] and the index after them; a value is
    the text between the tags or, when it opens with a tag itself, the nested elements. Raises
    ValueError on a tag that does not close."""
    out = []
    while text.startswith(NS + "<", i) and not text.startswith(NS + "</", i):
        j = text.find(">", i + len(NS))
        if j < 0:
            raise ValueError("unclosed tag")
        tag = text[i + len(NS) + 1:j]
        i = j + 1
        if text.startswith(NS + "<", i) and not text.startswith(NS + "</", i):
            value, i = parse_tags(text, i)
        else:
            k = text.find(NS, i)
            if k < 0:
                raise ValueError(f"<{tag}> does not close")
            value, i = text[i:k], k
        close = f"{NS}</{tag}>"
        if not text.startswith(close, i):
            raise ValueError(f"<{tag}> closed by something else")
        out.append((tag, value))
        i += len(close)
    return out, i


# Does a chat or tool turn open with the template's think tags? (eval_code.py's check, shared.)
turn_opens_right = eval_code.turn_opens_right


INVOKE = re.compile(re.escape(NS) + r'<invoke name="([^"<>]+)">')


def check_tool_call(prompt, text, ended):
    """Is the assistant turn `text` (the completion of a tool prompt, up to the end-of-turn id;
    ended: that id came) a call an agent can use? The turn opens as the template writes one
    (turn_opens_right). Then optional words, then exactly
    one tool-call block, closed, at the end of the turn; every invoke in it names an offered tool,
    gives only that tool's parameters, each once, and all its required ones, in well-formed tags."""
    tools = offered_tools(prompt)
    if not ended or not tools or text.count(CALL_OPEN) != 1 or not turn_opens_right(prompt, text):
        return False
    start = text.index(CALL_OPEN) + len(CALL_OPEN)
    end = text.find(CALL_CLOSE, start)
    if end < 0 or text[end + len(CALL_CLOSE):].strip():
        return False
    block, i, calls = text[start:end], 0, 0
    while i < len(block):
        m = INVOKE.match(block, i)
        if m is None or m.group(1) not in tools:
            return False
        try:
            args, i = parse_tags(block, m.end())
        except ValueError:
            return False
        close = NS + "</invoke>\n"
        if not block.startswith(close, i):
            return False
        i += len(close)
        names, required = tools[m.group(1)]
        given = [tag for tag, _ in args]
        if len(set(given)) != len(given) or not set(given) <= names or not required <= set(given):
            return False
        calls += 1
    return calls > 0


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


RUN = re.compile(r"(.{4,40}?)\1{3,}")


def repeated_runs(text):
    """The stretches of text that repeat one unit of 4-40 characters, holding two different
    non-blank characters, four or more times in a row (`prec=prec, prec=prec, ...`,
    `path="config", path="config", ...`): the loop inside one line that looping_lines cannot see.
    Runs of one character (`# ======`) and short repeats are ordinary text."""
    return [m.group(0) for m in RUN.finditer(text) if len(set(m.group(1).replace(" ", ""))) >= 2]


def target_text(kind, prompt, text, ended):
    """(passed, target) of one completion `text` of `prompt`, as m3serve returned it (stop strings
    applied) or cut_completion cut it; ended: the end-of-turn id came. passed is eval_code.py's
    verdict; target is the text to train on after the prompt (the caller adds the end-of-turn id)
    or None: the definition down to where it ends, the chat answer down to its closing fence
    (all of it when it ended there), or the whole turn of a tool call. A looping target is None
    even when it passes, and so is a chat answer whose think tags are not the template's
    (turn_opens_right; chat and tool text must keep its special tokens)."""
    if kind == "tool":
        if not check_tool_call(prompt, text, ended):
            return False, None
        body = text
    elif kind == "chat":
        ok, _ = eval_code.check_chat(text)
        if not ok:
            return False, None
        if not turn_opens_right(prompt, text):  # it parses, but a client would get it wrong
            return True, None
        start = text.find("```python\n")
        body = text if ended else text[:text.find("\n```", start + 10) + 4]
    else:
        ok, parsed = eval_code.check_definition(prompt, text)
        head = prompt.split("\n", 1)[1]
        if not ok or not parsed.startswith(head) or len(parsed) <= len(head):
            return ok, None
        body = parsed[len(head):]
    return True, (None if looping_lines(body) or repeated_runs(body) else body)
