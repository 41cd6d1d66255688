#!/usr/bin/env bash
# One device call that checks and measures a prebuilt tree: unpacks every $PREBUILT/device-pack-*.txz
# carried (scripts/gpu-check-model.sh prepare; a part unpacked by an earlier call of the same warm
# machine stays), checks that m3serve and the check binaries are all there, runs the checks (ops: the op harness backend_ops in full
# mode, model-quick, graphs, decode-exact, serve; nccl: the NCCL Communicator on the GPUs here,
# tests/parallel/nccl_communicator_check), the HTTP suite on cuda, the M3.1 bench
# latency (8K decode + 8K prefill, 128K decode at batch 1-16: M3_LAYERS layers: 20 on an H200, 12 on an H100) and the sanitizers; logs in $OUT/logs.tgz, the bench JSON in
# $OUT, the summaries last, one line per step (ops: "backend_ops: N checks in M cases, F failed";
# --batch-invariant: its op cases, the determinism suite on cuda and the bench cost ratios).
#   run: PREBUILT=build-gpu-backend bash scripts/gpu-session-check.sh, carrying the pack
# The device tool copies the tracked tree plus the carry within 64 MiB, and the tree is ~63 MiB:
# for the call, take the files no check reads out of the index (`git rm -r -q --cached
# tools/train/results models/minimax-m3-small/model.safetensors`, both paths appended to
# .git/info/exclude: ~37 MiB less), carry the packs, then restore (`git reset -q HEAD <paths>` and
# empty .git/info/exclude). Never commit in that state. The small model's checks (model-quick,
# speculative) need its weights: carry $PREBUILT/small-model-pack.txz too (~27 MiB; the tree, the
# two device packs and it make ~63 MiB, so not with a BASELINE), else they report "not run".
# BASELINE=dir (optional): a second build (dir/baseline-pack.txz, made by `PREBUILT=dir
# scripts/gpu-check-model.sh prepare`: bin/m3serve, tests/kernels_cuda/backend_check and
# device-libs; e.g. the commit before a change, or the default options beside a build with
# other CMake options) runs the same bench latency right after, into
# $OUT/bench-latency-8192-baseline.json, so that before and after are measured in one run.
# dense = the dense projections at decode sizes, new vs BASELINE (op cases, bench linear / moe,
# bench latency's 8K decode steps at batches 1-128: at most about 330 s).
# PARTS (default "main"): main = checks, nccl, http, bench, sanitizers (at most about 830 s with
# every step at its timeout, 930 with BASELINE: typically 400 s); decode = main's decode benches
# alone (8K and 128K, the per-op table, 8K sampled with logprobs; with BASELINE its 8K steps too: at most 360 s); batch-invariant = its op cases, the determinism
# suite and the cost (at most about 430 s); msa = the MSA kernels alone: their op cases, the
# msa_bench suites of issue 19 item 2 (targets, decode, prefill; prefill also from BASELINE's
# msa_bench when its pack has one) and an Nsight Compute profile of one
# targets case per kernel (MSA_NCU_CASES, default "1,64,131072 8,8,131072"; at most about 560 s, 60 more with a
# BASELINE); linear =
# backend_check bench --only linear and --only moe (at most 240 s; LINEAR_NCU=1 adds ncu of the streamed kernel: stall reasons per SASS instruction, 250 s);
# serving = bench serve with 8K prompts at --max-num-batched-tokens 2048 and at the default (at most about 300 s). Each part fits one 600 s
# device call; PARTS="main batch-invariant" runs both in one call when the time allows. sampling = the
# sample and logprobs op cases and each kernel's ncu duration on 128-row and 1-row steps (at most about 200 s;
# SAMPLING_SOURCE=1 adds a line-by-line profile of each kernel's one-row step, about 60 s more). timeline = the
# decode step kernel by kernel from CUPTI's records of one graph replay (bench latency --kernel-timeline at
# TIMELINE_BATCHES, default "1,64", TIMELINE_CONTEXTS, default 8192, TIMELINE_PREFILL, default none, prompt lengths
# recorded the same way; scripts/kernel_timeline_summary.py; at most 200 s). speculative =
# the drafter's op cases, verification steps from CUDA graphs, both drafters on cuda against plain
# decoding, the DSpark drafter's acceptance through a cuda server, the M3.1 verification steps with
# a drafter of the M3.1 drafter's shapes (at most about 590 s). trace = Nsight Compute's duration of
# every kernel of one decode step at TRACE_BATCHES (default "1 64"), summed per kernel name against
# the step's time (scripts/kernel_trace_summary.py; at most about 600 s, typically 150). prefill =
# the prefill-shaped kernels' op cases, kernel tables and the 8K prompt, beside BASELINE's (at most
# about 560 s; PF_LAYERS, default M3_LAYERS, the prompt's M3.1 layers; PF_LENS,
# default 8192, the prompt lengths: "8192,65536" adds a 64K prompt, about 10 s an iteration at 12 layers;
# PF_CHUNK, default 8192, the chunk: 2048 is serve's step on smaller GPUs).
PARTS=${PARTS:-main}
part() { [[ " $PARTS " == *" $1 "* ]]; }
P=${PREBUILT:-build-gpu-backend}
for pack in "$P"/device-pack*.txz; do
  [[ -f $pack ]] && python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$pack" "$P"
done
# The small model's weights when carried apart (gpu-check-model.sh prepare's small-model-pack.txz),
# back where the tree keeps them.
if [[ -f $P/small-model-pack.txz && ! -f models/minimax-m3-small/model.safetensors ]]; then
  python3 -c "import tarfile; tarfile.open('$P/small-model-pack.txz').extractall('.')"
