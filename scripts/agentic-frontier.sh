#!/usr/bin/env bash
# The agentic Pareto frontier of one m3serve (docs/agentic-bench.md): for each run of RUNS, serve
# MODEL with that KV cache (nvfp4, fp8; "+tier": with the host tier of TIER_GIB GiB) in a KV pool
# of KV_GIB GiB, sweep `m3serve bench agentic` over CONCURRENCY on one seeded synthetic corpus,
# then plot every run on one frontier and print each run's knee: the last level whose total
# tok/s still grew by KNEE_GAIN (10%) over the level before. Requests whose trace in + out pass
# MAX_MODEL_LEN - 1024 (room for the chat template and the cache-bust marker) are skipped and
# counted. Results, plots and logs in $OUT.
#   GPU (M3.1 shape, dummy weights): PREBUILT=build bash scripts/agentic-frontier.sh
#   CPU (the small model):           M3BIN=build/bin/m3serve DEVICE=cpu MODEL=models/minimax-m3-small \
#                                    MODEL_ARGS= KV_GIB=0.25 CONCURRENCY=1,2,4 bash scripts/agentic-frontier.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/agentic}
mkdir -p "$OUT"
if [[ -n "${PREBUILT:-}" ]]; then
  export LD_LIBRARY_PATH=$PWD/$PREBUILT/device-libs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
  M3BIN=${M3BIN:-$PREBUILT/bin/m3serve}
fi
M3BIN=${M3BIN:-build/bin/m3serve}
DEVICE=${DEVICE:-cuda}
MODEL=${MODEL:-bench/configs/minimax-m3.1}
MODEL_ARGS=${MODEL_ARGS---load-format dummy --num-layers 20}
TOKENIZER=${TOKENIZER:-models/minimax-m3-small}
RUNS=${RUNS:-nvfp4 fp8 nvfp4+tier}
KV_GIB=${KV_GIB:-1}
TIER_GIB=${TIER_GIB:-16}
CONCURRENCY=${CONCURRENCY:-1,2,4,8,16}
DURATION=${DURATION:-30}         # seconds per level
MAX_MODEL_LEN=${MAX_MODEL_LEN:-65536}
BATCHED_TOKENS=${BATCHED_TOKENS:-8192}
KNEE_GAIN=${KNEE_GAIN:-0.10}
PORT=${PORT:-18431}
# The corpus: turn 0 of 8K tokens (system + tools), about 1.2K new tokens and 150 out per turn,
# contexts up to 60K; think times scaled by 0.2 (median 1 s) and cut at 10 s.
GEN_ARGS=${GEN_ARGS:---num-sessions 64 --seed 1 --gen-system-tokens 2000 --gen-tool-tokens 6000 --gen-new-tokens 1200 --gen-output-tokens 150 --gen-max-context 60000}
REPLAY_ARGS=${REPLAY_ARGS:---think-time-scale 0.2 --idle-cap-seconds 10 --trajectory-start-min-ratio 0.25 --trajectory-start-max-ratio 0.75 --warmup-requests 1}

"$M3BIN" bench agentic --generate-traces "$OUT/traces.jsonl" $GEN_ARGS > "$OUT/generate.log" 2>&1 ||
  { echo "agentic: generating the corpus failed"; cat "$OUT/generate.log"; exit 1; }

wait_ready() {  # the server's /health answers 200, or it died
  for _ in $(seq 1 600); do
    kill -0 "$1" 2>/dev/null || return 1
    python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" \
      2>/dev/null && return 0
    sleep 0.5
  done
  return 1
}

