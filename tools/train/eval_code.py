#!/usr/bin/env python3
"""Does the small model write Python that parses? Completions of held-out code prompts through a
live `m3serve serve`, checked with ast.parse.

The prompts (tests/model_small/code_prompts.json, written by corpus.py step 8 from held-out files,
none of whose definition lines occurs in the train split) are of three kinds:
  function  a file header and a top-level `def` down to the end of its docstring: the model writes
            the body;
  class     the same for a small documented class;
  chat      a code request in the M3 chat format (thinking disabled): the model answers.
A completion passes when
  function / class: the prompt's definition + the completion, cut where the definition ends (the
            first non-blank line at column 0 after it, or the end of the text), parses, and the
            definition has at least one statement after its docstring (a bare docstring parses
            too, so it does not count);
  chat:     the answer holds a closed ```python block that parses and defines a function or class.
Each prompt is completed greedily and, with --sampled, at temperature 0.8 / top-p 0.95 with a
per-prompt seed (so runs repeat). The chat prompts disable thinking; --thinking adaptive|enabled
rewrites them to that mode (the system turn's mode line, no closed think tag after the assistant
marker), keeps special tokens in the answers, and also counts the answers that open their turn
as the template does (turn_opens_right: <mm:think>...</mm:think> or a bare </mm:think>), which is
what lets a client's reasoning parser find the reasoning. Stop strings end a completion once the
next top-level definition starts; max_tokens bounds the rest.

Needs only python3 and a built m3serve. Prints the pass rate per kind and mode; --min-rate makes
it a check (exit 1 below the rate in any mode), as tests/model_small runs it in CI.

Usage: python3 tools/train/eval_code.py --m3serve build/bin/m3serve [--model models/minimax-m3-small]
           [--prompts tests/model_small/code_prompts.json] [--count N] [--sampled]
           [--kv-cache-dtype nvfp4] [--device cpu|cuda] [--thinking disabled|adaptive|enabled]
           [--out FILE] [--min-rate 0.8]
"""
import argparse
import ast
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

STOPS = ["\n\n\n", "\ndef ", "\nclass ", "\n@", "\nif __name__"]
THINK_OPEN, THINK_CLOSED = "<mm:think>", "</mm:think>"
THINKING_LINES = {  # the chat template's mode lines (text/templates/minimax_m3.jinja)
    "disabled": "Current thinking mode: disabled. Do not output any thinking process.",
    "adaptive": "Current thinking mode: adaptive. You are encouraged to think for complex decision-making, "
                "multi-step reasoning, or when analyzing function/tool results.",
    "enabled": "Current thinking mode: enabled. You MUST think step by step before every response, including "
               "after receiving function/tool results.",
}
MAX_TOKENS = {"function": 320, "class": 384, "chat": 400}
SAMPLED = {"temperature": 0.8, "top_p": 0.95}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body, timeout):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def start_server(args, port, extra_args=()):
    """m3serve serve of args.model (args: m3serve, model, kv_cache_dtype, concurrency, device),
    answering /health."""
    cmd = [args.m3serve, "serve", args.model, "--host", "127.0.0.1", "--port", str(port),
           "--kv-cache-dtype", args.kv_cache_dtype, "--max-num-seqs", str(args.concurrency),
           "--device", args.device, *extra_args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"m3serve serve exited ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("m3serve serve did not answer /health within 120 s")


def definition_end(lines):
    """Index of the first line after the definition that starts at column 0 (not blank)."""
    for i, line in enumerate(lines[1:], 1):
        if line.strip() and not line[0].isspace():
            return i
    return len(lines)


def check_definition(prompt, completion):
    """(passed, text that was parsed) for a function / class prompt."""
    head = prompt.split("\n", 1)[1]  # drop the '# file:' header line
    lines = (head + completion).split("\n")
    text = "\n".join(lines[:definition_end(lines)]).rstrip() + "\n"
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False, text
    node = tree.body[0] if tree.body else None
    ok = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and len(node.body) >= 2
    return ok, text


def check_chat(completion):
    start = completion.find("```python\n")
    if start < 0:
        return False, ""
    end = completion.find("\n```", start + 10)
    if end < 0:
        return False, completion[start + 10:]
    code = completion[start + 10:end] + "\n"
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False, code
    ok = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in tree.body)
    return ok, code


def turn_opens_right(prompt, text):
    """Does the assistant turn `text` (special tokens kept) open as the chat template writes one?
    After a prompt that closed the think tag (thinking disabled): no think tags at all. Otherwise:
    the reasoning in <mm:think>...</mm:think>, or a bare </mm:think>. A turn that drops the tags
    puts its reasoning where a client reads the answer (the reasoning parser finds nothing)."""
    if prompt.endswith(THINK_CLOSED):
        return THINK_OPEN not in text and THINK_CLOSED not in text
    if text.startswith(THINK_CLOSED):
        return THINK_OPEN not in text and text.count(THINK_CLOSED) == 1
    return text.startswith(THINK_OPEN) and text.count(THINK_OPEN) == 1 and text.count(THINK_CLOSED) == 1


def with_thinking(prompt, mode):
    """A thinking-disabled chat prompt rewritten to thinking `mode`, as the template renders it."""
    if mode == "disabled":
        return prompt
    disabled = THINKING_LINES["disabled"]
    if disabled not in prompt or not prompt.endswith(THINK_CLOSED):
        raise SystemExit("--thinking: a chat prompt is not a thinking-disabled M3 chat prompt")
    return prompt.replace(disabled, THINKING_LINES[mode])[:-len(THINK_CLOSED)]