fi
for f in bin/m3serve tests/kernels_cuda/backend_ops tests/kernels_cuda/backend_check; do
  if [[ ! -x $P/$f ]]; then
    echo "missing $P/$f: carry $P/device-pack-bin.txz (scripts/gpu-check-model.sh prepare)"
    exit 1
  fi
done
if [[ ! -d $P/device-libs ]]; then
  echo "missing $P/device-libs: a call just before this one (same warm machine) carries $P/device-pack-libs.txz" \
       "and unpacks it: python3 -c \"import tarfile; tarfile.open('$P/device-pack-libs.txz').extractall('$P')\""
  exit 1
fi
export LD_LIBRARY_PATH=$PWD/$P/device-libs:/usr/local/cuda/lib64
source scripts/nccl-env.sh  # NCCL_NVLS_ENABLE=0, the wheel's libnccl.so.2
# A warm machine keeps /tmp from the call before: its summaries must not join this call's table.
L=/tmp/logs; rm -rf $L; mkdir -p $L/c $L/h $L/n $L/s
# The op cases of each filter (after the part's name and a timeout in seconds): a summary line
# each, "<part> ops --filter 'F' rc R: backend_ops: ...", and its first failures.
op_cases() {
  local part=$1 limit=$2 f log; shift 2
  for f in "$@"; do
    log="$L/$part-ops-${f% }.log"
    timeout "$limit" $P/tests/kernels_cuda/backend_ops --filter "$f" > "$log" 2>&1
    echo "$part ops --filter '$f' rc $?: $(tail -1 "$log")" >> $L/$part-summary.txt
    grep '^FAIL' "$log" | head -5 >> $L/$part-summary.txt
  done
}
# BASELINE's pack, unpacked beside it (once is enough; a second call rewrites the same files).
unpack_baseline() {
  [[ -z "${BASELINE:-}" ]] || python3 -c "import tarfile; tarfile.open('$BASELINE/baseline-pack.txz').extractall('$BASELINE')"
}
# M3_LAYERS: the M3.1 layers of the decode benches and the trace; by default 20 where a GPU has
# 120 GB or more (H200: 20 layers of routed experts take 82 GB) and 12 elsewhere (H100: 20 do not fit).
gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
M3_LAYERS=${M3_LAYERS:-$(( ${gpu_mib:-0} >= 120000 ? 20 : 12 ))}
if part main; then
PREBUILT=$P OUT=$L/c TIME_BUDGET=270 STEP_TIMEOUT=40 OPS_TIMEOUT=130 MODEL_TIMEOUT=30 scripts/gpu-check-model.sh ops model-quick graphs decode-exact speculative serve 2>&1 | sed -n '/---- gpu-check-model summary/,$p' > $L/c-summary.txt
# One line ("nccl: rc 0 in 4 s: nccl_communicator_check: N passed, 0 failed (world sizes ...)"), and
# each failure; the table in logs.tgz (n/nccl.log).
PREBUILT=$P OUT=$L/n TIME_BUDGET=45 STEP_TIMEOUT=40 scripts/gpu-check-model.sh nccl 2>&1 |
  grep -E '^(nccl: |nccl-env|FAIL world)' > $L/n-summary.txt
PREBUILT=$P OUT=$L/h TIME_BUDGET=40 HTTP_TIMEOUT=35 scripts/gpu-check-model.sh http 2>&1 | grep 'http suite' > $L/h-summary.txt
fi
if part main || part decode; then
echo "decode benches: $M3_LAYERS M3.1 layers (GPU memory ${gpu_mib:-?} MiB)" > $L/b-summary.txt
timeout 100 $P/bin/m3serve bench latency --model bench/configs/minimax-m3.1 --load-format dummy --num-layers $M3_LAYERS --device cuda \
  --kv-cache-dtype nvfp4 --attention-config '{"indexer_kv_dtype": "nvfp4"}' --batch-sizes 1,8,32,64,128 --context-lens 8192 \
  --prefill-lens 8192 --spec-tokens 3,7 --iters 5 --warmup 2 --json > $OUT/bench-latency-8192.json 2> $L/bench.log
echo "bench rc $?" >> $L/b-summary.txt
# Issue 19 item 1's per-op table: each op of the 8K decode steps against its own byte floor
# (ops_floor_ratio: the op's time less one wait a call, over its bytes at the GPU's measured copy rate).
python3 - $OUT/bench-latency-8192.json >> $L/b-summary.txt 2>&1 <<'PY'
import json, sys
try:
    decode = json.load(open(sys.argv[1])).get("decode", [])
except (OSError, ValueError) as e:
    sys.exit(f"  no bench JSON ({e.__class__.__name__}): see logs.tgz bench.log")
for r in decode:
    if r.get("status") != "ok" or "ops_floor_ratio" not in r:
        continue
    ops = sorted(r["ops_ms"].items(), key=lambda kv: -kv[1])[:8]
    print(f"  b{r['batch']}: {r['step_ms']:.2f} ms, x floor {r.get('floor_ratio', 0):.2f}; wait {r['op_sync_ms'] * 1e3:.0f} us"
          " a call; op ms (x own floor): " +
          ", ".join(f"{k} {v:.2f} ({r['ops_floor_ratio'].get(k, 0):.1f})" for k, v in ops))
