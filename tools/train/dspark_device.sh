#!/usr/bin/env bash
# The DSpark drafter of the bundled small model, as run on the GPU machine: corpus and tokens (as
# run_device.sh prepares them, skipped when $W/tokens is there), training against the committed
# target, export to dspark/, acceptance on held-out text, the reference m3serve is checked
# against. Everything it keeps goes to $OUT/dspark-results.tgz as repository paths.
#
#   OUT=/tmp/out bash tools/train/dspark_device.sh              # DSPARK_SECONDS (default 360)
#   SMOKE=1 OUT=/tmp/out bash tools/train/dspark_device.sh      # 15 s of training, small evals
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/dspark-out}
W=${M3SMALL_WORK:-/tmp/m3small}
T=tools/train
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ ! -f "$W/tokens/train.npy" ]; then
  SKIP_SMOKE=1 PREP_ONLY=1 OUT=/tmp/dspark-prep bash $T/run_device.sh > "$OUT/prep.log" 2>&1
fi
if [ "${SMOKE:-0}" = 1 ]; then
  D=/tmp/dspark-smoke; SECONDS_TRAIN=15; ROWS=4
else
  D=/tmp/dspark-run; SECONDS_TRAIN=${DSPARK_SECONDS:-360}; ROWS=64
fi
S=$D/stage
mkdir -p "$D" "$S/models/minimax-m3-small" "$S/tools/train/results/dspark" "$S/tests/model_small"
python3 $T/dspark.py train --tokens $W/tokens --out $D --seconds "$SECONDS_TRAIN" 2>&1 | tee "$OUT/dspark-train.log" | tail -5
python3 $T/dspark.py eval --draft $D/dspark --tokens $W/tokens --rows "$ROWS" --out $S/tools/train/results/dspark/eval.json
python3 $T/dspark.py fixture --draft $D/dspark --tokens $W/tokens --out $S/tests/model_small/dspark_reference.json
cp -r $D/dspark "$S/models/minimax-m3-small/"
cp $D/dspark_train_log.jsonl $S/tools/train/results/dspark/
tar -C "$S" -czf "$OUT/dspark-results.tgz" .
ls -la "$OUT"
