#!/usr/bin/env python3
"""Serving benchmark for `m3serve serve` (standard library only).

Measures requests/s, output tokens/s, time to first token and inter-token latency at several
concurrencies (streaming completions with fixed prompt and output lengths), then the prefix-cache
hit rate of a multi-turn chat workload (each turn re-sends the whole conversation, as agents do).

  scripts/bench_serve.py --binary build/bin/m3serve --model models/minimax-m3-tiny
  scripts/bench_serve.py --url http://127.0.0.1:8000          # an already running server
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "server"))
from live_server import LiveServer, open_stream, parse_sse  # noqa: E402


class Remote:
    """The bits of LiveServer the benchmark uses, for a server started elsewhere."""

    def __init__(self, url):
        host, port = url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
        self.port = int(port)
        self.request = LiveServer.request.__get__(self)
        self.post = LiveServer.post.__get__(self)
        self.metrics = LiveServer.metrics.__get__(self)
        self.metric = LiveServer.metric.__get__(self)

    def stop(self):
        return 0


def stream_once(port, path, body):
    """Returns (ttft_s, [inter-token gaps], output tokens, total_s)."""
    start = time.perf_counter()
    sock = open_stream(port, path, body)
    raw, stamps = b"", []
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            now = time.perf_counter()
            raw += chunk
            stamps.extend([now] * chunk.count(b"data: {"))
    finally:
        sock.close()
    total = time.perf_counter() - start
    head, _, body_raw = raw.partition(b"\r\n\r\n")
    data, rest = b"", body_raw
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        data, rest = data + rest[:size], rest[size + 2:]
    events, _ = parse_sse(data.decode())
    usage = next((e["usage"] for e in reversed(events) if e.get("usage")), None)
    tokens = usage["completion_tokens"] if usage else 0
    token_stamps = stamps[:-1] if usage else stamps  # the usage chunk carries no token
    ttft = (token_stamps[0] - start) if token_stamps else total
    gaps = [b - a for a, b in zip(token_stamps, token_stamps[1:])]
    return ttft, gaps, tokens, total


def run_level(server, concurrency, num_requests, prompt_words, output_tokens):
    words = "serve tokens fast on every core of the machine please".split()
    bodies = [{"prompt": "Request %d: %s" % (i, " ".join(words[(i + k) % len(words)] for k in range(prompt_words))),
               "max_tokens": output_tokens, "ignore_eos": True, "temperature": 0,
               "stream_options": {"include_usage": True}} for i in range(num_requests)]
    results, lock, next_index = [], threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= len(bodies):
                return
            r = stream_once(server.port, "/v1/completions", bodies[i])
            with lock:
                results.append(r)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    out_tokens = sum(r[2] for r in results)
    gaps = [g for r in results for g in r[1]]
    return {"concurrency": concurrency, "requests": len(results), "seconds": elapsed,
            "req_per_s": len(results) / elapsed, "out_tok_per_s": out_tokens / elapsed,
            "ttft_ms": 1000 * statistics.mean(r[0] for r in results),
            "itl_ms": 1000 * statistics.mean(gaps) if gaps else 0.0}


def run_multi_turn(server, conversations, turns, reply_tokens):
    hits0 = server.metric("vllm:prefix_cache_hits_total")
    queries0 = server.metric("vllm:prefix_cache_queries_total")
    cached, prompt = 0, 0
    system = ("You are a coding agent. Follow the repository conventions, run the tests after every change "
              "and report what you did. " * 12)

    def conversation(c):
        nonlocal cached, prompt
        messages = [{"role": "system", "content": system}]
        for t in range(turns):
            messages.append({"role": "user", "content": "Conversation %d, turn %d: next step please." % (c, t)})
            r = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": reply_tokens,
                                                     "ignore_eos": True, "temperature": 0})
            usage = r["usage"]
            if usage.get("prompt_tokens_details") is None:
                raise RuntimeError("the server reports no usage.prompt_tokens_details: start it with "
                                   "--enable-prompt-tokens-details")
            with lock:
                cached += usage["prompt_tokens_details"]["cached_tokens"]
                prompt += usage["prompt_tokens"]
            messages.append({"role": "assistant", "content": r["choices"][0]["message"]["content"] or ""})

    lock = threading.Lock()
    threads = [threading.Thread(target=conversation, args=(c,)) for c in range(conversations)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    hits = server.metric("vllm:prefix_cache_hits_total") - hits0
    queries = server.metric("vllm:prefix_cache_queries_total") - queries0
    return {"conversations": conversations, "turns": turns, "prompt_tokens": prompt, "cached_tokens": cached,
            "usage_hit_rate": cached / prompt if prompt else 0.0,
            "metrics_hit_rate": hits / queries if queries else 0.0}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/bin/m3serve")
    ap.add_argument("--model", default="models/minimax-m3-tiny")
    ap.add_argument("--url", help="benchmark a running server instead of starting one")
    ap.add_argument("--server-args", default="--max-model-len 2048 --kv-cache-memory 512MiB --max-num-seqs 64",
                    help="extra arguments for m3serve serve")
    ap.add_argument("--concurrency", default="1,8,64")
    ap.add_argument("--requests-per-level", type=int, default=0, help="default: max(16, 2 x concurrency)")
    ap.add_argument("--prompt-words", type=int, default=100)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = ap.parse_args()

    if args.url:
        server = Remote(args.url)
    else:
        server = LiveServer([args.binary, "serve", args.model, "--host", "127.0.0.1", "--port", "0",
                             "--enable-prompt-tokens-details", "--disable-log-stats"] + args.server_args.split())
    try:
        rows = []
        for level in [int(c) for c in args.concurrency.split(",")]:
            n = args.requests_per_level or max(16, 2 * level)
            rows.append(run_level(server, level, n, args.prompt_words, args.output_tokens))
        print("\nprompt ~%d words, %d output tokens per request, streaming /v1/completions" %
              (args.prompt_words, args.output_tokens))
        print("%11s %9s %9s %10s %13s %10s %9s" % ("concurrency", "requests", "seconds", "req/s", "output tok/s",
                                                   "TTFT ms", "ITL ms"))
        for r in rows:
            print("%11d %9d %9.2f %10.2f %13.1f %10.1f %9.2f" % (r["concurrency"], r["requests"], r["seconds"],
                                                                 r["req_per_s"], r["out_tok_per_s"], r["ttft_ms"],
                                                                 r["itl_ms"]))
        mt = run_multi_turn(server, args.conversations, args.turns, 16)
        print("\nmulti-turn chat: %d conversations x %d turns: prefix-cache hit rate %.1f%% of prompt tokens "
              "(usage.cached_tokens), %.1f%% (vllm:prefix_cache_hits_total / queries)" %
              (mt["conversations"], mt["turns"], 100 * mt["usage_hit_rate"], 100 * mt["metrics_hit_rate"]))
        if args.json:
            print(json.dumps({"levels": rows, "multi_turn": mt}, indent=2))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
