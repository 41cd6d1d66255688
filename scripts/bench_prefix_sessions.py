#!/usr/bin/env python3
"""Prefix-cache reuse of concurrent multi-turn sessions against a running m3serve (or any
OpenAI-compatible server with vLLM's /metrics): SESSIONS sessions at once, each TURNS turns of
/v1/completions whose token-id prompt is the last turn's prompt plus 16 answer-sized ids plus 120
new ones. Prints the prompt tokens the prefix cache served, against the most it could (every
full block of the last turn's prompt, each turn after the first). Under DEP this is what the
lane router (engine/lane_router) is for: a turn that lands on another lane finds nothing.

Usage: python3 scripts/bench_prefix_sessions.py --port 8000 [--sessions 8] [--turns 5] [--block 128]
Standard library only.
"""
import argparse
import json
import threading
import urllib.request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--block", type=int, default=128, help="the server's KV block size, for the ideal")
    args = ap.parse_args()
    base = "http://127.0.0.1:%d" % args.port

    def post(path, body):
        req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(req, timeout=600).read())

    def metric(name):
        text = urllib.request.urlopen(base + "/metrics").read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))

    def ids(session, turn, n):
        return [3 + (session * 7919 + turn * 104729 + i * 31) % 8000 for i in range(n)]

    ideal = [0]

    lock = threading.Lock()

    def session(s):
        prompt, previous = ids(s, 0, 300), None
        for t in range(args.turns):
            if previous is not None:
                with lock:
                    ideal[0] += (len(previous) // args.block) * args.block
            post("/v1/completions", {"prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True})
            previous = prompt
            prompt = prompt + ids(s, 100 + t, 16) + ids(s, t + 1, 120)

    queries0, hits0 = metric("vllm:prefix_cache_queries_total"), metric("vllm:prefix_cache_hits_total")
    threads = [threading.Thread(target=session, args=(s,)) for s in range(args.sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    queries = metric("vllm:prefix_cache_queries_total") - queries0
    hits = metric("vllm:prefix_cache_hits_total") - hits0
    print("prefix cache: %d of %d prompt tokens served from the cache (%.1f%%); the most possible %d (%.1f%%)" %
          (hits, queries, 100 * hits / queries, ideal[0], 100 * ideal[0] / queries))


if __name__ == "__main__":
    main()
