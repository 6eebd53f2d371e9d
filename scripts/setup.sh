#!/usr/bin/env bash
# The one install step (`make setup` runs it; run it again at any time, it is idempotent).
#
#   torch     kept as it is when it imports; otherwise the CUDA build from PyPI where
#             `nvidia-smi -L` sees a GPU, else the CPU build: torch==2.13.0+cpu from a local
#             wheel / pip find-links when there is one, else from download.pytorch.org/whl/cpu.
#   autotune  `pip install -e ".[test]"` of this checkout. Skipped (in well under a second) when
#             this checkout is already installed editable, pyproject.toml and setup.py have not
#             changed since, and every dependency is importable.
#
# Environment: PYTHON (default: `python` on PATH; everything goes through "$PYTHON" -m pip),
# TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions: DeepSpeed JIT-builds its CPU Adam
# there once, about a minute, and reuses it while the folder stays the same).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd -P)
PYTHON=${PYTHON:-python}
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/torch_extensions}"
mkdir -p "$TORCH_EXTENSIONS_DIR"

pip() { "$PYTHON" -m pip "$@"; }

# 0 when everything is in place: this checkout installed editable and current, deps findable.
# (find_spec, not import: importing torch + deepspeed alone takes ~3 s on every `make test`.)
installed_and_current() {
  "$PYTHON" - "$root" <<'EOF'
import importlib.util, json, os, sys
from importlib import metadata
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

root = Path(sys.argv[1])
sys.path = [p for p in sys.path if p and Path(p).resolve() != root]  # not the checkout itself
for module in ("torch", "deepspeed", "optuna", "jsonschema", "yaml", "pytest", "hypothesis", "build", "autotune"):
    if importlib.util.find_spec(module) is None:
        sys.exit(f"setup: {module} is not installed")
dist = metadata.distribution("autotune")
direct_url = next((f for f in dist.files or () if f.name == "direct_url.json"), None)
if direct_url is None:
    sys.exit("setup: autotune is installed, but not from a local checkout")
info = json.loads(direct_url.read_text())
url = info.get("url", "")
is_here = urlparse(url).scheme == "file" and Path(url2pathname(urlparse(url).path)).resolve() == root
if not (is_here and info.get("dir_info", {}).get("editable")):
    sys.exit(f"setup: the installed autotune is {url}, not an editable install of {root}")
installed_at = os.stat(direct_url.locate()).st_mtime
if any((root / name).exists() and (root / name).stat().st_mtime > installed_at for name in ("pyproject.toml", "setup.py")):
    sys.exit("setup: pyproject.toml or setup.py changed since the last install")
EOF
}

if installed_and_current; then
  echo "setup: up to date ($("$PYTHON" -c 'import sys; print(sys.executable)'), TORCH_EXTENSIONS_DIR=$TORCH_EXTENSIONS_DIR)"
  exit 0
fi

# torch first, chosen for this machine, so resolving autotune's dependencies never picks one.
if "$PYTHON" -c "import torch" >/dev/null 2>&1; then
  echo "setup: keeping the installed torch"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "setup: GPU found, installing torch (CUDA build)"
  pip install torch
else
  echo "setup: no GPU, installing the CPU build of torch"
  if ! pip install "torch==2.13.0+cpu"; then
    echo "setup: no local torch 2.13.0+cpu wheel, using the PyTorch CPU index"
    pip install torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi

# Pin the torch now installed for everything below, so no dependency can swap it for another build.
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
"$PYTHON" -c "import torch; print('torch==' + torch.__version__)" >"$constraints"

# DeepSpeed is an sdist on PyPI: build it against this torch, not in an isolated build env
# (one that could download a multi-GB CUDA torch just to build it).
if ! "$PYTHON" -c "import deepspeed" >/dev/null 2>&1; then
  pip install -c "$constraints" "setuptools>=70.1"
  pip install -c "$constraints" --no-build-isolation "deepspeed>=0.16"
fi

# torchtitan v0.2.2 (the last release with TOML job configs): only its config loader is used, by the tests that
# load emitted torchtitan TOMLs with torchtitan's own ConfigManager. --no-deps: its full requirements
# (torchdata, datasets) could swap the torch build; the loader needs tyro and tomli, its import triton.
if ! "$PYTHON" -c "import torchtitan.config" >/dev/null 2>&1; then
  pip install -c "$constraints" --no-deps "torchtitan==0.2.2" || echo "setup: torchtitan not installed (its tests skip)"
  pip install -c "$constraints" tyro tomli "triton==3.9.0" || echo "setup: torchtitan's loader deps not installed"
fi

# Offline-friendly: with setuptools >= 70.1 here, build autotune with it instead of fetching one.
isolation=()
if "$PYTHON" -c "import sys, setuptools; sys.exit(tuple(map(int, setuptools.__version__.split('.')[:2])) < (70, 1))" 2>/dev/null; then
  isolation=(--no-build-isolation)
fi
pip install -c "$constraints" ${isolation[@]+"${isolation[@]}"} -e ".[test]"

# Prove it: a real import of everything (find_spec above only says it is there).
"$PYTHON" -c "import torch, deepspeed, optuna, jsonschema, yaml, pytest, hypothesis, build, autotune" >/dev/null
echo "setup: done (TORCH_EXTENSIONS_DIR=$TORCH_EXTENSIONS_DIR)"
