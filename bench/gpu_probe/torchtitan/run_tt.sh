#!/usr/bin/env bash
# Run N offline torchtitan 0.3.0 training steps from an autotune bundle.
#   run_tt.sh BUNDLE_DIR STEPS LOGFILE [extra --section.key value ...]
# The bundle's torchtitan_plan.plan() supplies the model/parallelism/training config; the
# flags below swap the unreachable Hub tokenizer/dataset for local test assets and switch
# off checkpointing, profiling, validation, tensorboard and wandb. Exit code = torchtitan's.
set -uo pipefail
if [ $# -lt 3 ]; then echo "usage: $0 BUNDLE_DIR STEPS LOGFILE [extra flags]" >&2; exit 2; fi
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUNDLE="$(cd "$1" && pwd)" || { echo "no bundle dir: $1" >&2; exit 2; }
STEPS="$2"; LOGFILE="$3"; shift 3
mkdir -p "$(dirname "$LOGFILE")"
LOGFILE="$(cd "$(dirname "$LOGFILE")" && pwd)/$(basename "$LOGFILE")"
TT_HOME="${TT_HOME:-$HERE/../../../out/carry/tt}"   # site/ and assets/ (bench/gpu_probe/torchtitan/prepare_carry.sh)
SITE="${TT_SITE:-$TT_HOME/site}"       # TT_SITE: override only for local (py3.11) testing
ASSETS="$TT_HOME/assets"
DUMP="${TT_DUMP:-$(dirname "$LOGFILE")/tt_outputs_$(basename "$LOGFILE" .log)}"
mkdir -p "$DUMP"

export PYTHONPATH="$HERE:$SITE:$BUNDLE${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled
export HF_DATASETS_CACHE="$DUMP/hf_datasets_cache"
export PYTORCH_ALLOC_CONF="${PYTORCH_ALLOC_CONF:-expandable_segments:True}"
export PYTHONUNBUFFERED=1

cd "$DUMP"
{
  echo "[run_tt] $(date -u +%FT%TZ) bundle=$BUNDLE steps=$STEPS site=$SITE"
  python3 -c 'import sys, torch; print("[run_tt] python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())'
} 2>&1 | tee "$LOGFILE"

FLAGS=(--module torchtitan_plan --config plan
  --hf-assets-path "$ASSETS/tokenizer"
  --dataloader.dataset c4_test --dataloader.dataset-path "$ASSETS/c4_test"
  --checkpoint.no-enable
  --metrics.log-freq 1 --metrics.no-enable-tensorboard --metrics.no-enable-wandb
  --metrics.disable-color-printing
  --profiler.no-enable-profiling
  --validator.no-enable
  --dump-folder "$DUMP"
  --training.steps "$STEPS"
  "$@")
if [ "${TT_CHECK:-0}" = 1 ]; then   # preflight only: parse config, load tokenizer + data
  python3 "$HERE/check_config.py" "${FLAGS[@]}" 2>&1 | tee -a "$LOGFILE"; rc=${PIPESTATUS[0]}
else
  python3 -m torch.distributed.run --standalone --nnodes 1 --nproc_per_node 1 \
    -m autotune_tt_train "${FLAGS[@]}" 2>&1 | tee -a "$LOGFILE"; rc=${PIPESTATUS[0]}
fi
echo "[run_tt] exit code $rc" | tee -a "$LOGFILE"
exit "$rc"