PY
# Issue 19 item 1's second context: 128K (the KV cache is zeros, written by no prefill).
timeout 100 $P/bin/m3serve bench latency --model bench/configs/minimax-m3.1 --load-format dummy --num-layers $M3_LAYERS --device cuda \
  --kv-cache-dtype nvfp4 --attention-config '{"indexer_kv_dtype": "nvfp4"}' --batch-sizes 1,8,16 --context-lens 131072 \
  --prefill-lens "" --iters 5 --warmup 2 --json > $OUT/bench-latency-131072.json 2> $L/bench-131072.log
echo "bench 128K rc $?" >> $L/b-summary.txt
if part decode; then
  # Sampled decode (MiniMax's recommended temperature 1, top_k 40, top_p 0.95) with 5 logprobs a
  # token: what the sample op costs beside greedy's.
  timeout 60 $P/bin/m3serve bench latency --model bench/configs/minimax-m3.1 --load-format dummy --num-layers $M3_LAYERS \
    --device cuda --kv-cache-dtype nvfp4 --attention-config '{"indexer_kv_dtype": "nvfp4"}' --batch-sizes 1,128 \
    --context-lens 8192 --prefill-lens "" --temperature 1 --top-k 40 --top-p 0.95 --logprobs 5 --iters 5 --warmup 2 \
    --json > $OUT/bench-latency-8192-sampled.json 2> $L/bench-sampled.log
  echo "bench sampled rc $?" >> $L/b-summary.txt
  python3 - $OUT/bench-latency-8192-sampled.json >> $L/b-summary.txt 2>&1 <<'PY'
import json, sys
try:
    decode = json.load(open(sys.argv[1])).get("decode", [])
except (OSError, ValueError) as e:
    sys.exit(f"  no sampled bench JSON ({e.__class__.__name__}): see logs.tgz bench-sampled.log")
for r in decode:
    if r.get("status") == "ok":
        print(f"  sampled b{r['batch']}: {r['step_ms']:.2f} ms, x floor {r.get('floor_ratio', 0):.2f}; "
              f"sample op {r.get('ops_ms', {}).get('sample', 0):.3f} ms")
PY
fi
if [[ -n "${BASELINE:-}" ]]; then
  B=$BASELINE
  unpack_baseline
  LD_LIBRARY_PATH=$PWD/$B/device-libs:/usr/local/cuda/lib64 timeout 100 $B/bin/m3serve bench latency \
    --model bench/configs/minimax-m3.1 --load-format dummy --num-layers $M3_LAYERS --device cuda --kv-cache-dtype nvfp4 \
    --attention-config '{"indexer_kv_dtype": "nvfp4"}' --batch-sizes 1,8,32,64,128 --context-lens 8192 \
    --prefill-lens 8192 --iters 5 --warmup 2 --json > $OUT/bench-latency-8192-baseline.json 2> $L/bench-baseline.log
  echo "baseline bench rc $?" >> $L/b-summary.txt
fi
fi
if part msa; then
  # The MSA kernels: every "msa " op case against the CPU, the benchmark tables, one profile.
  timeout 100 $P/tests/kernels_cuda/backend_ops --filter "msa " > $L/msa-ops.log 2>&1
  rc=$?
  echo "msa ops: $(tail -1 $L/msa-ops.log) (rc $rc)" > $L/m-summary.txt
  grep '^FAIL' $L/msa-ops.log | head -10 >> $L/m-summary.txt
  if [[ -x $P/tests/kernels_cuda/msa_bench ]]; then
    timeout 150 $P/tests/kernels_cuda/msa_bench --suite targets --dtype nvfp4 > $OUT/msa-bench-targets.log 2>&1
    echo "msa_bench targets rc $?" >> $L/m-summary.txt
    timeout 70 $P/tests/kernels_cuda/msa_bench --suite decode --quick > $OUT/msa-bench-decode.log 2>&1
    echo "msa_bench decode --quick rc $?" >> $L/m-summary.txt
    timeout 60 $P/tests/kernels_cuda/msa_bench --suite prefill --quick > $OUT/msa-bench-prefill.log 2>&1
    echo "msa_bench prefill --quick rc $?" >> $L/m-summary.txt
    grep '^prefill_' $OUT/msa-bench-prefill.log >> $L/m-summary.txt
    # The same prefill suite from BASELINE's msa_bench (a pack made since session 27 carries it):
    # the before/after of the prefill kernels in one call.
    if [[ -n "${BASELINE:-}" ]]; then
      unpack_baseline
      if [[ -x $BASELINE/tests/kernels_cuda/msa_bench ]]; then
        LD_LIBRARY_PATH=$PWD/$BASELINE/device-libs:/usr/local/cuda/lib64 timeout 60 \
          $BASELINE/tests/kernels_cuda/msa_bench --suite prefill --quick > $OUT/msa-bench-prefill-baseline.log 2>&1
        echo "baseline msa_bench prefill --quick rc $?" >> $L/m-summary.txt
        grep '^prefill_' $OUT/msa-bench-prefill-baseline.log >> $L/m-summary.txt
      fi
    fi
    timeout 30 $P/tests/kernels_cuda/msa_bench --fp8-mma-probe >> $L/m-summary.txt 2>&1
    # The MSA kernels' machine code, for counting instructions per tile here.
    command -v cuobjdump > /dev/null &&
      cuobjdump -sass $P/tests/kernels_cuda/msa_bench 2>/dev/null | gzip > $OUT/msa-sass.txt.gz
    if [[ -n "${LINEAR_NCU:-}" ]] && command -v ncu > /dev/null; then
      # One launch of each kernel (the first in the program: the indexer and top-k of the plan's
      # warm-up call, sparse attention inside its timing graph), per profiled case.
      for c in ${MSA_NCU_CASES:-1,64,131072 8,8,131072}; do
        for k in indexer_scores topk_kernel sparse_rows_kernel attention_kernel; do
          timeout 40 ncu --clock-control none --kernel-name regex:$k --launch-count 1 --section SourceCounters --section SpeedOfLight \
            --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
            --section SchedulerStats $P/tests/kernels_cuda/msa_bench --case $c --dtype nvfp4 \
            >> $OUT/msa-ncu.log 2>&1
          echo "ncu $c $k rc $?" >> $L/m-summary.txt
        done
      done
    fi
    sed -n '/^Issue 19 item 2/,/^$/p' $OUT/msa-bench-targets.log >> $L/m-summary.txt
  else
    echo "msa_bench missing from the pack" >> $L/m-summary.txt
  fi
