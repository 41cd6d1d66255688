#!/usr/bin/env bash
# The whole small-model pipeline, as run on the GPU machine (torch, transformers, tokenizers,
# safetensors): corpus -> smoke pass of every later step on tiny sizes (fails fast) -> tokenizer
# -> three training stages -> export -> PyTorch evaluation. Results are packed into $OUT as tarballs
# of repository paths (split in 15 MiB parts), also when a step fails or the run is stopped.
#
#   OUT=/tmp/out bash tools/train/run_device.sh        # TIME_A/TIME_B/TIME_C: stage seconds
#   SKIP_SMOKE=1 RESUME=ckpt.pt STAGES=c ...           # continue from a stage checkpoint
#   SKIP_SMOKE=1 RESUME_RELEASE=models/minimax-m3-small STAGES=d TIME_D=360 ...
#                                                      # stage d on the committed model
#   RUN=name ...                                       # training, model and eval under $W/name-*
#   EXTRA=build/debian-py.tar.xz ...                   # more train files (tools/train/debian_sources.py)
#   PREP_ONLY=1 ...                                    # corpus and tokens only; then several RUN=
#                                                      # trainings may share the GPU (OUT apart)
#
# Chunks: the script stops training CHUNK seconds after it started (default: no limit), leaving
# $W/train/state.pt, and packs the logs only. The same command run again on the same machine
# (the work directory $W is kept) skips the corpus and tokenizer and continues the training where
# it stopped; the call that finishes the last stage exports, evaluates and packs the model.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/m3small-out}
W=${M3SMALL_WORK:-/tmp/m3small}
T=tools/train
TIME_A=${TIME_A:-95}
TIME_B=${TIME_B:-15}
TIME_C=${TIME_C:-25}
TIME_D=${TIME_D:-30}
TIME_E=${TIME_E:-30}
STAGES=${STAGES:-a,b,c}
CHUNK=${CHUNK:-0}
BATCH_TOKENS=${BATCH_TOKENS:-32768}
# The tokenizer of the committed model: a retrained model keeps its ids (train_tokenizer.py).
TOKENIZER_FROM=${TOKENIZER_FROM-models/minimax-m3-small}
PAUSED=0
# One work directory per training run: a second run on the same machine reuses corpus and tokens.
TR=$W/${RUN:+$RUN-}train
MD=$W/${RUN:+$RUN-}model
EV=$W/${RUN:+$RUN-}eval
ST=$W/${RUN:+$RUN-}stage
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
mkdir -p "$OUT" "$ST/tools/train/results" "$ST/tools/train/eval" "$ST/tests/model_small"
exec > >(tee -a "$OUT/run.log") 2>&1
stamp() { echo "=== $(date +%T) +${SECONDS}s $*"; }

pack() {
  local rc=$?
  trap - EXIT TERM INT
  set +e
  stamp "pack (exit $rc)"
  local R=$ST/tools/train/results
  cp -f "$W/corpus/corpus.json" "$W/tokens/tokens.json" "$TR/summary.json" "$TR/train_log.jsonl" \
     "$EV/eval_torch.json" "$R/" 2>/dev/null || true
  [ -f "$W/corpus/code_prompts.json" ] && cp -f "$W/corpus/code_prompts.json" "$ST/tests/model_small/"
  [ -f "$W/corpus/manifest.tsv" ] && gzip -9 -n -c "$W/corpus/manifest.tsv" > "$R/corpus_manifest.tsv.gz"
  [ -f "$EV/engine_windows.json" ] && cp -f "$EV/engine_windows.json" "$ST/tools/train/eval/"
  [ -f "$EV/heldout_sample.json" ] && cp -f "$EV/heldout_sample.json" "$ST/tests/model_small/"
  if [ "$PAUSED" = 1 ]; then
    echo "paused: the training state stays in $TR/state.pt; run the same command again"
  elif [ -f "$MD/model.safetensors" ]; then
    mkdir -p "$ST/models" && rm -rf "$ST/models/minimax-m3-small" && cp -r "$MD" "$ST/models/minimax-m3-small"
  else
    # No export: keep the newest stage checkpoint (bf16) to resume from.
    local ck
    ck=$(ls -t "$TR"/ckpt_*.pt 2>/dev/null | head -1 || true)
    [ -n "$ck" ] && python3 -c "import torch,sys; c=torch.load(sys.argv[1]); c['state_dict']={k:v.bfloat16() for k,v in c['state_dict'].items()}; torch.save(c, sys.argv[2])" "$ck" "$ST/resume.pt" || true
  fi
  tar -C "$ST" -czf - . | split -b 15m -d - "$OUT/results.tgz.part-"
  [ -d "$W/smoke" ] && tar -C "$W/smoke" -czf "$OUT/smoke.tgz" --exclude='*.pt' --exclude='*.npy' --exclude='*.safetensors' --exclude='*.jsonl' . 2>/dev/null || true
  [ -d "$W/smoke/train" ] && cp -f "$W/smoke/train/train_log.jsonl" "$OUT/smoke_train_log.jsonl" 2>/dev/null || true
  ls -la "$OUT"
  exit $rc
}
trap pack EXIT TERM INT

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python3 -c "import torch, transformers, tokenizers, safetensors; print('torch', torch.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__)"