def complete(port, model, prompt, mode, index, extra, timeout, seed_base=1000, max_tokens=None):
    """One completion of prompt (kind, prompt) as this check makes it, and its verdict; a kind
    other than function / class / chat (gen_targets.py's tool prompts) needs max_tokens, gets no
    stop strings, and is left to the caller to judge (passed None)."""
    kind = prompt["kind"]
    body = {"model": model, "prompt": prompt["prompt"], "max_tokens": max_tokens or MAX_TOKENS[kind],
            "temperature": 0.0, **extra}
    if kind in ("function", "class"):
        body["stop"] = STOPS
    if mode == "sampled":
        body.update(SAMPLED, seed=seed_base + index)
    try:
        res = post(port, "/v1/completions", body, timeout)
    except (urllib.error.URLError, OSError) as e:  # a timeout on a slow machine counts as a failure
        return {"index": index, "kind": prompt["kind"], "mode": mode, "passed": False, "finish_reason": None,
                "completion_tokens": 0, "completion": "", "error": str(e)}
    choice = res["choices"][0]
    text = choice["text"]
    row = {}
    if kind == "chat":
        ok, _ = check_chat(text)
        if not prompt["prompt"].endswith(THINK_CLOSED):
            row["tags_right"] = turn_opens_right(prompt["prompt"], text)
    elif kind in ("function", "class"):
        ok, _ = check_definition(prompt["prompt"], text)
    else:
        ok = None
    return {"index": index, "kind": prompt["kind"], "mode": mode, "passed": ok,
            "finish_reason": choice.get("finish_reason"), "completion_tokens": res["usage"]["completion_tokens"],
            "completion": text, **row}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m3serve", required=True)
    ap.add_argument("--model", default="models/minimax-m3-small")
    ap.add_argument("--prompts", default="tests/model_small/code_prompts.json")
    ap.add_argument("--count", type=int, help="use every k-th prompt so that N are used (all kinds)")
    ap.add_argument("--sampled", action="store_true", help="also complete at temperature 0.8")
    ap.add_argument("--kv-cache-dtype", default="nvfp4")
    ap.add_argument("--device", default="cpu", help="m3serve's --device: cpu (the reference, as CI runs it) or cuda")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=3600, help="seconds one completion may take")
    ap.add_argument("--repetition-penalty", type=float,
                    help="sent with every request (default: none, so generation_config.json's applies)")
    ap.add_argument("--thinking", choices=sorted(THINKING_LINES), default="disabled",
                    help="thinking mode of the chat prompts (they are written disabled)")
    ap.add_argument("--out")
    ap.add_argument("--min-rate", type=float)
    args = ap.parse_args()
    prompts = json.load(open(args.prompts))["prompts"]
    prompts = [{**p, "prompt": with_thinking(p["prompt"], args.thinking)} if p["kind"] == "chat" else p
               for p in prompts]
    if args.count and args.count < len(prompts):
        stride = len(prompts) / args.count
        prompts = [prompts[int(i * stride)] for i in range(args.count)]
    modes = ["greedy"] + (["sampled"] if args.sampled else [])
    extra = {} if args.repetition_penalty is None else {"repetition_penalty": args.repetition_penalty}
    if args.thinking != "disabled":  # the think tags are special tokens
        extra["skip_special_tokens"] = False
    port = free_port()
    t0 = time.time()
    server = start_server(args, port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
            model = json.loads(r.read())["data"][0]["id"]
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            jobs = [pool.submit(complete, port, model, p, m, i, extra, args.timeout) for m in modes for i, p in enumerate(prompts)]
            results = [j.result() for j in jobs]
    finally:
        server.terminate()
        server.wait(timeout=30)
    seconds = time.time() - t0
    summary, failed = {}, False
    for mode in modes:
        rows = [r for r in results if r["mode"] == mode]
        kinds = {k: [r["passed"] for r in rows if r["kind"] == k] for k in MAX_TOKENS}
        rate = sum(r["passed"] for r in rows) / len(rows)
        summary[mode] = {"rate": round(rate, 4), "passed": sum(r["passed"] for r in rows), "prompts": len(rows),
                         **{k: f"{sum(v)}/{len(v)}" for k, v in kinds.items() if v}}
        tagged = [r["tags_right"] for r in rows if "tags_right" in r]
        if tagged:
            summary[mode]["chat_tags_right"] = f"{sum(tagged)}/{len(tagged)}"
        print(f"{mode}: {summary[mode]['passed']}/{len(rows)} parse ({100 * rate:.1f}%); " +
              ", ".join(f"{k} {summary[mode][k]}" for k in MAX_TOKENS if k in summary[mode]) +
              (f"; think tags as the template writes them: {summary[mode]['chat_tags_right']}" if tagged else ""))
        if args.min_rate is not None and rate < args.min_rate:
            print(f"FAIL: {mode} rate {rate:.3f} is below {args.min_rate}")
            failed = True
    tokens = sum(r["completion_tokens"] for r in results)
    errors = sum("error" in r for r in results)
    print(f"{len(results)} completions, {tokens} tokens in {seconds:.0f} s" +
          (f"; {errors} failed to complete (HTTP errors or timeouts)" if errors else ""))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"model": args.model, "kv_cache_dtype": args.kv_cache_dtype, "device": args.device,
                       "sampled": SAMPLED, "request_extra": extra, "thinking": args.thinking,
                       "max_tokens": MAX_TOKENS, "stops": STOPS, "summary": summary, "seconds": round(seconds, 1),
                       "results": results}, fh, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
