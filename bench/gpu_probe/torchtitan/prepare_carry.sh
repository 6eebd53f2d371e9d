#!/usr/bin/env bash
# Build out/carry/ (git-ignored) for bench/gpu_probe/run_on_gpu.sh on an offline GPU machine whose Python is PYVER:
#   wheels/   optuna and jsonschema with their dependencies the machine lacks (autotune's own imports)
#   tt/site/  torchtitan 0.3.0 and what it imports beyond that machine's image (no torchao, no wandb: optional there)
#   tt/assets/ torchtitan's test tokenizer and a c4_test-shaped dataset (make_dataset.py) from a torchtitan git clone
#
#   bash bench/gpu_probe/torchtitan/prepare_carry.sh /path/to/torchtitan.git [PYVER, default 3.12]
set -euo pipefail
GIT_DIR=$1; PYVER=${2:-3.12}; HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CARRY="$HERE/../../../out/carry"; mkdir -p "$CARRY/wheels" "$CARRY/tt/site" "$CARRY/tt/assets/tokenizer" "$CARRY/tt/assets/c4_test"
PLAT=(--python-version "$PYVER" --only-binary=:all: --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux_2_28_x86_64)
pip download -q --dest "$CARRY/wheels" "${PLAT[@]}" optuna==5.1.0 jsonschema==4.26.0
# what the GPU image already has (KINDS.md of the device tool): numpy, pyyaml, packaging, tqdm, typing_extensions,
# attrs, markupsafe
rm -f "$CARRY"/wheels/{numpy,pyyaml,packaging,tqdm,typing_extensions,attrs,markupsafe}-*.whl
pip install -q --no-deps --target "$CARRY/tt/site" "${PLAT[@]}" torchtitan==0.3.0 torchdata==0.11.0 \
    torch_checkpointing==0.1.1 "datasets==4.7.0" multiprocess==0.70.18 dill==0.4.0 tyro==1.0.17 typeguard \
    docstring-parser shtab spmd_types==0.2.3
for f in tokenizer.json tokenizer_config.json; do
  git --git-dir "$GIT_DIR" show "HEAD:tests/assets/tokenizer/$f" > "$CARRY/tt/assets/tokenizer/$f"
done
python3 "$HERE/make_dataset.py" "$GIT_DIR" "$CARRY/tt/assets/c4_test/data.json"
du -sh "$CARRY"
