"""Does `autotune plan`'s opt-in run-settings line promise what NVIDIA measured? (autotune.search.setting_gains)

For NVIDIA's newest MoE rows whose recipe runs the whole bundle the line suggests (a full-iteration CUDA graph, the
HybridEP dispatcher, the EP overlap with delayed weight gradients: the 26.08 rows of bench/data/
nvidia_recipes_blackwell.csv, settings read by bench/nvidia_recipe_settings.py), `autotune plan` is run as a user
would run it on the row's model / GPUs / global batch / sequence / precision (its MTP modules where the recipe
trains them), with the engines' default run settings: the table prints the default search's fastest plan, the plan
and tokens/s per GPU the line names, and NVIDIA's measured tokens/s per GPU of its own tuned recipe. The line is
honest where its plan's prediction is near NVIDIA's measured figure (a claim far above it would be a promise no
tuned recipe kept); the default search's fastest far below the measurement is what the line exists to say.

    python bench/opt_in_settings.py
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy_nvidia_recipes import express, label, load_rows  # noqa: E402

from autotune.cli import main as autotune_main  # noqa: E402

CONTAINER = "26.08"
KEEP = ("--model", "--gpu", "--num-gpus", "--gpus-per-node", "--seq-len", "--global-batch", "--precision",
        "--fp8-recipe", "--grad-dtype", "--mtp-layers", "--expandable-segments")
SWITCHES = ("--expandable-segments",)


def plan_argv(estimate_argv: list[str]) -> list[str]:
    """The row's `autotune plan` request: its workload and precision, no plan and no run settings (the recipe's
    gradient dtype and FP8 recipe kept: they change what trains, and the line never suggests them)."""
    out = ["plan", "--engine", "megatron"]
    words = estimate_argv[1:]
    for i, word in enumerate(words):
        if word in SWITCHES:
            out.append(word)
        elif word in KEEP and i + 1 < len(words):
            out += [word, words[i + 1]]
    return out


def run_plan(argv: list[str]) -> dict:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = autotune_main([*argv, "--json"])
    if code != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {code}: {err.getvalue()[-500:]}")
    return json.loads(out.getvalue())


def main() -> int:
    rows = [r for r in load_rows() if r["container"] == CONTAINER and r["ep"] not in ("", "1", "n/a")]
    print(f"opt-in run settings: NVIDIA's {CONTAINER} MoE rows (full-iteration graph, HybridEP, EP overlap), "
          "tokens/s per GPU")
    print(f"{'row':<80} {'default':>9} {'line':>9} {'NVIDIA':>9} {'line/NV':>8}  line's plan")
    ratios = []
    for row in rows:
        case = express(row)
        if case.reason:
            continue
        doc = run_plan(plan_argv(case.argv))
        gpus = int(row["gpus"])
        default = max(c["time"]["tokens_per_s"] for c in doc["candidates"]) / gpus
        gains = doc["setting_gains"]
        line = gains["tokens_per_s"] / gpus if gains else default
        measured = float(row["tokens_per_s_per_gpu"])
        ratios.append(line / measured - 1)
        shown = gains["summary"] if gains else "(no line)"
        print(f"{label(row):<80} {default:>9,.0f} {line:>9,.0f} {measured:>9,.0f} {line / measured - 1:>+8.1%}  "
              f"{shown}")
    if ratios:
        ratios.sort()
        print(f"the line's plan against NVIDIA's measured recipe: median {ratios[len(ratios) // 2]:+.1%}, "
              f"range {ratios[0]:+.1%} .. {ratios[-1]:+.1%} over {len(ratios)} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