fi
if part speculative; then
  # Speculative decoding on the GPU: both drafters' ids against plain decoding (the small model),
  # the shipped DSpark drafter's acceptance and tokens/s through a cuda server (the 100 held-out
  # code prompts), and the M3.1 shape's verification steps measured beside their floors.
  # The drafter's two ops against the CPU reference, and verification steps replayed from CUDA
  # graphs against eager, bitwise.
  timeout 120 $P/tests/kernels_cuda/backend_ops --filter draft_block > $L/sp-ops.log 2>&1
  timeout 60 $P/tests/kernels_cuda/backend_ops --filter markov >> $L/sp-ops.log 2>&1
  grep -E "FAIL|checks in" $L/sp-ops.log | sed 's/^/speculative ops: /' > $L/sp-summary.txt
  timeout 150 $P/tests/kernels_cuda/backend_check graphs tests/model_golden/data/tiny-mixed \
    tests/model_golden/data/tiny-sparse-local2 models/minimax-m3-small > $L/sp-graphs.log 2>&1
  echo "speculative graphs rc $?: $(tail -1 $L/sp-graphs.log)" >> $L/sp-summary.txt
  PREBUILT=$P OUT=$L/sp TIME_BUDGET=150 STEP_TIMEOUT=40 scripts/gpu-check-model.sh speculative 2>&1 |
    grep '^speculative' >> $L/sp-summary.txt
  # Acceptance and tokens/s through a cuda server: 16 clients at once (k = 0: no speculation; then
  # with adaptive verification), and one client at a time (the per-user speed). SPEC_EVALS picks
  # which of the three run (default all: about 500 s of the part's 590).
  evals=" ${SPEC_EVALS:-c16 adaptive c1} "
  if [[ $evals == *" c16 "* ]]; then
  timeout 200 python3 tools/train/eval_spec.py --m3serve $P/bin/m3serve --device cuda --kv-cache-dtype nvfp4 \
    --k 0,3,7 --out $OUT/spec-eval-cuda.json >> $L/sp-summary.txt 2>&1
  echo "eval_spec cuda rc $?" >> $L/sp-summary.txt
  fi
  if [[ $evals == *" adaptive "* ]]; then
  timeout 150 python3 tools/train/eval_spec.py --m3serve $P/bin/m3serve --device cuda --kv-cache-dtype nvfp4 \
    --k 3,7 --adaptive --out $OUT/spec-eval-cuda-adaptive.json >> $L/sp-summary.txt 2>&1
  echo "eval_spec cuda adaptive rc $?" >> $L/sp-summary.txt
  fi
  if [[ $evals == *" c1 "* ]]; then
  timeout 150 python3 tools/train/eval_spec.py --m3serve $P/bin/m3serve --device cuda --kv-cache-dtype nvfp4 \
    --k 0,3,7 --temperatures 0 --count 16 --concurrency 1 --out $OUT/spec-eval-cuda-c1.json >> $L/sp-summary.txt 2>&1
  echo "eval_spec cuda concurrency 1 rc $?" >> $L/sp-summary.txt
  fi
  timeout 300 $P/bin/m3serve bench latency --model bench/configs/minimax-m3.1 --load-format dummy --num-layers $M3_LAYERS \
    --device cuda --kv-cache-dtype nvfp4 --attention-config '{"indexer_kv_dtype": "nvfp4"}' --batch-sizes 1,8,32,64 \
    --context-lens 8192 --prefill-lens "" --spec-tokens 3,7 --spec-drafter bench/configs/minimax-m3.1/dspark \
    --iters 5 --warmup 2 --json > $OUT/bench-latency-spec.json 2> $L/bench-spec.log
  echo "bench spec rc $?" >> $L/sp-summary.txt
  python3 - $OUT/bench-latency-spec.json >> $L/sp-summary.txt 2>&1 <<'PY'
import json, sys
for c in json.load(open(sys.argv[1]))["decode"]:
    for v in c.get("verification", []):
        d = v.get("drafter", {})
        print(f"spec b{c['batch']} k{v['k']}: decode {c['step_ms']:.2f} ms, verify {v['step_ms']:.2f} ms, "
              f"taps {d.get('taps_ms', 0):.2f} ms, draft {d.get('draft_step_ms', 0):.2f} ms, "
              f"{d.get('tokens_per_s_per_user', 0):.1f} tok/s/user at L={v['acceptance_length']} "
              f"vs {v['plain_tokens_per_s_per_user']:.1f} plain")