results=()
labels=()
for run in $RUNS; do
  kv=${run%%+*}
  name=${run//+/-}
  args=(serve "$MODEL" $MODEL_ARGS --device "$DEVICE" --tokenizer "$TOKENIZER" --host 127.0.0.1 --port "$PORT"
        --served-model-name m3 --kv-cache-dtype "$kv" --attention-config "{\"indexer_kv_dtype\": \"$kv\"}"
        --kv-cache-memory "${KV_GIB}GiB" --max-model-len "$MAX_MODEL_LEN" --max-num-batched-tokens "$BATCHED_TOKENS"
        --max-num-seqs 64 --enable-prompt-tokens-details --disable-log-stats)
  label="$kv KV"
  if [[ "$run" == *+tier ]]; then
    args+=(--kv-offloading-size "$TIER_GIB")
    label="$kv KV + ${TIER_GIB} GiB host tier"
  fi
  "$M3BIN" "${args[@]}" > "$OUT/serve-$name.log" 2>&1 &
  pid=$!
  if ! wait_ready $pid; then
    echo "agentic $name: the server did not start"; tail -20 "$OUT/serve-$name.log"; kill $pid 2>/dev/null; continue
  fi
  "$M3BIN" bench agentic --traces "$OUT/traces.jsonl" --base-url "http://127.0.0.1:$PORT" --model m3 \
    --concurrency "$CONCURRENCY" --duration "$DURATION" --max-context-length $((MAX_MODEL_LEN - 1024)) \
    --tokenizer "$TOKENIZER" --num-gpus 1 --label "$label" --no-progress $REPLAY_ARGS \
    --output "$OUT/$name.json" > "$OUT/bench-$name.log" 2>&1
  echo "agentic $name: bench rc $?"
  curl -s "http://127.0.0.1:$PORT/metrics" > "$OUT/metrics-$name.txt" 2>/dev/null ||
    python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())" \
      > "$OUT/metrics-$name.txt" 2>/dev/null
  kill $pid; wait $pid 2>/dev/null
  [[ -s "$OUT/$name.json" ]] && results+=("$OUT/$name.json") && labels+=("$label")
done

((${#results[@]})) || { echo "agentic: no run produced results"; exit 1; }
joined=$(IFS=,; echo "${labels[*]}")
"$M3BIN" bench agentic --plot "$OUT/frontier.svg" --plot-png "$OUT/frontier.png" --labels "$joined" \
  --plot-title "m3serve agentic frontier ($DEVICE, $(basename "$MODEL"), KV pool ${KV_GIB} GiB)" "${results[@]}" \
  > "$OUT/plot.log" 2>&1 || { echo "agentic: plotting failed"; cat "$OUT/plot.log"; }

# One table per run, its knee, and the host tier's counters.
python3 - "$KNEE_GAIN" "${results[@]}" <<'EOF'
import json, os, re, sys
gain = float(sys.argv[1])
for path in sys.argv[2:]:
    report = json.load(open(path))
    runs = sorted(report["runs"], key=lambda r: r["concurrency"])
    print(f"== {report.get('label', path)}")
    print("  conc  total tok/s/GPU  out tok/s  interactivity  p90 TTFT ms  p90 TPOT ms  server hit  failed")
    for r in runs:
        t = r["throughput"]
        print(f"  {r['concurrency']:4d}  {t['total_tok_s_per_gpu']:15.0f}  {t['output_tok_s']:9.1f}  "
              f"{r['interactivity_tok_s_user']:13.2f}  {r['ttft_ms']['p90']:11.1f}  {r['tpot_ms']['p90']:11.2f}  "
              f"{r['prefix_cache']['server_hit_rate']:10.3f}  {r['requests']['failed']:6d}")
    knee = runs[0]["concurrency"]
    for prev, cur in zip(runs, runs[1:]):
        if cur["throughput"]["total_tok_s"] < prev["throughput"]["total_tok_s"] * (1 + gain):
            break
        knee = cur["concurrency"]
    last = knee == runs[-1]["concurrency"]
    print(f"  knee: {knee} sessions" + (" (still growing at the last level)" if last else ""))
    metrics = os.path.join(os.path.dirname(path), "metrics-" + os.path.basename(path)[:-5] + ".txt")
    if os.path.exists(metrics):
        text = open(metrics).read()
        for name in ("vllm:external_prefix_cache_hits_total", "m3:kv_offload_blocks_saved_ahead_total",
                     "m3:kv_offload_steps_waiting_total", "vllm:num_preemptions_total"):
            m = re.search(r"^" + re.escape(name) + r"(\{[^}]*\})? ([0-9.e+-]+)$", text, re.M)
            if m:
                print(f"  {name} {m.group(2)}")
EOF
