#!/usr/bin/env bash
# The main job: installs the dependencies, builds m3serve, serves the bundled small model
# (models/minimax-m3-small, NVFP4 KV cache as it was trained for) on loopback, and sends it a
# completion and a streamed chat request through the OpenAI API.
#
#   scripts/run-main.sh            # demo, then stop the server
#   scripts/run-main.sh --serve    # demo, then keep serving until Ctrl-C
# Environment: MODEL (default models/minimax-m3-small), PORT (default 8000), BUILD_DIR (build).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/minimax-m3-small}
PORT=${PORT:-8000}
BUILD_DIR=${BUILD_DIR:-build}
KEEP=0
[[ "${1:-}" == "--serve" ]] && KEEP=1

scripts/install-deps.sh
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" --target m3serve -j "${JOBS:-$(nproc)}"

LOG=$(mktemp /tmp/m3serve-main.XXXXXX.log)
"$BUILD_DIR/bin/m3serve" serve "$MODEL" --host 127.0.0.1 --port "$PORT" --served-model-name m3-small \
  --kv-cache-dtype nvfp4 --max-model-len 8192 --reasoning-parser minimax_m3 \
  --tool-call-parser minimax_m3 --enable-auto-tool-choice \
  --speculative-config '{"method": "dspark", "num_speculative_tokens": 3}' >"$LOG" 2>&1 &
SERVER=$!
stop_server() { kill -TERM "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; }
# (SIGTERM: a background job of a non-interactive shell ignores SIGINT.)
trap stop_server EXIT

for _ in $(seq 1 600); do
  if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then break; fi
  if ! kill -0 "$SERVER" 2>/dev/null; then cat "$LOG"; echo "m3serve exited during start-up" >&2; exit 1; fi
  sleep 0.1
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { cat "$LOG"; echo "m3serve did not become ready" >&2; exit 1; }
grep -E "KV cache|model |DSpark" "$LOG" || true

echo
echo "== POST /v1/completions (the model knows Python source code)"
curl -s "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' -d '{
  "model": "m3-small", "prompt": "import os\n\n\ndef list_python_files(root):\n    \"\"\"Return the .py files under root.\"\"\"\n",
  "max_tokens": 64, "temperature": 0.6, "seed": 1}' |
  /usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["choices"][0]["text"]); print("usage:", r["usage"])'

echo
echo "== POST /v1/chat/completions (streamed)"
curl -sN "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d '{
  "model": "m3-small", "stream": true, "max_tokens": 96, "temperature": 0.6, "seed": 1,
  "stream_options": {"include_usage": true},
  "messages": [{"role": "user", "content": "Write a Python function that reverses a string."}]}' |
  /usr/bin/python3 -c '
import json, sys
part = None  # the reasoning parser splits the turn: label each part where it starts
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("data: ") or line == "data: [DONE]":
        continue
    chunk = json.loads(line[6:])
    for c in chunk.get("choices", []):
        d = c.get("delta", {})
        for name, text in (("reasoning", d.get("reasoning_content") or d.get("reasoning")), ("answer", d.get("content"))):
            if text:
                if part != name:
                    sys.stdout.write(("\n" if part else "") + "[" + name + "] ")
                    part = name
                sys.stdout.write(text)
        sys.stdout.flush()
    if chunk.get("usage"):
        print("\nusage:", chunk["usage"])
'

echo
echo "== speculative decoding: the DSpark drafter (models/minimax-m3-small/dspark) drafts 3 tokens a step, the model keeps"
echo "   the ones it would have written itself (the text is the same as without it), from GET /metrics:"
curl -s "http://127.0.0.1:$PORT/metrics" | /usr/bin/python3 -c '
import re, sys
text = sys.stdin.read()
def total(name):
    m = re.search(r"^vllm:spec_decode_%s_total\{[^}]*\} ([0-9.e+]+)$" % name, text, re.M)
    return float(m.group(1)) if m else 0.0
steps, drafts, kept = total("num_drafts"), total("num_draft_tokens"), total("num_accepted_tokens")
if steps:
    print("   %d verification steps, %d of %d drafts kept: %.2f tokens a step (mean acceptance length)" % (
        steps, kept, drafts, 1 + kept / steps))
else:
    print("   no step verified drafts (the drafter proposed none)")
'

if ((KEEP)); then
  echo
  echo "serving $MODEL on http://127.0.0.1:$PORT/v1 (Ctrl-C to stop; log: $LOG)"
  wait "$SERVER"
fi