PY
fi
if part linear; then
  # The linear layers and the MoE kernels alone (backend_check bench: M3.1 shapes, random weights;
  # the MoE table times the routed experts on the streamed and on the skinny kernel).
  timeout 120 $P/tests/kernels_cuda/backend_check bench --only linear > $OUT/bench-linear.log 2>&1
  echo "bench linear rc $?" > $L/l-summary.txt
  timeout 120 $P/tests/kernels_cuda/backend_check bench --only moe > $OUT/bench-moe.log 2>&1
  echo "bench moe rc $?" >> $L/l-summary.txt
  grep -E "experts|skinny" $OUT/bench-moe.log >> $L/l-summary.txt
  # LINEAR_NCU=1: Nsight Compute on the routed experts' streamed launches at 64 tokens (the
  # untimed first pass's gate/up and down): throughput, warp states, scheduler, and where the
  # warps stall, per SASS instruction (ncu-streamed-sass.csv).
  if [[ -n "${LINEAR_NCU:-}" ]] && command -v ncu > /dev/null; then
    timeout 150 ncu --kernel-name regex:streamed_linear --launch-count 2 --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy \
      --section InstructionStats --section SourceCounters \
      $P/tests/kernels_cuda/backend_check bench --only moe --tokens 64 > $OUT/ncu-streamed.log 2>&1
    echo "ncu streamed rc $?" >> $L/l-summary.txt
    grep -E "streamed_linear_kernel|Memory Throughput|DRAM Throughput|Duration|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" \
      $OUT/ncu-streamed.log | head -40 >> $L/l-summary.txt
    timeout 100 ncu --kernel-name regex:streamed_linear --launch-count 1 --section SourceCounters --section WarpStateStats \
      --page source --print-source sass --csv \
      $P/tests/kernels_cuda/backend_check bench --only moe --tokens 64 > $OUT/ncu-streamed-sass.csv 2>&1
    echo "ncu streamed sass rc $?" >> $L/l-summary.txt
  fi
fi
if part dense; then
  # The dense projections at decode sizes (the wgmma kernel from 65 rows), beside BASELINE's when
  # given: the linear and swiglu op cases, backend_check bench --only linear (q_proj / o_proj at
  # 96-256 rows) and --only moe at 1 and 128 tokens (the shared expert beside the routed ones), and
  # bench latency's 8K decode steps at batches 1, 32, 96 and 128 (new with the op breakdown, base
  # without; at most about 330 s).
  op_cases dense 100 "linear " swiglu
  unpack_baseline
  dense_lat=(bench latency --model bench/configs/minimax-m3.1 --load-format dummy --num-layers $M3_LAYERS --device cuda
             --kv-cache-dtype nvfp4 --attention-config '{"indexer_kv_dtype": "nvfp4"}' --batch-sizes 1,32,96,128
             --context-lens 8192 --prefill-lens "" --iters 5 --warmup 2 --json)
  for side in new base; do
    bin=$P
    if [[ $side == base ]]; then
      [[ -n "${BASELINE:-}" ]] || continue
      bin=$BASELINE
    fi
    export LD_LIBRARY_PATH=$PWD/$bin/device-libs:/usr/local/cuda/lib64
    timeout 40 $bin/tests/kernels_cuda/backend_check bench --only linear > $OUT/dense-linear-$side.log 2>&1
    echo "bench linear ($side) rc $?" >> $L/dense-summary.txt
    grep -E "^(q_proj|o_proj).* (96|128|192|256) " $OUT/dense-linear-$side.log | sed "s/^/$side /" >> $L/dense-summary.txt
    timeout 30 $bin/tests/kernels_cuda/backend_check bench --only moe --tokens 1,128 > $OUT/dense-moe-$side.log 2>&1
    echo "bench moe ($side) rc $?" >> $L/dense-summary.txt
    grep -E "^ *128 .*(shared|sum of|moe op)" $OUT/dense-moe-$side.log | sed "s/^/$side /" >> $L/dense-summary.txt
    extra=(); [[ $side == base ]] && extra=(--no-op-breakdown)
    timeout 90 $bin/bin/m3serve "${dense_lat[@]}" "${extra[@]}" > $OUT/dense-latency-$side.json 2> $L/dense-latency-$side.log
    echo "bench latency 8K decode ($side) rc $?" >> $L/dense-summary.txt
  done
  export LD_LIBRARY_PATH=$PWD/$P/device-libs:/usr/local/cuda/lib64
  python3 - $OUT/dense-latency-new.json $OUT/dense-latency-base.json >> $L/dense-summary.txt 2>&1 <<'PY'
import json, sys
def cases(path):
    try:
        return {r["batch"]: r for r in json.load(open(path)).get("decode", []) if r.get("status") == "ok"}
    except (OSError, ValueError):
        return {}
new, base = cases(sys.argv[1]), cases(sys.argv[2])
for b, r in sorted(new.items()):
    ops = sorted(r.get("ops_ms", {}).items(), key=lambda kv: -kv[1])[:6]
    before = f"{base[b]['step_ms']:.2f} ms" if b in base else "-"
    print(f"  b{b}: {r['step_ms']:.2f} ms (x{r.get('floor_ratio', 0):.2f} at {r.get('floor_ms', 0):.2f} ms floor), base {before};"
          " op ms (x own floor): " + ", ".join(f"{k} {v:.2f} ({r.get('ops_floor_ratio', {}).get(k, 0):.1f})" for k, v in ops))
