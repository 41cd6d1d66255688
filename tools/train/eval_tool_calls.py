#!/usr/bin/env python3
"""Does the small model still call tools? A fine-tune aimed at code (stage d, expert iteration)
must not cost the M3 tool-call markup the model learnt from the chat documents. This sends chat
requests that each offer one tool and ask for what it does, through a live `m3serve serve` with
the minimax_m3 reasoning and tool-call parsers and tool_choice auto, and counts the answers whose
first parsed tool call names the offered tool with arguments that are a JSON object (what the
parser hands an agent).

The tools and requests below are written for this check (none comes from the corpus). Each is sent
once greedily and, with --samples N, N times at temperature 0.8 with a seed per request.

Usage: python3 tools/train/eval_tool_calls.py --m3serve build/bin/m3serve [--model DIR]
           [--samples 3] [--device cpu|cuda] [--out FILE]
"""
import argparse
import concurrent.futures
import json
import os
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eval_code  # noqa: E402

# (name, description, {parameter: JSON type}, request)
TOOLS = [
    ("read_file", "Read a text file and return its contents.", {"path": "string"},
     "Please read the file /etc/hosts."),
    ("parse_version", "Parse a version string into a tuple of ints.", {"version": "string"},
     "Parse the version 3.11.4 for me."),
    ("resize_image", "Resize an image to the given width and height.",
     {"path": "string", "width": "integer", "height": "integer"}, "Resize photo.png to 640 by 480."),
    ("get_weather", "Return the current weather for a city.", {"city": "string"},
     "What is the weather in Paris?"),
    ("slugify", "Convert a title to a URL slug.", {"text": "string"},
     "Make a slug out of 'Hello World Again'."),
    ("count_lines", "Count the lines of a file.", {"path": "string"},
     "How many lines does setup.py have?"),
    ("send_email", "Send an email.", {"to": "string", "subject": "string"},
     "Email bob@example.com with the subject Lunch."),
    ("md5sum", "Compute the md5 hex digest of a file.", {"path": "string"},
     "Give me the md5 of data.bin."),
]


def request(port, model, tool, temperature, seed, timeout):
    name, desc, params, ask = tool
    body = {"model": model, "messages": [{"role": "user", "content": ask}], "max_tokens": 200,
            "temperature": temperature, "seed": seed,
            "tools": [{"type": "function", "function": {
                "name": name, "description": desc,
                "parameters": {"type": "object", "properties": {k: {"type": t} for k, t in params.items()},
                               "required": list(params)}}}]}
    try:
        res = eval_code.post(port, "/v1/chat/completions", body, timeout)
    except OSError as e:
        return {"tool": name, "temperature": temperature, "passed": False, "error": str(e)}
    msg = res["choices"][0]["message"]
    calls = msg.get("tool_calls") or []
    passed = False
    if calls and calls[0]["function"]["name"] == name:
        try:
            passed = isinstance(json.loads(calls[0]["function"]["arguments"]), dict)
        except ValueError:
            pass
    reasoning = msg.get("reasoning_content") or msg.get("reasoning") or ""
    return {"tool": name, "temperature": temperature, "passed": passed,
            "finish_reason": res["choices"][0].get("finish_reason"),
            "call": calls[0]["function"] if calls else None, "content": (msg.get("content") or "")[:300],
            "reasoning": reasoning[:300]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m3serve", required=True)
    ap.add_argument("--model", default="models/minimax-m3-small")
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--kv-cache-dtype", default="nvfp4")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out")
    args = ap.parse_args()
    jobs = [(t, 0.0, i) for i, t in enumerate(TOOLS)]
    jobs += [(t, 0.8, 100 * (s + 1) + i) for s in range(args.samples) for i, t in enumerate(TOOLS)]
    port = eval_code.free_port()
    t0 = time.time()
    server = eval_code.start_server(args, port, ["--reasoning-parser", "minimax_m3", "--tool-call-parser",
                                                 "minimax_m3", "--enable-auto-tool-choice"])
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
            model = json.loads(r.read())["data"][0]["id"]
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            results = list(pool.map(lambda j: request(port, model, *j, args.timeout), jobs))
    finally:
        server.terminate()
        server.wait(timeout=30)
    summary = {}
    for mode, temp in (("greedy", 0.0), ("sampled", 0.8)):
        rows = [r for r in results if r["temperature"] == temp]
        if rows:
            summary[mode] = f"{sum(r['passed'] for r in rows)}/{len(rows)}"
            print(f"{mode}: {summary[mode]} answers call the offered tool with JSON-object arguments")
    print(f"{len(results)} requests in {time.time() - t0:.0f} s")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"model": args.model, "summary": summary, "results": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
