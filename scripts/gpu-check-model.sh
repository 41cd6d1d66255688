#!/usr/bin/env bash
# The GPU machine's job for the CUDA model backend (kernels/cuda/backend): build, check every
# backend op against the CPU reference (backend_ops, the op harness: op_harness.h), check whole models on the committed checkpoints (every KV
# dtype), time the linear layers, run compute-sanitizer on a short check. Logs to $OUT (default
# out/), the summary last.
#
#   scripts/gpu-check-model.sh [STEP...]   steps: build ops ops-quick ops-perf model model-quick graphs decode-exact
#                                          nccl bench latency profile generate speculative serve sanitize
#                                          bench-latency bench-throughput http determinism (PREBUILT only)
#                                          (default: build ops model-quick bench latency sanitize)
# PREBUILT=dir uses dir/tests/kernels_cuda/{backend_ops,backend_check}, dir/tests/parallel/nccl_communicator_check
# and dir/bin/m3serve built elsewhere (same CUDA 13.0), with the shared libraries they need beyond the GPU machine's
# in dir/device-libs (NCCL not among them: the GPU machine's wheel, scripts/nccl-env.sh)
# (`PREBUILT=dir scripts/gpu-check-model.sh prepare`, run here, gathers them and packs them into
# dir/device-pack-bin.txz and dir/device-pack-libs.txz: carry those, one per call, and unpack them
# there; scripts/gpu-session-check.sh does). Without PREBUILT it builds in $BUILD and needs .deps
# (scripts/device-deps-extra.sh). STEP_TIMEOUT, OPS_TIMEOUT, LATENCY_TIMEOUT and SANITIZE_TIMEOUT bound the
# steps (seconds; MODEL_TIMEOUT each checkpoint of the model steps), TIME_BUDGET the whole script (the summary always prints). The model
# steps run one process per checkpoint (logs model-<dir>.log); the ops steps one backend_ops (ops.log;
# OPS_ARGS adds its flags, e.g. --filter "msa " or --seed 7).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
STEPS=("$@")
((${#STEPS[@]})) || STEPS=(build ops model-quick bench latency sanitize)
has() { [[ " ${STEPS[*]} " == *" $1 "* ]]; }

if has prepare; then
  # On the build machine: the libraries backend_check and m3serve link that the GPU machine may
  # lack (everything but glibc, libstdc++/libgcc and CUDA's) in $PREBUILT/device-libs, and
  # stripped, xz-compressed archives of binaries and libraries (libnccl, 200 MB, stays behind: the
  # GPU machine has its own, scripts/nccl-env.sh): $PREBUILT/device-pack-bin.txz (m3serve and
  # the check binaries, ~3.5 MiB) and $PREBUILT/device-pack-libs.txz (the libraries, ~2.5 MiB),
  # and $PREBUILT/baseline-pack.txz (m3serve, backend_check and the libraries: this build as
  # another one's BASELINE in scripts/gpu-session-check.sh).
  # The device tool takes the tracked tree plus the carry within 64 MiB; with the tree near 58 MiB
  # the two do not fit in one call, so the first call carries device-pack-libs.txz and unpacks
  # it, and the next (within the machine's 30 s of idle warmth, so the unpacked files are still
  # there) carries device-pack-bin.txz and runs scripts/gpu-session-check.sh, which unpacks every
  # device-pack-*.txz it finds (docs/gpu-backend-notes.md "Session 10").
  dir=${PREBUILT:?prepare needs PREBUILT=build-dir}
  rm -rf "$dir/device-libs" "$dir/device-pack"; mkdir -p "$dir/device-libs"
  nccl_check=$dir/tests/parallel/nccl_communicator_check
  [[ -x "$nccl_check" ]] || nccl_check=
  ldd "$dir/tests/kernels_cuda/backend_ops" "$dir/tests/kernels_cuda/backend_check" "$dir/bin/m3serve" $nccl_check |
    awk '/=> \// {print $3}' | sort -u |
    grep -vE '/libc\.so|/libm\.so|/libdl\.so|/libpthread\.so|/librt\.so|/libstdc\+\+|/libgcc_s|/libcuda|/libcublas|/libnccl' |
    xargs -r -I{} cp -L {} "$dir/device-libs/"
  pack=$dir/device-pack
  rm -f "$dir"/device-pack*.txz "$dir/baseline-pack.txz"
  mkdir -p "$pack/bin" "$pack/tests/kernels_cuda" "$pack/tests/parallel"
  cp "$dir/tests/kernels_cuda/backend_ops" "$dir/tests/kernels_cuda/backend_check" "$pack/tests/kernels_cuda/"
  for extra in weight_decode_check msa_bench; do
    [[ -x "$dir/tests/kernels_cuda/$extra" ]] && cp "$dir/tests/kernels_cuda/$extra" "$pack/tests/kernels_cuda/"
  done
  [[ -n "$nccl_check" ]] && cp "$nccl_check" "$pack/tests/parallel/"
  cp "$dir/bin/m3serve" "$pack/bin/"
  cp -r "$dir/device-libs" "$pack/"
  strip "$pack/bin/m3serve" "$pack"/tests/kernels_cuda/* "$pack"/device-libs/* $(ls "$pack"/tests/parallel/* 2>/dev/null)
  # The binaries together (they share the CUDA kernels, which xz then stores about once), the
  # libraries apart.
  XZ_OPT=-9e tar cJf "$dir/device-pack-bin.txz" -C "$pack" bin tests
  XZ_OPT=-9e tar cJf "$dir/device-pack-libs.txz" -C "$pack" device-libs
  # The same binaries as a BASELINE for scripts/gpu-session-check.sh (m3serve, backend_check and
  # msa_bench beside their libraries): another build, e.g. the commit before a change or the default
  # options beside a build with other options, measured in the same device call.
  rm -rf "$pack/tests/kernels_cuda/backend_ops" "$pack/tests/parallel" "$pack"/tests/kernels_cuda/weight_decode_check
  XZ_OPT=-9e tar cJf "$dir/baseline-pack.txz" -C "$pack" bin tests device-libs
  # The bundled small model's weights (34 MB, ~27 MiB packed), which the carry recipe takes out of
  # the tree: carried with the two device packs (and no BASELINE: ~63 MiB in all), they let
  # model-quick, generate and speculative run on it; scripts/gpu-session-check.sh unpacks them
  # where the tree keeps them.
  XZ_OPT=-6 tar cJf "$dir/small-model-pack.txz" models/minimax-m3-small/model.safetensors
  rm -rf "$pack"
  ls -la "$dir/device-libs" "$dir"/device-pack-*.txz "$dir/baseline-pack.txz"
  tree_mib=$(git ls-files -z | xargs -0 cat | wc -c | awk '{printf "%.1f", $1 / 1048576}')
  echo "tracked tree: $tree_mib MiB; each call may carry 64 MiB minus that"
  exit 0
fi

BIN=$BUILD/tests/kernels_cuda/backend_check
OPS=$BUILD/tests/kernels_cuda/backend_ops
# cuBLASLt: the toolkit's, else the one PyTorch's wheels bring.
cublas_py=$(python3 -c "import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], 'lib'))" 2>/dev/null || true)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${cublas_py:+:$cublas_py}:${LD_LIBRARY_PATH:-}
source scripts/nccl-env.sh  # NCCL_NVLS_ENABLE=0, the wheel's libnccl.so.2
NCCL_CHECK=$BUILD/tests/parallel/nccl_communicator_check
if [[ -n "${PREBUILT:-}" ]]; then
  export LD_LIBRARY_PATH=$PWD/$PREBUILT/device-libs:$LD_LIBRARY_PATH
  if ldd "$PREBUILT/tests/kernels_cuda/backend_check" "$PREBUILT/tests/kernels_cuda/backend_ops" >"$OUT/prebuilt.log" 2>&1 &&
     ! grep -q "not found" "$OUT/prebuilt.log"; then
    BIN=$PREBUILT/tests/kernels_cuda/backend_check
    OPS=$PREBUILT/tests/kernels_cuda/backend_ops
    NCCL_CHECK=$PREBUILT/tests/parallel/nccl_communicator_check
    STEPS=("${STEPS[@]/build/}")
  else
    echo "gpu-check-model: the prebuilt backend_check / backend_ops cannot run here:"; grep -E "not found|error" "$OUT/prebuilt.log"
  fi
fi
status=0
summary=()
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv >"$OUT/gpu.txt" 2>&1

if has build; then
  t0=$(date +%s)
  DEPS=$PWD/.deps/usr
  export LD_LIBRARY_PATH=$DEPS/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
  pkgconf=$(command -v pkg-config || echo "$DEPS/bin/pkgconf")
  if cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DM3_CUDA=ON -DM3_BUILD_TESTS=ON -DM3_BUILD_SERVER=OFF \
      -DCMAKE_PREFIX_PATH="$DEPS" -DPKG_CONFIG_EXECUTABLE="$pkgconf" >"$OUT/configure.log" 2>&1 &&
     cmake --build "$BUILD" --target backend_ops backend_check weight_decode_check nccl_communicator_check -j "$(nproc)" \
       >"$OUT/build.log" 2>&1; then
    summary+=("build: ok in $(($(date +%s) - t0)) s")
  else
    tail -30 "$OUT/configure.log"; grep -E "error|Error" "$OUT/build.log" | head -30
    echo "gpu-check-model: build FAILED"; exit 1
  fi
fi

# TIME_BUDGET (seconds from start) bounds the whole script: each step gets at most what is left,
# less a margin for the summary, and steps past it are skipped (and reported).
t_start=$(date +%s)
limit_for() {  # the step's own limit, cut to what the time budget leaves
  local left=$((${TIME_BUDGET:-100000} - ($(date +%s) - t_start) - 5))
  ((left < 1)) && left=1
  ((left < $1)) && echo "$left" || echo "$1"
}
# True when a checkpoint directory holds its weights (the device call's carry may leave the small
# model's out of the tree: prepare packs them apart, small-model-pack.txz).
weights_here() { compgen -G "$1/*.safetensors" >/dev/null; }

run_step() {  # name, then the command
  local name=$1; shift
  local t0=$(date +%s) lim
  lim=$(limit_for "${STEP_TIMEOUT:-600}")
  if ((lim < 3)); then summary+=("$name: skipped (time budget spent)"); status=1; return; fi
  timeout "$lim" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$name: rc $rc in $(($(date +%s) - t0)) s: $(tail -1 "$OUT/$name.log")")
  ((rc)) && status=1
  grep -E "^FAIL|error" "$OUT/$name.log" | head -40
}

# The op harness in one process, synchronous launches: a kernel fault is reported by the case that
# caused it (after a sticky CUDA error the harness fails the remaining cases unrun and says so).
# One process per checkpoint: a sticky error then costs that checkpoint only.
MODEL_DIRS=(tests/model_golden/data/tiny-mixed tests/model_golden/data/tiny-sparse-local2
            tests/model_golden/data/tiny-vl tests/model_golden/data/release-mxfp8-nvfp4
            tests/model_golden/data/release-modelopt-nvfp4 models/minimax-m3-tiny models/minimax-m3-small)
for quick in "" -quick; do
  if has "ops$quick"; then
    CUDA_LAUNCH_BLOCKING=1 STEP_TIMEOUT=${OPS_TIMEOUT:-${STEP_TIMEOUT:-600}} run_step "ops$quick" "$OPS" ${quick:+--quick} ${OPS_ARGS:-}
  fi
  if has "model$quick"; then
    for d in "${MODEL_DIRS[@]}"; do
      if ! weights_here "$d"; then
        summary+=("model$quick-$(basename "$d"): not run: $d has no weights here (carry \$PREBUILT/small-model-pack.txz)")
        status=1
        continue
      fi
      STEP_TIMEOUT=${MODEL_TIMEOUT:-${STEP_TIMEOUT:-600}} run_step "model$quick-$(basename "$d")" "$BIN" model ${quick:+--quick} "$d"
    done
  fi
done
# Every op case timed on the GPU (CUDA events) against the H200 floors.
if has ops-perf; then STEP_TIMEOUT=${OPS_TIMEOUT:-${STEP_TIMEOUT:-600}} run_step ops-perf "$OPS" --perf ${OPS_ARGS:-}; fi
# CUDA graph replay vs eager (bitwise logits and KV bytes over decode steps).
if has graphs; then run_step graphs "$BIN" graphs; fi
# The decode GEMMs' fast weight expansion against the exact float path, every code and scale.
if has decode-exact; then run_step decode-exact "$(dirname "$BIN")/weight_decode_check"; fi
# The NCCL Communicator on every GPU here, one thread per rank (world sizes 1, 2 and all GPUs):
# the table and every check in nccl.log, the summary line "N passed, F failed".
if has nccl; then
  if [[ -x "$NCCL_CHECK" ]]; then run_step nccl "$NCCL_CHECK" --verbose
  else summary+=("nccl: no $NCCL_CHECK (built with CUDA and NCCL only)"); status=1; fi
fi
if has bench; then
  timeout "$(limit_for "${STEP_TIMEOUT:-600}")" "$BIN" bench >"$OUT/bench.log" 2>&1
  rc=$?
  summary+=("bench: rc $rc"); ((rc)) && status=1
  cat "$OUT/bench.log"
fi
if has latency; then
  # LATENCY_LAYERS layers of dummy M3.1 (default 2): host memory ~4.5 GB per layer plus the head.
  timeout "$(limit_for "${LATENCY_TIMEOUT:-120}")" "$BIN" latency --layers "${LATENCY_LAYERS:-2}" >"$OUT/latency.log" 2>&1
  rc=$?
  summary+=("latency: rc $rc"); ((rc)) && status=1
  cat "$OUT/latency.log"
fi
if has profile; then
  # Kernel time per decode step by kernel (nsys, when the machine has it): 2 layers, 8K, batch 1 and 64.
  nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  if [[ -n "$nsys" ]]; then
    for c in 8192x1 8192x64; do
      timeout "$(limit_for 60)" "$nsys" profile -o "/tmp/prof-$c" --force-overwrite true -t cuda \
        "$BIN" latency --layers 2 --case "$c" >"$OUT/profile-$c.log" 2>&1 &&
        timeout "$(limit_for 30)" "$nsys" stats -q --report cuda_gpu_kern_sum --format csv "/tmp/prof-$c.nsys-rep" \
          >"$OUT/profile-$c.csv" 2>>"$OUT/profile-$c.log"
      summary+=("profile $c: rc $? ($(wc -l <"$OUT/profile-$c.csv" 2>/dev/null || echo 0) kernel rows)")
    done
  else
    summary+=("profile: no nsys on this machine")
  fi
fi
# m3serve on the GPU (PREBUILT only: $PREBUILT/bin/m3serve): greedy generate on both devices for
# every KV dtype (ids must agree; tokens/s reported), then a serve smoke test over HTTP.
M3BIN=${PREBUILT:+$PREBUILT/bin/m3serve}
if has generate && [[ -x "${M3BIN:-}" ]]; then
  prompt=$(seq -s, 3 5 250)  # within the tiny checkpoints' 256-token vocabulary
  for d in tests/model_golden/data/tiny-mixed tests/model_golden/data/release-mxfp8-nvfp4 models/minimax-m3-tiny \
           models/minimax-m3-small; do
    if ! weights_here "$d"; then
      summary+=("generate-$(basename "$d"): not run: $d has no weights here (carry \$PREBUILT/small-model-pack.txz)")
      status=1
      continue
    fi
    for kv in bfloat16 fp8 nvfp4; do
      name="generate-$(basename "$d")-$kv"
      for dev in cpu cuda; do
        timeout "$(limit_for 60)" "$M3BIN" generate --model "$d" --device $dev --kv-cache-dtype $kv --prompt-ids "$prompt" \
          --max-tokens 32 --ignore-eos --json >"$OUT/$name-$dev.json" 2>"$OUT/$name-$dev.log"
      done
      summary+=("$name: $(python3 scripts/compare_generate.py "$OUT/$name-cpu.json" "$OUT/$name-cuda.json")")
    done
  done
fi
# Speculative decoding on the GPU (the small model, NVFP4 KV; SPEC_METHODS, default "ngram dspark":
# prompt lookup and the shipped DSpark drafter): with --batch-invariant a verification step's rows
# are the decode steps' rows, so greedy and seeded ids must equal plain decoding's; without it (the
# default kernels) the first differing index is reported.
if has speculative && [[ -x "${M3BIN:-}" ]] && ! weights_here models/minimax-m3-small; then
  summary+=("speculative: not run: models/minimax-m3-small has no weights here (carry \$PREBUILT/small-model-pack.txz)")
  status=1
elif has speculative && [[ -x "${M3BIN:-}" ]]; then
  d=models/minimax-m3-small
  prompt=650,444,566,371,284,258,384,864,777,936,296,335,259,323,2356,272,4523,258,384,301,3875,433,11,2139,335,259,323,2356,1132,5802,345,258,384,6437,433,335
  for method in ${SPEC_METHODS:-ngram dspark}; do
  for mode in bi default; do
    flags=(--device cuda --kv-cache-dtype nvfp4 --prompt-ids "$prompt" --max-tokens 96 --ignore-eos --json)
    [[ $mode == bi ]] && flags+=(--batch-invariant)
    for t in 0 0.8; do
      base="$OUT/spec-$method-$mode-t$t"
      timeout "$(limit_for 60)" "$M3BIN" generate --model "$d" "${flags[@]}" --temperature $t --sample-seed 5 \
        >"$base-plain.json" 2>"$base-plain.log"
      for k in 3 7; do
        extra=""
        [[ $method == ngram ]] && extra=',"prompt_lookup_min":2'
        timeout "$(limit_for 60)" "$M3BIN" generate --model "$d" "${flags[@]}" --temperature $t --sample-seed 5 \
          --speculative-config "{\"method\":\"$method\",\"num_speculative_tokens\":$k$extra}" \
          >"$base-k$k.json" 2>"$base-k$k.log"
        strict=()
        [[ $mode == bi ]] && strict=(--require-identical)
        summary+=("speculative $method $mode t=$t k=$k: $(python3 scripts/compare_generate.py "$base-plain.json" \
          "$base-k$k.json" --label-a plain --label-b speculative "${strict[@]}")")
      done
    done
  done
  done
fi
if has serve && [[ -x "${M3BIN:-}" ]]; then
  timeout "$(limit_for 90)" python3 - "$M3BIN" >"$OUT/serve.log" 2>&1 <<'PY'
import sys
sys.path.insert(0, "tests/server")
from live_server import LiveServer
s = LiveServer([sys.argv[1], "serve", "models/minimax-m3-tiny", "--device", "cuda", "--host", "127.0.0.1",
                "--port", "0", "--max-model-len", "1024", "--gpu-memory-utilization", "0.3", "--disable-log-stats"])
try:
    r = s.post("/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 16, "ignore_eos": True,
                                   "temperature": 0})
    print("completion:", repr(r["choices"][0]["text"]), r["usage"])
    r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
    print("chat:", r["choices"][0]["finish_reason"], r["usage"])
    r = s.post("/v1/completions", {"prompt": ["a b c", "d e f g", "h"], "max_tokens": 12, "ignore_eos": True})
    print("batch of 3:", [c["finish_reason"] for c in r["choices"]])
finally:
    code = s.stop()
    print("".join(l for l in s.log if "KV cache" in l or "gpu-memory" in l or "backend" in l))
    print("".join(s.log[-4:]))
    print("serve: exit", code)
PY
  rc=$?
  summary+=("serve: rc $rc: $(tail -1 "$OUT/serve.log")")
  ((rc)) && status=1
fi
# m3serve's own benchmarks on the M3.1 shape (dummy weights in the release formats), as
# docs/gpu-backend-notes.md "Benchmark commands": BENCH_LAYERS layers (default 20) for 8K,
# BENCH_LAYERS_LONG (default 8: 3 dense + 5 MoE) for the 128K contexts whose KV pool would not fit beside 20.
M31=(--model bench/configs/minimax-m3.1 --load-format dummy --device cuda --kv-cache-dtype nvfp4
     --attention-config '{"indexer_kv_dtype": "nvfp4"}')
if has bench-latency && [[ -x "${M3BIN:-}" ]]; then
  for spec in "${BENCH_LAYERS:-20}:8192:8192,65536" "${BENCH_LAYERS_LONG:-8}:131072:"; do
    IFS=: read -r layers ctx prefill <<<"$spec"
    name=bench-latency-$ctx
    timeout "$(limit_for "${BENCH_TIMEOUT:-240}")" "$M3BIN" bench latency "${M31[@]}" --num-layers "$layers" \
      --batch-sizes "${BENCH_BATCHES:-1,8,32,64,128}" --context-lens "$ctx" --prefill-lens "$prefill" \
      --json >"$OUT/$name.json" 2>"$OUT/$name.log"
    rc=$?
    summary+=("$name ($layers layers): rc $rc"); ((rc)) && status=1
    tail -40 "$OUT/$name.log"
  done
fi
if has bench-throughput && [[ -x "${M3BIN:-}" ]]; then
  timeout "$(limit_for "${BENCH_TIMEOUT:-240}")" "$M3BIN" bench throughput "${M31[@]}" --num-layers "${BENCH_LAYERS:-20}" \
    --num-prompts 256 --input-len 1024 --output-len 256 --max-num-seqs 128 --max-num-batched-tokens 8192 \
    >"$OUT/bench-throughput.log" 2>&1
  rc=$?
  summary+=("bench-throughput: rc $rc: $(tail -1 "$OUT/bench-throughput.log")"); ((rc)) && status=1
fi
# The server's HTTP suite against the CUDA build (--device auto picks the GPU).
if has http && [[ -x "${M3BIN:-}" ]]; then
  M3SERVE_BIN=$M3BIN timeout "$(limit_for "${HTTP_TIMEOUT:-300}")" python3 tests/server/test_http_api.py -v \
    >"$OUT/http.log" 2>&1
  rc=$?
  summary+=("http suite on cuda: rc $rc: $(grep -E "^(Ran|OK|FAILED)" "$OUT/http.log" | tr '\n' ' ')"); ((rc)) && status=1
  grep -E "^(FAIL|ERROR):" "$OUT/http.log" | head -20
fi
# --batch-invariant on cuda: tests/server/test_determinism.py (a request's greedy text alone vs in a
# batch of 32 with preemption, chunked prefill and prefix-cache hits; seeded sampling) on the tiny
# model, both servers given the flag through M3SERVE_EXTRA_ARGS.
if has determinism && [[ -x "${M3BIN:-}" ]]; then
  M3SERVE_BIN=$M3BIN M3SERVE_EXTRA_ARGS="--device cuda --batch-invariant" \
    timeout "$(limit_for "${DETERMINISM_TIMEOUT:-150}")" python3 tests/server/test_determinism.py -v >"$OUT/determinism.log" 2>&1
  rc=$?
  summary+=("determinism on cuda --batch-invariant: rc $rc: $(grep -E "^(Ran|OK|FAILED)" "$OUT/determinism.log" | tr '\n' ' ')")
  ((rc)) && status=1
  grep -E "^(FAIL|ERROR):|AssertionError" "$OUT/determinism.log" | head -20
fi
if has sanitize; then
  # memcheck over every op (quick shapes) and a whole model; racecheck over the linear kernels
  # (shared-memory tiles, split-K reduction), the generic attention kernels and sampling; initcheck over the
  # expert-parallel MoE cases.
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  sanitize() {  # name, tool, then the program and its arguments
    local name=$1 tool=$2; shift 2
    timeout "$(limit_for "${SANITIZE_TIMEOUT:-90}")" "$sanitizer" --tool "$tool" --error-exitcode 9 "$@" \
      >"$OUT/sanitize_$name.log" 2>&1
    local rc=$?
    summary+=("sanitize $name ($tool): rc $rc, $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize_$name.log" | tail -1)")
    ((rc)) && status=1
  }
  sanitize ops memcheck "$OPS" --quick --seed 17
  sanitize model memcheck "$BIN" model --quick tests/model_golden/data/tiny-mixed
  sanitize linear racecheck "$OPS" --quick --seed 5 --filter linear
  sanitize attention racecheck "$OPS" --quick --seed 5 --filter "tiny kv nvfp4"
  # Sampling and logprobs: a row's CTAs exchange through distributed shared memory. racecheck over
  # clusters is slow: the peaked rows only (greedy, top-k, top-p and logprobs over the cluster
  # exchanges), 120 s (every vocab 37 case needed more than 60 s, session 37).
  SANITIZE_TIMEOUT=120 sanitize sampling racecheck "$OPS" --quick --seed 5 --filter "vocab 37 peaked"
  # Expert parallel: choices of experts held elsewhere must never read the skipped rows.
  sanitize moe-ep initcheck "$OPS" --quick --seed 17 --filter " ep ["
fi

echo "---- gpu-check-model summary ----"
cat "$OUT/gpu.txt"
printf '%s\n' "${summary[@]}"
exit $status