PY
fi
if part prefill; then
  # The prefill-shaped kernels (the wgmma GEMM, the tiled router) and an 8K prompt, beside
  # BASELINE's binaries when given (its pack's bin/m3serve and, for the kernel tables,
  # tests/kernels_cuda/backend_check): the linear, swiglu_mlp, moe and attention_input op cases in
  # full mode (their 2048-, 700- and 600-row cases run the wgmma kernel, the 300- and 2048-token MoE
  # the tensor-core router, the 4,101-token attention input warps that walk several rows), backend_check bench --only linear (2048 and 8192 rows) and --only moe (2048 and 8192
  # tokens; at 128, the shared expert on the streamed kernel's wide form and on the wgmma kernel),
  # and bench latency's 8192-token prefill of PF_LAYERS M3.1 layers (at most about 570 s).
  op_cases prefill 110 linear swiglu "moe " attention_input
  unpack_baseline
  pf_lat=(bench latency --model bench/configs/minimax-m3.1 --load-format dummy --num-layers ${PF_LAYERS:-$M3_LAYERS} --device cuda
          --kv-cache-dtype nvfp4 --attention-config '{"indexer_kv_dtype": "nvfp4"}' --batch-sizes 1 --context-lens 8192
          --prefill-lens ${PF_LENS:-8192} --chunk-size ${PF_CHUNK:-8192} --iters 3 --warmup 1 --json)
  for side in new base; do
    bin=$P; libs=$P/device-libs
    if [[ $side == base ]]; then
      [[ -n "${BASELINE:-}" ]] || continue
      bin=$BASELINE; libs=$BASELINE/device-libs
    fi
    if [[ -x $bin/tests/kernels_cuda/backend_check ]]; then
      LD_LIBRARY_PATH=$PWD/$libs:/usr/local/cuda/lib64 timeout 80 $bin/tests/kernels_cuda/backend_check bench --only linear \
        > $OUT/bench-linear-$side.log 2>&1
      echo "bench linear ($side) rc $?" >> $L/prefill-summary.txt
      grep -E " (2048|8192) " $OUT/bench-linear-$side.log | sed "s/^/$side /" >> $L/prefill-summary.txt
      LD_LIBRARY_PATH=$PWD/$libs:/usr/local/cuda/lib64 timeout 70 $bin/tests/kernels_cuda/backend_check bench --only moe \
        --tokens 128,2048,8192 > $OUT/bench-moe-$side.log 2>&1
      echo "bench moe ($side) rc $?" >> $L/prefill-summary.txt
      grep -E "^ *(2048|8192) |^ *128 .*(shared|wgmma)" $OUT/bench-moe-$side.log | sed "s/^/$side /" >> $L/prefill-summary.txt
    fi
    LD_LIBRARY_PATH=$PWD/$libs:/usr/local/cuda/lib64 timeout 90 $bin/bin/m3serve "${pf_lat[@]}" \
      > $OUT/bench-latency-prefill-$side.json 2> $L/pf-latency-$side.log
    echo "bench latency prefill 8192 ($side) rc $?" >> $L/prefill-summary.txt
    python3 - $OUT/bench-latency-prefill-$side.json >> $L/prefill-summary.txt 2>&1 <<'PY'
import json, sys
try:
    prefill = json.load(open(sys.argv[1])).get("prefill", [])
except (OSError, ValueError) as e:
    sys.exit(f"  no bench JSON ({e.__class__.__name__}): see logs.tgz pf-latency-*.log")
for r in prefill:
    ops = sorted(r.get("ops_ms", {}).items(), key=lambda kv: -kv[1])[:6]
    rate = r.get("ops_flops_per_s", {})
    print(f"  prompt {r['prompt_len']}: {r.get('time_ms', 0):.1f} ms, x floor {r.get('floor_ratio', 0):.2f}; op ms"
          " (TFLOP/s):", ", ".join(f"{k} {v:.1f}" + (f" ({rate[k] / 1e12:.0f})" if k in rate else "") for k, v in ops))
PY
  done
fi
if part serving; then
  # The step budget under load: bench serve (streaming clients in process) on SV_LAYERS (default 12)
  # M3.1 layers with 8K prompts, at --max-num-batched-tokens 2048 and at the default (8192 on a GPU
  # of 70 GiB or more): TTFT, the inter-token latency of decodes that share steps with prompt
  # chunks, and throughput (at most about 300 s).
  for budget in 2048 default; do
    extra=(); [[ $budget == default ]] || extra=(--max-num-batched-tokens $budget)
    timeout 140 $P/bin/m3serve bench serve --model bench/configs/minimax-m3.1 --load-format dummy \
      --num-layers ${SV_LAYERS:-12} --device cuda --kv-cache-dtype nvfp4 --attention-config '{"indexer_kv_dtype": "nvfp4"}' \
      --max-model-len 16384 --concurrency 1,8 --num-prompts 16 --input-len 8192 --output-len 64 --range-ratio 0 \
      --conversations 0 "${extra[@]}" --json > $OUT/bench-serve-$budget.json 2> $L/serve-$budget.log
    echo "bench serve budget $budget rc $?: $(grep -o 'step budget [0-9]* tokens' $L/serve-$budget.log | head -1)" >> $L/sv-summary.txt
    python3 - $OUT/bench-serve-$budget.json >> $L/sv-summary.txt 2>&1 <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit(f"  no bench JSON ({e.__class__.__name__}): see logs.tgz serve-*.log")
