#!/usr/bin/env bash
# Several builds of m3serve measured side by side in one device call (docs/gpu-backend-notes.md:
# before/after numbers come from builds run on the same machine, minutes apart). Each round runs
# every build once, in turn, so that drift of the machine shows as spread between rounds rather
# than as a difference between builds.
#
#   NEW=build-a BASES="build-b build-c" STEPS="correct prefill decode" scripts/gpu-compare-builds.sh
#
# NEW: a build prepared here with `PREBUILT=build-a scripts/gpu-check-model.sh prepare` (carry its
# device-pack-bin.txz and device-pack-libs.txz); BASES: builds of which only baseline-pack.txz is
# carried (bin/m3serve, backend_check and device-libs: the same prepare, then the pack copied to
# its own folder). Steps, in the order given:
#   correct   backend_ops --filter F for each F of FILTERS (default "moe") and backend_check graphs
#             on the tiny checkpoints, with NEW's binaries (the only build that carries backend_ops);
#   decode    bench latency's decode steps at DEC_BATCHES (default 1,2,4,8,16) and DEC_CTX (8192)
#             of DEC_BUILDS (default NEW and BASES), ROUNDS rounds (default 2);
#   prefill   bench latency's prompts of PF_LENS (default 8192) of PF_BUILDS, ROUNDS rounds;
#   timeline  one decode step kernel by kernel (--kernel-timeline) at TL_BATCHES (default 1) of
#             TL_BUILDS (default NEW), summarised by scripts/kernel_timeline_summary.py;
#   kernels   backend_check bench --only moe at KB_TOKENS (default 2048,8192) and --only linear of
#             KB_BUILDS (default NEW and BASES): the routed and dense GEMMs alone, their lines at
#             2,048 and 8,192 rows in the summary.
# OPS_LIMIT: seconds for each filter of the correct step (default 200).
# The model is M3.1's shape with dummy weights, LAYERS layers (default 12: what an H100 holds),
# NVFP4 KV and index cache. One line per case in $OUT/summary.txt, printed last; the logs and JSON
# in $OUT/compare-logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
NEW=${NEW:?NEW=dir: the build whose device packs are carried}
BASES=${BASES:-}
STEPS=${STEPS:-"correct decode"}
LAYERS=${LAYERS:-12}
ROUNDS=${ROUNDS:-2}
L=/tmp/compare-builds
rm -rf $L
mkdir -p $L "$OUT"
S=$OUT/summary.txt
: > "$S"
for d in $NEW $BASES; do
  for pack in $d/device-pack-*.txz $d/baseline-pack.txz; do
    [[ -f $pack ]] && python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$pack" "$d"
  done
  [[ -x $d/bin/m3serve ]] || echo "missing $d/bin/m3serve: carry $d's packs" >> "$S"
done
source scripts/nccl-env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$S"
libs() { echo "$PWD/$1/device-libs:/usr/local/cuda/lib64"; }
M3=(--model bench/configs/minimax-m3.1 --load-format dummy --num-layers "$LAYERS" --device cuda --kv-cache-dtype nvfp4
    --attention-config '{"indexer_kv_dtype": "nvfp4"}' --no-op-breakdown --json)

# One line of a bench latency JSON: decode steps (ms) or prompts (ms and x the FLOP floor).
summarise() {
  python3 - "$1" "$2" >> "$S" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(sys.argv[2], "no result:", e)
    sys.exit()
parts = [f"b{r['batch']}:{r.get('step_ms', 0):.3f}" for r in d.get("decode", [])]
parts += [f"p{r['prompt_len']}:{r.get('time_ms', 0):.1f}ms(x{r.get('floor_ratio', 0):.3f})" for r in d.get("prefill", [])]
print(sys.argv[2], " ".join(parts))
PY
}

step_correct() {
  local f log
  for f in ${FILTERS:-moe}; do
    log=$L/ops-${f//[^a-zA-Z0-9]/_}.log
    LD_LIBRARY_PATH=$(libs $NEW) timeout "${OPS_LIMIT:-200}" $NEW/tests/kernels_cuda/backend_ops --filter "$f" > "$log" 2>&1
    echo "ops '$f' rc $?: $(grep -E 'checks in' "$log" | tail -1)" >> "$S"
    grep -m5 FAIL "$log" >> "$S"
  done
  LD_LIBRARY_PATH=$(libs $NEW) timeout 150 $NEW/tests/kernels_cuda/backend_check graphs \
    tests/model_golden/data/tiny-mixed tests/model_golden/data/tiny-sparse-local2 > $L/graphs.log 2>&1
  echo "graphs rc $?: $(tail -1 $L/graphs.log)" >> "$S"
}

# ROUNDS rounds of one bench latency case over builds $2 (each in turn): $1 names the case, $3 is
# the timeout in seconds, the rest are the case's flags.
rounds() {
  local name=$1 builds=$2 limit=$3 r d t
  shift 3
  for ((r = 1; r <= ROUNDS; ++r)); do
    for d in $builds; do
      t=$L/$name-r$r-${d//\//_}
      LD_LIBRARY_PATH=$(libs $d) timeout "$limit" $d/bin/m3serve bench latency "${M3[@]}" "$@" > $t.json 2> $t.log
      summarise $t.json "$name r$r $d"
    done
  done
}

step_decode() {
  rounds decode "${DEC_BUILDS:-$NEW $BASES}" 150 --batch-sizes "${DEC_BATCHES:-1,2,4,8,16}" \
    --context-lens "${DEC_CTX:-8192}" --prefill-lens "" --iters 20 --warmup 3
}

step_prefill() {
  rounds prefill "${PF_BUILDS:-$NEW $BASES}" 200 --batch-sizes "" --prefill-lens "${PF_LENS:-8192}" --iters 4 --warmup 1
}

step_timeline() {
  local d t
  for d in ${TL_BUILDS:-$NEW}; do
    t=$L/timeline-${d//\//_}
    LD_LIBRARY_PATH=$(libs $d) timeout 150 $d/bin/m3serve bench latency "${M3[@]}" --batch-sizes "${TL_BATCHES:-1}" \
      --context-lens 8192 --prefill-lens "" --iters 10 --warmup 2 --kernel-timeline > $t.json 2> $t.log
    python3 scripts/kernel_timeline_summary.py $t.json > $t.txt 2>&1
    { echo "timeline $d:"; head -40 $t.txt; } >> "$S"
  done
}

step_kernels() {
  local d t
  for d in ${KB_BUILDS:-$NEW $BASES}; do
    t=$L/kernels-${d//\//_}
    LD_LIBRARY_PATH=$(libs $d) timeout 120 $d/tests/kernels_cuda/backend_check bench --only moe \
      --tokens "${KB_TOKENS:-2048,8192}" > $t-moe.log 2>&1
    LD_LIBRARY_PATH=$(libs $d) timeout 120 $d/tests/kernels_cuda/backend_check bench --only linear > $t-linear.log 2>&1
    { echo "kernels $d:"; grep -E "^ *(2048|8192) " $t-moe.log; grep -E "^[a-z].* (2048|8192) +[0-9]" $t-linear.log; } >> "$S"
  done
}

for s in $STEPS; do
  if declare -F "step_$s" > /dev/null; then "step_$s"; else echo "unknown step $s" >> "$S"; fi
done
tar czf "$OUT/compare-logs.tgz" -C $L . 2> /dev/null
cat "$S"
