#!/usr/bin/env bash
# One GPU machine, one pass, under 10 minutes: kernel facts, torchtitan 0.3.0 training of the config modules
# autotune emits, and `autotune tune` on the built-in trainer. What it keeps lands in $OUT (default ./gpu_out):
# env.txt, kernels.json, tt_a.log, tt_b.log, tt_c.log, extras.tgz (the plans' plan.json, the tune folder and log).
#
#   bash bench/gpu_probe/run_on_gpu.sh            # from the repository root, on a machine with one NVIDIA GPU
#
# Offline machines carry what they lack in out/carry/ (git-ignored; bench/gpu_probe/torchtitan/prepare_carry.sh builds
# it): wheels/ (optuna, jsonschema and theirs, for the machine's Python), tt/site (torchtitan 0.3.0 and its
# dependencies) and tt/assets (a tokenizer and dataset); bench/gpu_probe/torchtitan/run_tt.sh trains a bundle's
# torchtitan_plan.py with them offline (autotune_tt_compat.py back-fills the torch 2.13 APIs torchtitan 0.3.0 calls
# on an older torch). Each part is skipped, saying so, where its files are absent.
# On the H200 of 2026-12-04 (torch 2.11.0+cu130) torchtitan 0.3.0 built the model and its optimizer (30.18 GiB of
# fp32 weights for llama3-8b, as the ledger says) and failed in the first backward ("The tensor has a non-zero
# number of elements, but its data is not allocated yet"), with and without its CUDA graph: 0.3.0 needs a newer torch
# than that machine has (it targets 2.13); those runs await a machine with it.
# The numbers it wrote on one H200 are bench/data/h200_*; bench/kernels_vs_measured.py and
# bench/torchtitan_vs_estimate.py compare them with the model.
set -u
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
REPO=$(pwd)
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
CARRY=out/carry
log() { echo "[$(date +%T) +${SECONDS}s] $*"; }

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  $PY -c "import torch, platform; print('torch', torch.__version__, 'python', platform.python_version())"
  lscpu | grep -E "Model name|^CPU\(s\)" || true
} > "$OUT/env.txt" 2>&1

if ls $CARRY/wheels/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --target "$WORK/site" $CARRY/wheels/*.whl || log "wheel install failed"
fi
export PYTHONPATH="$WORK/site:$REPO${PYTHONPATH:+:$PYTHONPATH}"

log "kernels"
timeout -k 10 150 $PY bench/gpu_probe/kernels.py --out "$OUT/kernels.json" ${KERNEL_ARGS:-} 2>&1 | tail -3
log "kernels rc=${PIPESTATUS[0]}"

# torchtitan: llama3-8b on the one GPU, as `autotune emit` writes it (a: seq 4096 full AC, b: seq 2048 selective AC
# (op-level SAC), c: a without the CUDA graph torchtitan 0.3 captures by default)
tt_case() {  # name seq recompute timeout [extra torchtitan flags]
  local name=$1 seq=$2 rc_=$3 limit=$4; shift 4
  local bundle="$WORK/bundle_$name"
  $PY -m autotune emit --model llama3-8b --gpu h200 --num-gpus 1 --seq-len "$seq" --global-batch 8 --engine fsdp \
      --zero 0 --micro-batch 1 --recompute "$rc_" --torchtitan-version 0.3 --out "$bundle" > "$OUT/tt_$name.log" 2>&1
  cp "$bundle/plan.json" "$WORK/plan_$name.json"
  log "torchtitan $name: seq $seq, recompute $rc_ $*"
  TT_HOME="$REPO/$CARRY/tt" TT_DUMP="$WORK/tt_dump_$name" timeout -k 10 "$limit" bash bench/gpu_probe/torchtitan/run_tt.sh "$bundle" 7 "$WORK/tt_$name.run.log" "$@" \
      > /dev/null 2>&1
  log "torchtitan $name rc=$?"
  cat "$WORK/tt_$name.run.log" >> "$OUT/tt_$name.log" 2>/dev/null
  grep -E "step: +[0-9]|memory|Error|error" "$WORK/tt_$name.run.log" 2>/dev/null | tail -4
}
TT=0; [ -d $CARRY/tt/site ] && TT=1
[ $TT = 1 ] && tt_case a 4096 full 170 || log "torchtitan skipped: $CARRY/tt/site absent"

if $PY -c "import optuna, jsonschema" 2>/dev/null; then
  log "tune"
  timeout -k 10 170 $PY -m autotune tune --model phi3-mini --gpu h200 --num-gpus 1 --seq-len 4096 --global-batch 8 \
      --engine fsdp --trials 3 --top-k 3 --steps 3 --warmup-steps 1 --finalists 0 --trial-timeout 120 \
      --out "$WORK/tune" > "$WORK/tune.log" 2>&1
  log "tune rc=$?"
  tail -12 "$WORK/tune.log"
else
  log "tune: optuna or jsonschema missing, skipped"
fi

[ $TT = 1 ] && [ $SECONDS -lt 400 ] && tt_case b 2048 selective 110
[ $TT = 1 ] && [ $SECONDS -lt 470 ] && tt_case c 4096 full 100 --training.disable-cuda-graphs
tar czf "$OUT/extras.tgz" -C "$WORK" --exclude='tune/trials/*/checkpoints' $(cd "$WORK" && ls -d plan_*.json tune tune.log 2>/dev/null)
log done