for r in rows:
    print(f"  c{r['concurrency']}: {r['requests_per_s']:.2f} req/s, {r['output_tokens_per_s']:.0f} out tok/s, TTFT p50 "
          f"{r['ttft_p50_ms']:.0f} p99 {r['ttft_p99_ms']:.0f} ms, ITL mean {r['itl_mean_ms']:.1f} p99 {r['itl_p99_ms']:.1f} ms,"
          f" failed {r['failed']}")
PY
  done
fi
if part batch-invariant; then
if [[ ! -f $OUT/bench-latency-8192.json ]]; then
  # The cost needs the same shape without the flag; the main part writes it with more batches.
  timeout 100 $P/bin/m3serve bench latency --model bench/configs/minimax-m3.1 --load-format dummy --num-layers $M3_LAYERS \
    --device cuda --kv-cache-dtype nvfp4 --attention-config '{"indexer_kv_dtype": "nvfp4"}' --batch-sizes 1,64 \
    --context-lens 8192 --prefill-lens 8192 --iters 4 --warmup 1 --no-op-breakdown --json \
    > $OUT/bench-latency-8192.json 2> $L/bench.log
fi
# --batch-invariant: the op cases (a row alone vs in batches, bitwise; counted per check), the
# determinism suite on cuda with the flag, and its cost: the same bench latency shape with the
# flag (batches 1 and 64 only, fewer iterations), each case's time against the run above.
timeout 60 $P/tests/kernels_cuda/backend_ops --filter batch-invariant > $L/bi-ops.log 2>&1
rc=$?
echo "batch-invariant ops: $(grep -c '^ok ' $L/bi-ops.log) ok, $(grep -c '^FAIL' $L/bi-ops.log) FAIL (rc $rc)" > $L/bi-summary.txt
grep '^FAIL' $L/bi-ops.log | head -10 >> $L/bi-summary.txt
PREBUILT=$P OUT=$L/d TIME_BUDGET=160 DETERMINISM_TIMEOUT=150 scripts/gpu-check-model.sh determinism 2>&1 |
  grep -E '^determinism|^(FAIL|ERROR):' >> $L/bi-summary.txt
timeout 110 $P/bin/m3serve bench latency --model bench/configs/minimax-m3.1 --load-format dummy --num-layers $M3_LAYERS --device cuda \
  --kv-cache-dtype nvfp4 --attention-config '{"indexer_kv_dtype": "nvfp4"}' --batch-sizes 1,64 --context-lens 8192 \
  --prefill-lens 8192 --iters 4 --warmup 1 --no-op-breakdown --batch-invariant --json \
  > $OUT/bench-latency-8192-batch-invariant.json 2> $L/bench-batch-invariant.log
rc=$?
python3 - $OUT/bench-latency-8192.json $OUT/bench-latency-8192-batch-invariant.json $rc >> $L/bi-summary.txt <<'PY'
import json, sys
try:
    plain, inv = (json.load(open(f)) for f in sys.argv[1:3])
except Exception as e:
    print("batch-invariant cost decode/prefill: no result (bench rc %s: %s)" % (sys.argv[3], e)); sys.exit()
def times(j):
    d = {("decode b%d" % c["batch"]): c["step_ms"] for c in j["decode"] if c.get("status") == "ok"}
    d.update({("prefill %d" % c["prompt_len"]): c["time_ms"] for c in j["prefill"] if c.get("status") == "ok"})
    return d
a, b = times(plain), times(inv)
parts = ["%s %.2f -> %.2f ms (x%.2f)" % (k, a[k], b[k], b[k] / a[k]) for k in b if k in a]
print("batch-invariant cost decode/prefill (M3.1 M3_LAYERS layers, ctx 8192, nvfp4 KV): " + ("; ".join(parts) or "no common case"))
PY
fi
if part sampling; then
  # The sampling and logprobs kernels: their op cases (full mode: every row shape, the 128-row
  # decode steps, 160 logprob rows) and Nsight Compute's duration and DRAM reads of each kernel
  # alone on the 128-row steps and the logprobs case (backend_ops --perf's times include the
  # rows' upload and the constrained rows' copies).
  op_cases sampling 150 "sample " "logprobs"
  for c in "step of 128 rows greedy" "step of 128 rows T=1" "step of 128 rows T=0.8 top_k=50 top_p=0.95" \
      "step of 128 rows same + repetition penalty" "step of 1 rows greedy" "step of 1 rows T=1" \
      "step of 1 rows T=0.8 top_k=50 top_p=0.95" "logprobs vocab 200064 peaked 32" "logprobs vocab 200064 peaked 1 "; do
    k=sample_kernel
    [[ $c == logprobs* ]] && k=logprobs_kernel
    echo "sampling ncu $k '$c': $(timeout 60 ncu --kernel-name $k --launch-count 1 \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum $P/tests/kernels_cuda/backend_ops --filter "$c" 2>&1 |
      awk '/gpu__time_duration|dram__bytes_read/ {printf "%s %s %s  ", $1, $3, $2}')" >> $L/sampling-summary.txt
  done
  if [[ -n "${SAMPLING_SOURCE:-}" ]]; then
    # Where a one-row step's time goes, line by line: the full set's warp-state samples with the
    # source, exported as the source page's CSV ($OUT/sampling-source-<kernel>.csv; the option
    # that adds the CUDA lines is tried first, the SASS page alone if this ncu lacks it).
    for k in sample_kernel logprobs_kernel; do
      c="step of 1 rows T=0.8 top_k=50 top_p=0.95"
      [[ $k == logprobs_kernel ]] && c="logprobs vocab 200064 peaked 1 "
      timeout 120 ncu --kernel-name $k --launch-count 1 --set full --import-source yes -f -o $L/source-$k \
        $P/tests/kernels_cuda/backend_ops --filter "$c" > $L/source-$k.log 2>&1
      timeout 60 ncu --import $L/source-$k.ncu-rep --page source --csv --print-source cuda,sass \
          > $OUT/sampling-source-$k.csv 2>> $L/source-$k.log ||
        timeout 60 ncu --import $L/source-$k.ncu-rep --page source --csv > $OUT/sampling-source-$k.csv 2>> $L/source-$k.log
      echo "sampling source $k: $(wc -l < $OUT/sampling-source-$k.csv) lines in sampling-source-$k.csv" >> $L/sampling-summary.txt
    done
  fi
