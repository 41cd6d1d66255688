#!/usr/bin/env bash
# The GPU machine's job for the MSA kernels of kernels/cuda: build, check them against the CPU
# reference (backend_ops' cases whose name starts "msa ": op_harness.h), run compute-sanitizer on
# the quick ones, run the benchmarks; full logs to $OUT (default out/), a short table last. Needs .deps (scripts/device-deps-extra.sh) carried along.
#
#   scripts/gpu-check.sh [STEP...]     steps: build check sanitize sass bench-quick bench (default:
#                                      build check sanitize bench); extra msa_bench flags: BENCH_ARGS
# SANITIZERS picks compute-sanitizer tools (default: memcheck racecheck synccheck initcheck).
# PREBUILT=build-dir uses binaries built elsewhere (same CUDA 13.0; carry that folder) and builds
# here only when they do not start.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
STEPS=("$@")
((${#STEPS[@]})) || STEPS=(build check sanitize bench)
DEPS=$PWD/.deps/usr
export LD_LIBRARY_PATH=$DEPS/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/usr/local/cuda/lib64
BIN=$BUILD/tests/kernels_cuda
if [[ -n "${PREBUILT:-}" ]]; then
  ldd "$PREBUILT/tests/kernels_cuda/backend_ops" "$PREBUILT/tests/kernels_cuda/msa_bench" >"$OUT/prebuilt.log" 2>&1
  if ! grep -q "not found" "$OUT/prebuilt.log"; then
    BIN=$PREBUILT/tests/kernels_cuda
    BUILD=$PREBUILT
    STEPS=("${STEPS[@]/build/}")
  fi
fi
status=0
summary=()
has() { [[ " ${STEPS[*]} " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv >"$OUT/gpu.txt" 2>&1
nvcc --version | tail -1 >>"$OUT/gpu.txt"

if has build; then
  t0=$(date +%s)
  pkgconf=$(command -v pkg-config || echo "$DEPS/bin/pkgconf")
  if cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DM3_CUDA=ON -DM3_BUILD_TESTS=ON -DM3_BUILD_SERVER=OFF \
      -DCMAKE_PREFIX_PATH="$DEPS" -DPKG_CONFIG_EXECUTABLE="$pkgconf" >"$OUT/configure.log" 2>&1 &&
     cmake --build "$BUILD" --target backend_ops msa_bench -j "$(nproc)" >"$OUT/build.log" 2>&1; then
    summary+=("build: ok in $(($(date +%s) - t0)) s")
  else
    tail -30 "$OUT/configure.log"; grep -E "error|Error" "$OUT/build.log" | head -30
    echo "gpu-check: build FAILED"; exit 1
  fi
fi

if has sass; then
  lib=$BUILD/kernels/cuda/libm3_kernels_cuda.a
  cuobjdump -sass "$lib" >"$OUT/sass.txt" 2>&1
  # Per kernel: registers aside, the instruction mix that matters (tensor cores, conversions, smem).
  awk '/Function :/ {name=$3} /HMMA|QGMMA|HGMMA|F2FP|PRMT|LDSM|LDS|STS|LDGSTS|LDL|STL|BAR/ {
         for (k in ops) if (index($0, ops[k])) cnt[name" "ops[k]]++ }
       BEGIN {split("HMMA F2FP PRMT LDSM LDS STS LDGSTS LDL STL BAR", ops, " ")}
       END {for (x in cnt) print x, cnt[x]}' "$OUT/sass.txt" | sort >"$OUT/sass_mix.txt"
  gzip -f "$OUT/sass.txt"
  summary+=("sass: $(wc -l <"$OUT/sass_mix.txt") kernel/op counts in sass_mix.txt")
fi

if has check; then
  "$BIN/backend_ops" --filter "msa " >"$OUT/check.log" 2>&1
  rc=$?
  summary+=("check: $(tail -1 "$OUT/check.log") (rc $rc)")
  ((rc)) && status=1
  grep -E "^FAIL" "$OUT/check.log" | head -80
fi

for step in bench-quick bench; do
  has $step || continue
  args=(${BENCH_ARGS:-})
  [[ $step == bench-quick ]] && args+=(--quick)
  "$BIN/msa_bench" "${args[@]}" >"$OUT/$step.log" 2>&1
  rc=$?
  summary+=("$step: rc $rc")
  ((rc)) && status=1
  cat "$OUT/$step.log"
done

if has sanitize; then
  for tool in ${SANITIZERS:-memcheck racecheck synccheck initcheck}; do
    compute-sanitizer --tool "$tool" --error-exitcode 9 "$BIN/backend_ops" --quick --seed 17 --filter "msa " \
      >"$OUT/sanitize_$tool.log" 2>&1
    rc=$?
    summary+=("sanitize $tool: rc $rc, $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize_$tool.log" | tail -1)")
    ((rc)) && status=1
  done
fi

echo "---- gpu-check summary ----"
cat "$OUT/gpu.txt"
printf '%s\n' "${summary[@]}"
exit $status