if [ -f "$W/tokens/tokens.json" ] && [ -f "$TR/state.pt" ]; then
  stamp "continuing: corpus and tokens of the last call, training from $TR/state.pt"
  SKIP_SMOKE=1 PREPARED=1
elif [ -f "$W/tokens/tokens.json" ] && [ -n "${RUN:-}" ]; then
  stamp "run $RUN: corpus and tokens of an earlier call"
  SKIP_SMOKE=1 PREPARED=1
fi
if [ -n "${RESUME_RELEASE:-}" ] && [ ! -f "$TR/summary.json" ]; then
  # Stage d on a committed model: its log continues the one that built it.
  mkdir -p "$TR" && cp -f $T/results/summary.json $T/results/train_log.jsonl "$TR/"
fi

if [ "${PREPARED:-0}" != 1 ]; then
stamp corpus
EXTRA_ARGS=()
if [ -n "${EXTRA:-}" ]; then
  rm -rf "$W/extra" && mkdir -p "$W/extra" && tar -xJf "$EXTRA" -C "$W/extra"
  [ -f "$EXTRA.json" ] && cp -f "$EXTRA.json" "$ST/tools/train/results/debian_sources.json"
  EXTRA_ARGS=(--extra "$W/extra")
fi
python3 $T/corpus.py --out $W/corpus "${EXTRA_ARGS[@]}"
fi

if [ "${SKIP_SMOKE:-0}" != 1 ]; then
  stamp smoke
  S=$W/smoke
  python3 $T/train_tokenizer.py --corpus $W/corpus --out $S/tokenizer --tokens-out $S/tokens --vocab-size 2048 \
    --sample-mb 2 --max-docs 1500
  # Pause and continue once, as the chunked run does.
  smoke_train() {
    python3 $T/train.py --tokens $S/tokens --out $S/train --size smoke --time-a 4 --time-b 2 --time-c 3 --seq 512 \
      --long-seq 1024 --batch-tokens 4096 --eval-seq 1024 --eval-windows 2 --log-every 5 --stages a,b,c,d \
      --time-d 3 --tokenizer $S/tokenizer --ul-batch 8 --ul-prefix 96 --ul-new 32 "$@"
  }
  rc=0; smoke_train --stop-after 3 || rc=$?
  [ "$rc" = 75 ] || { echo "smoke: expected a pause (75), got $rc"; exit 1; }
  smoke_train
  python3 $T/export.py --ckpt $S/train/ckpt_d.pt --tokenizer $S/tokenizer --out $S/model
  python3 $T/eval_torch.py --model $S/model --tokens $S/tokens --out $S/eval --engine-out $S/eval \
    --fixture-out $S/eval --short 512 --long 2048 --windows-long 2
  stamp smoke passed
fi

if [ "${PREPARED:-0}" != 1 ]; then
stamp tokenizer
python3 $T/train_tokenizer.py --corpus $W/corpus --out $W/tokenizer --tokens-out $W/tokens \
  ${TOKENIZER_FROM:+--tokenizer-from "$TOKENIZER_FROM"}
fi
if [ "${PREP_ONLY:-0}" = 1 ]; then
  stamp "prepared (PREP_ONLY): corpus and tokens in $W"
  exit 0
fi
stamp train
STOP=()
if [ "$CHUNK" -gt 0 ]; then
  # Leave time to save the state and pack (about 20 s).
  STOP=(--stop-after $((CHUNK - SECONDS - 25)))
fi
rc=0
python3 $T/train.py --tokens $W/tokens --out "$TR" --stages "$STAGES" ${RESUME:+--resume "$RESUME"} \
  ${RESUME_RELEASE:+--resume-release "$RESUME_RELEASE"} --tokenizer $W/tokenizer \
  --time-a "$TIME_A" --time-b "$TIME_B" --time-c "$TIME_C" --time-d "$TIME_D" --time-e "$TIME_E" \
  --defs-text $W/corpus/defs.jsonl --batch-tokens "$BATCH_TOKENS" \
  "${STOP[@]}" ${TRAIN_ARGS:-} || rc=$?
if [ "$rc" = 75 ]; then
  PAUSED=1
  stamp "paused (call again to continue)"
  exit 0
fi
[ "$rc" = 0 ] || exit "$rc"
stamp export
python3 $T/export.py --ckpt "$TR/ckpt_${STAGES##*,}.pt" --tokenizer $W/tokenizer --out "$MD"
stamp eval
python3 $T/eval_torch.py --model "$MD" --tokens $W/tokens --out "$EV" --engine-out "$EV" --fixture-out "$EV"
stamp done