fi
if part trace; then
  # The decode step's kernels one by one: Nsight Compute's duration of every kernel of one graph
  # replay (M3.1, M3_LAYERS layers, 8K, NVFP4 KV; caches left warm, clocks as they run), summed per kernel
  # name beside the bench's step time. The profiler runs each kernel alone, so short kernels
  # measure longer than inside the replay: the table ranks kernels, it does not time the gaps.
  for b in ${TRACE_BATCHES:-1 64}; do
    timeout 100 $P/bin/m3serve bench latency --model bench/configs/minimax-m3.1 --load-format dummy --num-layers $M3_LAYERS \
      --device cuda --kv-cache-dtype nvfp4 --attention-config '{"indexer_kv_dtype": "nvfp4"}' --batch-sizes $b \
      --context-lens 8192 --prefill-lens "" --iters 5 --warmup 2 --no-op-breakdown --json \
      > $OUT/trace-step-b$b.json 2> $L/trace-step-b$b.log
    timeout 200 ncu --csv --print-kernel-base function --metrics gpu__time_duration.sum --cache-control none \
      --clock-control none $P/bin/m3serve bench latency --model bench/configs/minimax-m3.1 --load-format dummy \
      --num-layers $M3_LAYERS --device cuda --kv-cache-dtype nvfp4 --attention-config '{"indexer_kv_dtype": "nvfp4"}' \
      --batch-sizes $b --context-lens 8192 --prefill-lens "" --iters 1 --warmup 0 --no-op-breakdown --json \
      > $L/trace-b$b.csv 2> $L/trace-ncu-b$b.log
    echo "trace b$b: ncu rc $?" >> $L/t-summary.txt
    gzip -c $L/trace-b$b.csv > $OUT/trace-b$b.csv.gz
    python3 scripts/kernel_trace_summary.py $L/trace-b$b.csv $OUT/trace-step-b$b.json >> $L/t-summary.txt 2>&1
  done
fi
if part timeline; then
  # The decode step kernel by kernel as the GPU ran it: bench latency --kernel-timeline records one
  # graph replay of each batch with CUPTI (every kernel's start and end, programmatic dependent
  # launch and the side streams as they run), and scripts/kernel_timeline_summary.py prints each
  # kernel's tail on its stream's chain, the idle time and the last layer one kernel at a time.
  timeout 200 $P/bin/m3serve bench latency --model bench/configs/minimax-m3.1 --load-format dummy --num-layers $M3_LAYERS \
    --device cuda --kv-cache-dtype nvfp4 --attention-config '{"indexer_kv_dtype": "nvfp4"}' \
    --batch-sizes ${TIMELINE_BATCHES:-1,64} --context-lens ${TIMELINE_CONTEXTS:-8192} --prefill-lens "${TIMELINE_PREFILL:-}" \
    --chunk-size 8192 --iters 10 --warmup 2 --no-op-breakdown --kernel-timeline --json > $OUT/bench-latency-timeline.json 2> $L/timeline.log
  echo "timeline: bench rc $?" > $L/tl-summary.txt
  # The same steps without CUPTI: what its tracing adds to a step.
  timeout 120 $P/bin/m3serve bench latency --model bench/configs/minimax-m3.1 --load-format dummy --num-layers $M3_LAYERS \
    --device cuda --kv-cache-dtype nvfp4 --attention-config '{"indexer_kv_dtype": "nvfp4"}' \
    --batch-sizes ${TIMELINE_BATCHES:-1,64} --context-lens ${TIMELINE_CONTEXTS:-8192} --prefill-lens "" --iters 10 \
    --warmup 2 --no-op-breakdown --json > $OUT/bench-latency-timeline-plain.json 2>> $L/timeline.log
  python3 - $OUT/bench-latency-timeline-plain.json >> $L/tl-summary.txt 2>&1 <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])).get("decode", []):
    print(f"without CUPTI: decode b{r['batch']} ctx {r['context']}: step {r.get('step_ms', 0):.3f} ms")
PY
  python3 scripts/kernel_timeline_summary.py $OUT/bench-latency-timeline.json >> $L/tl-summary.txt 2>&1
fi
if part main; then
# The six sanitizer runs: about 100 s for the first four (racecheck over the linear cases ~25 s),
# up to 120 s for the sampling racecheck, a few for the expert-parallel initcheck (session 37: at a
# 110 s budget the last two ran out of time).
PREBUILT=$P OUT=$L/s TIME_BUDGET=240 SANITIZE_TIMEOUT=60 scripts/gpu-check-model.sh sanitize 2>&1 | grep sanitize > $L/s-summary.txt
fi
tar czf $OUT/logs.tgz -C /tmp logs
cat $L/*-summary.txt
