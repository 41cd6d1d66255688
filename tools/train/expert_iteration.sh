#!/usr/bin/env bash
# Expert iteration for the small model, on the GPU machine: rounds of
#   1. gen_targets.py: `m3serve serve --device cuda` of the current model completes GEN_COUNT
#      prompts of the train split's definition documents (a new draw each round; GEN_KINDS, by
#      default code and tool-call prompts), once greedily and SAMPLES times sampled; the
#      completions that pass without looping are the round's targets, those that loop or run to
#      max_tokens without one its negatives;
#   2. train.py stage e, offline (--st-gen 0): supervised steps on the targets of the last
#      KEEP_ROUNDS rounds and (UL_WEIGHT > 0) unlikelihood on the repeats of this round's
#      negatives, added to stage c's fine-tune (language model + indexer KL, MSA, fake NVFP4 KV),
#      which holds the perplexity; TIME_E seconds at LR_E;
#   3. export.py: the release directory the next round generates with;
#   4. (EVAL_EACH=1) on cuda: eval_code.py (the 100 held-out prompts, greedy and sampled; again
#      greedy with the chat prompts in adaptive thinking, for their think tags) and
#      eval_tool_calls.py (72 tool requests), about 30 s, recorded per round (round-N/
#      eval_code_cuda.json, eval_code_adaptive_cuda.json, eval_tool_calls_cuda.json); nothing
#      feeds back into training.
# The first round starts from START (default: the committed model) and is numbered FIRST_ROUND
# (default 1): a round's number seeds its prompts, so a later session that continues the committed
# model gives FIRST_ROUND past the rounds that made it (5 after session 18's four) for new prompts.
# Needs the corpus and tokens of run_device.sh in $W (PREP_ONLY=1 run_device.sh), and a built
# m3serve (M3SERVE) whose shared libraries are found (scripts/gpu-check-model.sh prepare packs
# them; scripts/nccl-env.sh).
#
#   ROUNDS=2 GEN_COUNT=2048 TIME_E=150 BUDGET_S=560 OUT=$OUT bash tools/train/expert_iteration.sh
#
# Each call runs ROUNDS more rounds after those already in $W/ei (the same warm machine keeps
# them), then packs the newest model and every round's generation statistics and training log
# into $OUT/results.tgz.part-* as repository paths (cat results.tgz.part-* | tar -xzf - -C <repo>).
# FINAL_EVAL=1 also runs eval_torch.py (perplexity table, CI fixtures) and eval_code.py on cuda
# (the 100 held-out prompts) on that model.
set -euo pipefail
cd "$(dirname "$0")/../.."
T=tools/train
W=${M3SMALL_WORK:-/tmp/m3small}
OUT=${OUT:-/tmp/ei-out}
E=${EI_DIR:-$W/ei}
M3SERVE=${M3SERVE:-build/bin/m3serve}
START=${START:-models/minimax-m3-small}
ROUNDS=${ROUNDS:-1}
FIRST_ROUND=${FIRST_ROUND:-1}
GEN_COUNT=${GEN_COUNT:-1024}
SAMPLES=${SAMPLES:-1}
GEN_KINDS=${GEN_KINDS:-function,class,chat,tool}
KEEP_ROUNDS=${KEEP_ROUNDS:-2}
TIME_E=${TIME_E:-120}
LR_E=${LR_E:-1e-4}
BATCH_TOKENS=${BATCH_TOKENS:-65536}
UL_WEIGHT=${UL_WEIGHT:-0.5}
EVAL_EACH=${EVAL_EACH:-1}
FINAL_EVAL=${FINAL_EVAL:-0}
# Seconds this call may take: no round starts that the last one's duration says would end past it
# (FINAL_EVAL's two evaluations, about 150 s, come out of it too). 0: no bound.
BUDGET_S=${BUDGET_S:-0}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
mkdir -p "$OUT" "$E"
exec > >(tee -a "$OUT/run.log") 2>&1
stamp() { echo "=== $(date +%T) +${SECONDS}s $*"; }
for f in "$W/corpus/defs.jsonl" "$W/tokens/tokens.json" "$W/tokenizer/tokenizer.json" "$M3SERVE"; do
  [ -e "$f" ] || { echo "missing $f: run PREP_ONLY=1 tools/train/run_device.sh first (and build m3serve)"; exit 1; }
done

