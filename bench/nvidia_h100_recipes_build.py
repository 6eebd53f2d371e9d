"""Build bench/data/nvidia_h100_recipes.csv: the plan and run settings of NVIDIA's Megatron-Bridge performance recipes
for 80 GB H100s, each with the file and line that sets it.

    python bench/nvidia_h100_recipes_build.py --git-dir PATH/TO/Megatron-Bridge/.git [--commit 067f987df03b]

A development tool, as bench/nvidia_recipe_settings_build.py (whose reader it uses: ``git show``, nothing imported
or run): every flat recipe function ``src/megatron/bridge/perf_recipes/<family>/h100/<model>.py::<model>_pretrain_
<N>gpu_h100_<prec>[_<variant>]_config`` of the model families bench/accuracy_nvidia_recipes.py estimates, with the
settings it leaves on ``cfg`` (the base recipe's first, then its own, in the order Python runs them). The base
recipes (``gpt_oss_120b_pretrain_config`` ...) are aliases of functions under ``src/megatron/bridge/recipes`` whose
names are the perf recipes' own (``gpt_oss_120b_pretrain_64gpu_h100_bf16_config`` is both), so the perf recipes are
indexed apart from them. Only the throughput numbers NVIDIA measured with these recipes stay out of the repository
(they are kept aside); the recipes are configuration code.
"""

from __future__ import annotations

import argparse
import csv
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import nvidia_recipe_settings_build as reader  # noqa: E402

OUT = HERE / "data" / "nvidia_h100_recipes.csv"
PERF_ROOT = "src/megatron/bridge/perf_recipes"
BASE_ROOTS = ("src/megatron/bridge/recipes",)
NAME = re.compile(r"^(?P<model>[a-z0-9_]+?)_pretrain_(?P<gpus>\d+)gpu_h100_(?P<prec>[a-z0-9]+)(?P<variant>_\w+)?_config$")
KEPT = (*reader.KEPT, *reader.PLAN, "global_batch_size", "seq_length", "precision", "fp8_recipe", "env_vars",
        "grad_reduce_in_fp32", "mtp_num_layers")
"""Settings written: the run settings bench/nvidia_recipe_settings.py reads, the plan, the batch and sequence, the
precision (``_perf_precision``'s argument, and an FP8 recipe it is given), the gradient reduction's dtype and the loss
kernel, multi-token prediction, and the launcher environment."""


def h100_recipes(git_dir: str, commit: str) -> list[tuple[str, dict[str, reader.Setting]]]:
    """(recipe, its settings) of every H100 pre-training recipe of the estimated families, by name. The base recipes
    (``gpt_oss_120b_pretrain_config`` ...) are aliases of functions under ``src/megatron/bridge/recipes`` whose names
    are the perf recipes' own (``gpt_oss_120b_pretrain_64gpu_h100_bf16_config`` is both): each call is resolved from
    the file that makes it (``reader.RecipeIndex``)."""
    saved = reader.ROOTS
    reader.ROOTS = (PERF_ROOT, *BASE_ROOTS)
    try:
        funcs = reader.index_functions(git_dir, commit)
    finally:
        reader.ROOTS = saved
    prefixes = tuple(reader.MODEL_PREFIX.values())
    out = []
    for path, defs in sorted(funcs.defs.items()):
        for name in sorted(defs):
            m = NAME.match(name)
            if m and path.startswith(PERF_ROOT) and "/h100/" in path and m["model"] in prefixes:
                out.append((name, reader.settings_of(name, funcs, caller=path)))
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--git-dir", required=True)
    parser.add_argument("--commit", default="067f987df03b")
    args = parser.parse_args(argv)
    commit = subprocess.run(["git", "--git-dir", args.git_dir, "rev-parse", f"{args.commit}^{{commit}}"], check=True,
                            capture_output=True, text=True).stdout.strip()[:12]
    rows = []
    for name, got in h100_recipes(args.git_dir, commit):
        for key, s in sorted(got.items()):
            if key.rsplit(".", 1)[-1] in KEPT or key in KEPT:
                rows.append({"recipe": name, "setting": key, "value": s.value,
                             "where": f"NVIDIA-NeMo/Megatron-Bridge@{commit}:{s.where}"})
    with OUT.open("w", encoding="utf-8", newline="") as fh:
        fh.write("# NVIDIA's Megatron-Bridge H100 performance recipes: plan and run settings per recipe function;\n"
                 "# written by bench/nvidia_h100_recipes_build.py; each setting's where column is the line that sets "
                 "it.\n")
        writer = csv.DictWriter(fh, fieldnames=["recipe", "setting", "value", "where"])
        writer.writeheader()
        writer.writerows(rows)
    print(f"{OUT}: {len(rows)} lines, {len({r['recipe'] for r in rows})} recipes, read at {commit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
