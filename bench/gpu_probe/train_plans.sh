#!/usr/bin/env bash
# Emit bundles for a few plans and run each bundle's own launch_torchrun.sh (the built-in trainer, as emitted), on one
# GPU; keeps each bundle's plan.json (the prediction) and its trainer's RESULT line (the measurement) in $OUT.
#
#   OUT=gpu_out GPU=h200 bash bench/gpu_probe/train_plans.sh "MODEL SEQ GBS ZERO MB RECOMPUTE" ...
set -u
OUT=${OUT:-gpu_out}; GPU=${GPU:-h200}; PY=${PYTHON:-python3}; LIMIT=${LIMIT:-100}
mkdir -p "$OUT"; WORK=$(mktemp -d)
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
i=0
for case in "$@"; do
  set -- $case; i=$((i + 1)); name="plan$i"
  $PY -m autotune emit --model "$1" --gpu "$GPU" --num-gpus 1 --seq-len "$2" --global-batch "$3" --engine fsdp \
      --zero "$4" --micro-batch "$5" --recompute "$6" --out "$WORK/$name" --allow-unfit > "$WORK/$name.emit.log" 2>&1 \
      || { echo "[$name] emit failed: $(tail -2 "$WORK/$name.emit.log")"; continue; }
  echo "[$(date +%T) +${SECONDS}s] $name: $case"
  AUTOTUNE_TRAIN_ARGS="--steps 3 --warmup-steps 1" timeout -k 10 "$LIMIT" bash "$WORK/$name/launch_torchrun.sh" \
      > "$WORK/$name.log" 2>&1
  echo "[$(date +%T) +${SECONDS}s] $name rc=$?: $(grep -E '^(RESULT|UNSUPPORTED)' "$WORK/$name.log" | cut -c1-300)"
  grep -E "OutOfMemory|CUDA out of memory" "$WORK/$name.log" | head -2
  $PY - "$WORK/$name/plan.json" "$WORK/$name.log" "$case" >> "$OUT/train_plans.jsonl" <<'PYEOF'
import json, sys
doc = json.load(open(sys.argv[1]))
log = open(sys.argv[2], errors="replace").read().splitlines()
result = [json.loads(line[7:]) for line in log if line.startswith("RESULT ")]
oom = any("out of memory" in line.lower() for line in log)
print(json.dumps({"case": sys.argv[3], "model": doc["model"]["spec"], "cluster": doc["cluster"]["spec"],
                  "plan": doc["plan"], "engine_version": doc.get("engine_version"),
                  "predicted": {"step_time_s": doc["time"]["step_time_s"], "allocated": doc["memory"]["allocated"],
                                "fits": doc["memory"]["fits"]},
                  "result": result[0] if result else None, "oom": oom, "log_tail": log[-5:]}))
PYEOF
done
