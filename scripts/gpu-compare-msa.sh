#!/usr/bin/env bash
# Builds of the MSA kernels measured side by side in one device call: each variant's op cases,
# then msa_bench's target rows (and the prefill suite) of every variant in turn, ROUNDS rounds, so
# that drift of the machine shows as spread between rounds rather than between variants.
#
# The pack (default build/msa-variants.txz) holds one folder per variant with its msa_bench and,
# where the variant's op cases should run, its backend_ops. Made here, for example:
#   mkdir -p /tmp/var/base /tmp/var/new
#   ninja -C build tests/kernels_cuda/msa_bench && cp build/tests/kernels_cuda/msa_bench /tmp/var/base/
#   (apply the change) ninja -C build tests/kernels_cuda/msa_bench tests/kernels_cuda/backend_ops
#   cp build/tests/kernels_cuda/{msa_bench,backend_ops} /tmp/var/new/
#   tar -C /tmp/var -cJf build/msa-variants.txz base new
# and run on the device carrying the pack and build/device-pack-libs.txz:
#   VARIANTS="base new" scripts/gpu-compare-msa.sh
#
# VARIANTS: the folders, in order (default: every folder of the pack); CASES: msa_bench --case
# Q,B,TOKENS rows (default "1,64,131072 8,64,131072 1,8,131072 1,1,131072"); PREFILL=1 adds
# `--suite prefill --quick`; SEEDS: backend_ops seeds (default "1 2"); NCU_CASE: a case (Q,B,TOKENS)
# whose first launch of NCU_KERNEL (default sparse_rows_kernel) is profiled per SASS instruction for
# every variant (ncu-sass-<v>.csv.gz: executions and stall samples per instruction); NCU_ARGS: msa_bench's
# arguments for that run instead (e.g. "--prefill-case c17ccf --dtype nvfp4" with
# NCU_KERNEL=sparse_groups_kernel: the union walk of one prefill shape);
# DEADLINE: seconds after which no new bench starts (default 400). Logs under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/msa-compare}
mkdir -p "$OUT"
PACK=${PACK:-build/msa-variants.txz}
V=build/msa-variants
T0=$(date +%s)
left() { echo $(( ${DEADLINE:-400} - ($(date +%s) - T0) )); }

python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$PACK" "$V" || exit 1
[[ -d build/device-libs ]] ||
  python3 -c "import tarfile; tarfile.open('build/device-pack-libs.txz').extractall('build')" || exit 1
export LD_LIBRARY_PATH=$PWD/build/device-libs:/usr/local/cuda/lib64
VARIANTS=${VARIANTS:-$(cd "$V" && ls -d */ | tr -d / | tr '\n' ' ')}
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/summary.txt"

for v in $VARIANTS; do
  [[ -x $V/$v/backend_ops ]] || continue
  for s in ${SEEDS:-1 2}; do
    timeout 150 "$V/$v/backend_ops" --filter msa --seed "$s" > "$OUT/ops-$v-$s.log" 2>&1
    echo "$v ops --filter msa --seed $s rc $?: $(tail -1 "$OUT/ops-$v-$s.log")" | tee -a "$OUT/summary.txt"
    grep '^FAIL' "$OUT/ops-$v-$s.log" | head -5 | tee -a "$OUT/summary.txt"
  done
done

# Target rows: "nvfp4 Q B tokens | idx+topk %cpy >=70% | sparse %floor | msa_us dense_fl x dense".
for r in $(seq 1 "${ROUNDS:-2}"); do
  for c in ${CASES:-1,64,131072 8,64,131072 1,8,131072 1,1,131072}; do
    for v in $VARIANTS; do
      (( $(left) > 30 )) || { echo "deadline: no more benches" | tee -a "$OUT/summary.txt"; break 3; }
      timeout 40 "$V/$v/msa_bench" --case "$c" --dtype nvfp4 > "$OUT/bench.log" 2>&1
      echo "r$r $v $c: $(grep '^nvfp4 ' "$OUT/bench.log" | head -1)" | tee -a "$OUT/summary.txt"
    done
  done
  if [[ -n "${PREFILL:-}" ]]; then
    for v in $VARIANTS; do
      (( $(left) > 60 )) || break
      timeout 90 "$V/$v/msa_bench" --suite prefill --quick --dtype nvfp4 > "$OUT/prefill-$v-$r.log" 2>&1
      echo "r$r $v prefill rc $?:" | tee -a "$OUT/summary.txt"
      grep '^prefill_' "$OUT/prefill-$v-$r.log" | tee -a "$OUT/summary.txt"
    done
  fi
done

if [[ -n "${NCU_CASE:-}${NCU_ARGS:-}" ]] && command -v ncu > /dev/null; then
  read -r -a ncu_args <<< "${NCU_ARGS:---case ${NCU_CASE:-} --dtype nvfp4}"
  for v in $VARIANTS; do
    (( $(left) > 40 )) || break
    timeout 60 ncu --clock-control none --kernel-name "regex:${NCU_KERNEL:-sparse_rows_kernel}" --launch-count 1 \
      --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
      "$V/$v/msa_bench" "${ncu_args[@]}" 2>&1 | gzip > "$OUT/ncu-sass-$v.csv.gz"
    echo "ncu $v rc ${PIPESTATUS[0]}" | tee -a "$OUT/summary.txt"
  done
fi
echo "done after $(( $(date +%s) - T0 )) s" | tee -a "$OUT/summary.txt"