rounds_done() { ls -d "$E"/round-*/model 2>/dev/null | sed 's/.*round-\([0-9]*\).*/\1/' | sort -n | tail -1 || true; }
ST=$E/stage
pack() {
  local rc=$?
  trap - EXIT TERM INT
  set +e
  stamp "pack (exit $rc)"
  local n cur R=$ST/tools/train/results/expert_iteration
  n=$(rounds_done)
  rm -rf "$ST" && mkdir -p "$R"
  for d in "$E"/round-*; do
    [ -d "$d" ] || continue
    mkdir -p "$R/$(basename "$d")"
    cp -f "$d/gen.json" "$d/eval_code_cuda.json" "$d/eval_code_adaptive_cuda.json" "$d/eval_tool_calls_cuda.json" \
      "$d/train/train_log.jsonl" "$d/train/summary.json" \
      "$R/$(basename "$d")/" 2>/dev/null
  done
  if [ -n "$n" ]; then
    cur=$E/round-$n/model
    mkdir -p "$ST/models" && cp -r "$cur" "$ST/models/minimax-m3-small"
    [ -f "$E/eval/eval_torch.json" ] && cp -f "$E/eval/eval_torch.json" "$R/"
    [ -f "$E/eval/eval_code.json" ] && cp -f "$E/eval/eval_code.json" "$R/eval_code_cuda.json"
    [ -f "$E/eval/engine_windows.json" ] && mkdir -p "$ST/tools/train/eval" && cp -f "$E/eval/engine_windows.json" "$ST/tools/train/eval/"
    [ -f "$E/eval/heldout_sample.json" ] && mkdir -p "$ST/tests/model_small" && cp -f "$E/eval/heldout_sample.json" "$ST/tests/model_small/"
  fi
  tar -C "$ST" -czf - . | split -b 15m -d - "$OUT/results.tgz.part-"
  ls -la "$OUT"
  exit $rc
}
trap pack EXIT TERM INT

last_s=0
reserve=$([ "$FINAL_EVAL" = 1 ] && echo 150 || echo 0)
for ((k = 0; k < ROUNDS; k++)); do
  if [ "$BUDGET_S" -gt 0 ] && [ $((SECONDS + last_s + reserve)) -gt "$BUDGET_S" ]; then
    stamp "no time for another round (the last took ${last_s} s of a ${BUDGET_S} s budget)"
    break
  fi
  t_round=$SECONDS
  n=$(rounds_done)
  cur=${n:+$E/round-$n/model}
  cur=${cur:-$START}
  r=$(( ${n:-$((FIRST_ROUND - 1))} + 1 ))
  R=$E/round-$r
  rm -rf "$R" && mkdir -p "$R"
  stamp "round $r: generate ($GEN_COUNT prompts x $((SAMPLES + 1))) with $cur"
  python3 $T/gen_targets.py --m3serve "$M3SERVE" --model "$cur" --defs "$W/corpus/defs.jsonl" --count "$GEN_COUNT" \
    --samples "$SAMPLES" --kinds "$GEN_KINDS" --seed "$r" --device cuda --out "$R/targets.jsonl" --negatives "$R/negatives.jsonl" \
    --stats "$R/gen.json"
  targets=$(ls "$E"/round-*/targets.jsonl | sort -V | tail -n "$KEEP_ROUNDS" | paste -sd, -)
  ul=()
  [ "$UL_WEIGHT" != 0 ] && ul=(--st-negatives "$R/negatives.jsonl" --ul-weight "$UL_WEIGHT")
  stamp "round $r: train on $targets ${ul[*]}"
  python3 $T/train.py --tokens "$W/tokens" --out "$R/train" --stages e --resume-release "$cur" --tokenizer "$W/tokenizer" \
    --defs-text "$W/corpus/defs.jsonl" --time-e "$TIME_E" --lr-e "$LR_E" --batch-tokens "$BATCH_TOKENS" \
    --st-gen 0 --st-targets "$targets" "${ul[@]}" --no-before --seed $((1234 + r)) ${TRAIN_ARGS:-}
  stamp "round $r: export"
  python3 $T/export.py --ckpt "$R/train/ckpt_e.pt" --tokenizer "$W/tokenizer" --out "$R/model.tmp"
  mv "$R/model.tmp" "$R/model"
  if [ "$EVAL_EACH" = 1 ]; then
    stamp "round $r: eval_code (cuda)"
    python3 $T/eval_code.py --m3serve "$M3SERVE" --model "$R/model" --device cuda --sampled --concurrency 64 \
      --out "$R/eval_code_cuda.json" | tail -4
    python3 $T/eval_tool_calls.py --m3serve "$M3SERVE" --model "$R/model" --device cuda --samples 8 \
      --out "$R/eval_tool_calls_cuda.json" | tail -3
    python3 $T/eval_code.py --m3serve "$M3SERVE" --model "$R/model" --device cuda --thinking adaptive \
      --concurrency 64 --out "$R/eval_code_adaptive_cuda.json" | tail -2
  fi
  last_s=$((SECONDS - t_round))
done

if [ "$FINAL_EVAL" = 1 ]; then
  n=$(rounds_done)
  cur=$E/round-$n/model
  rm -rf "$E/eval" && mkdir -p "$E/eval"
  stamp "eval_code (cuda) of $cur"
  python3 $T/eval_code.py --m3serve "$M3SERVE" --model "$cur" --device cuda --sampled --concurrency 64 \
    --out "$E/eval/eval_code.json"
  stamp "eval_torch of $cur"
  python3 $T/eval_torch.py --model "$cur" --tokens "$W/tokens" --out "$E/eval" --engine-out "$E/eval" --fixture-out "$E/eval"
fi
stamp done
