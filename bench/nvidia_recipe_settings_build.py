"""Build bench/data/nvidia_recipe_settings.csv: the run settings of NVIDIA's Megatron-Bridge performance recipes, per
row of bench/data/nvidia_recipes_blackwell.csv, each with the file and line that sets it.

    python bench/nvidia_recipe_settings_build.py --git-dir PATH/TO/Megatron-Bridge/.git [--commit 067f987df03b]

A development tool: it reads a local clone of NVIDIA-NeMo/Megatron-Bridge (``git show``, nothing is imported or run)
and writes the CSV the bench reads. At the commit the performance summary was transcribed from, the recipes are flat
functions ``src/megatron/bridge/perf_recipes/<family>/<system>/<model>.py::<model>_pretrain_<N>gpu_<system>_<prec>
_config``; each statement ``cfg.<part>.<name> = <literal>`` (and ``cfg.comm_overlap = CommOverlapConfig(...)``) is
a setting. A recipe that starts from another function (``cfg = base()``) or calls a helper (``helper(cfg)``) takes
that function's settings first, in order, as Python would run them; statements under ``if`` are not followed. A row
is matched to the recipe of its model, system, GPU count and precision whose parallel plan (tp/pp/cp/vp/ep/mbs) is the
row's; where the recipe at that commit runs another plan (an older container's), the row is written unmatched.
"""

from __future__ import annotations

import argparse
import ast
import csv
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import accuracy_nvidia_recipes as bench  # noqa: E402

OUT = HERE / "data" / "nvidia_recipe_settings.csv"
ROOTS = ("src/megatron/bridge/perf_recipes", "src/megatron/bridge/recipes")
MODEL_PREFIX = {"LLAMA3_8B": "llama3_8b", "LLAMA3_70B": "llama3_70b", "LLAMA3.1_405B": "llama31_405b",
                "DeepSeekV3": "deepseek_v3", "Qwen3_30B_a3B": "qwen3_30b_a3b", "Qwen3_235B_a22B": "qwen3_235b_a22b",
                "GPT OSS 120B": "gpt_oss_120b", "Kimi_K2": "kimi_k2"}
PLAN = {"tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp", "context_parallel_size": "cp",
        "virtual_pipeline_model_parallel_size": "vp", "expert_model_parallel_size": "ep",
        "micro_batch_size": "mbs"}
KEPT = ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules", "cuda_graph_impl",
        "cuda_graph_scope", "tp_comm_overlap", "overlap_moe_expert_parallel_comm", "delay_wgrad_compute",
        "moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "moe_router_force_load_balancing",
        "moe_shared_expert_overlap", "pipeline_model_parallel_layout", "account_for_embedding_in_pipeline_split",
        "account_for_loss_in_pipeline_split", "cpu_offloading", "cpu_offloading_num_layers",
        "fine_grained_activation_offloading", "offload_modules", "overlap_grad_reduce", "overlap_param_gather",
        "overlap_param_gather_with_optimizer_step", "sequence_parallel", "fp8_param_gather",
        "fp8_dot_product_attention", "use_transformer_engine_op_fuser", "moe_paged_stash")
"""Settings written to the file (the last part of the dotted name); others the recipes set are not run settings the
cost model reads (logging, data, tokenizer, environment)."""


@dataclass(frozen=True)
class Setting:
    value: str
    where: str  # path#Lnn


def git_show(git_dir: str, commit: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def index_functions(git_dir: str, commit: str) -> dict[str, tuple[str, ast.FunctionDef]]:
    """Every top-level function of the recipe trees, by name and by each import alias."""
    names = subprocess.run(["git", "--git-dir", git_dir, "ls-tree", "-r", "--name-only", commit, *ROOTS],
                           check=True, capture_output=True, text=True).stdout.split()
    found: dict[str, tuple[str, ast.FunctionDef]] = {}
    aliases: dict[str, str] = {}
    for path in (n for n in names if n.endswith(".py")):
        tree = ast.parse(git_show(git_dir, commit, path))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                found.setdefault(node.name, (path, node))
            elif isinstance(node, ast.ImportFrom):
                aliases.update({a.asname: a.name for a in node.names if a.asname})
    for alias, name in aliases.items():
        if name in found and alias not in found:
            found[alias] = found[name]
    return found


def literal(node: ast.expr) -> str:
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def settings_of(name: str, funcs: dict, seen: tuple = ()) -> dict[str, Setting]:
    """The settings function ``name`` leaves on ``cfg`` (its callees' first), by dotted name."""
    if name not in funcs or name in seen:
        return {}
    path, fn = funcs[name]
    out: dict[str, Setting] = {}
    for stmt in fn.body:
        at = f"{path}#L{stmt.lineno}"
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
            dotted = ast.unparse(target)
            if dotted == "cfg" and isinstance(value, ast.Call):
                out.update(settings_of(ast.unparse(value.func), funcs, (*seen, name)))
            elif dotted.startswith("cfg.") and isinstance(value, ast.Call) and \
                    ast.unparse(value.func) == "CommOverlapConfig":
                out = {k: v for k, v in out.items() if not k.startswith("comm_overlap.")}
                out.update({f"comm_overlap.{kw.arg}": Setting(literal(kw.value), at) for kw in value.keywords})
            elif dotted.startswith("cfg.") and isinstance(value, ast.Call) and \
                    ast.unparse(value.func) == "_perf_precision":
                out["precision"] = Setting(literal(value.args[0]), at)
            elif dotted.startswith("cfg."):
                out[dotted[4:]] = Setting(literal(value), at)
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and stmt.value.args and \
                ast.unparse(stmt.value.args[0]) == "cfg":
            callee = ast.unparse(stmt.value.func)
            if callee == "_enable_overlap_param_gather_with_optimizer_step":
                out["optimizer.overlap_param_gather_with_optimizer_step"] = Setting("True", at)
            elif callee != "_benchmark_common":  # throughput-run defaults (logging, checkpoints, fusions)
                out.update(settings_of(callee, funcs, (*seen, name)))
    return out


def plan_of(settings: dict[str, Setting]) -> dict[str, int]:
    plan = {short: 1 for short in PLAN.values()}
    for key, s in settings.items():
        short = PLAN.get(key.rsplit(".", 1)[-1])
        if short and s.value not in ("None", ""):
            plan[short] = int(s.value)
    return plan


def precision_tag(text: str) -> tuple[str, ...]:
    t = text.upper()
    if t.startswith("BF16"):
        return ("bf16",)
    if t.startswith("FP8-CS"):
        return ("fp8cs",)
    if t in ("MXFP8", "FP8-MX"):
        return ("fp8mx",)
    if t == "FP8":  # the 26.x tables' Llama "FP8" column: the recipes' FP8 current-scaling functions
        return ("fp8cs",)
    return ()


def row_plan(row: dict) -> dict[str, int]:
    return {k: bench.count(row[k]) for k in ("tp", "pp", "cp", "vp", "ep", "mbs")}


def match(row: dict, funcs: dict) -> tuple[str, dict[str, Setting], str]:
    """(recipe function, its settings, why unmatched)."""
    family, variant = bench.family_of(row["model"])
    prefix = MODEL_PREFIX.get(family)
    system = row["system"].removeprefix("DGX-").lower()
    tags = precision_tag(row["precision"])
    if prefix is None or not tags:
        return "", {}, "no recipe sought (family or precision not estimated)"
    want = row_plan(row)
    names = [f"{prefix}_pretrain_{row['gpus']}gpu_{system}_{tag}{extra}_config" for tag in tags
             for extra in ("", "_large_scale")]
    tried = []
    for name in names:
        if name in funcs:
            got = settings_of(name, funcs)
            if plan_of(got) == want:
                return name, got, ""
            tried.append(f"{name} runs {plan_of(got)}")
    return "", {}, ("; ".join(tried) or f"no function {names[0]}") + f" (row: {want})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--git-dir", required=True)
    parser.add_argument("--commit", default="067f987df03b")
    args = parser.parse_args(argv)
    funcs = index_functions(args.git_dir, args.commit)
    out_rows = []
    for row in bench.load_rows():
        name, got, why = match(row, funcs)
        base = {"source": row["source"], "recipe": name, "unmatched": why}
        for key, s in sorted(got.items()):
            if key.rsplit(".", 1)[-1] in KEPT:
                out_rows.append({**base, "setting": key, "value": s.value,
                                 "where": f"NVIDIA-NeMo/Megatron-Bridge@{args.commit}:{s.where}"})
        if not name:
            out_rows.append({**base, "setting": "", "value": "", "where": ""})
    with OUT.open("w", encoding="utf-8", newline="") as fh:
        fh.write("# NVIDIA's Megatron-Bridge performance recipes' run settings, per row of nvidia_recipes_blackwell.csv "
                 "(its source column);\n# written by bench/nvidia_recipe_settings_build.py from the recipe functions "
                 f"at commit {args.commit}; each setting's where column is the line that sets it.\n")
        writer = csv.DictWriter(fh, fieldnames=["source", "recipe", "setting", "value", "where", "unmatched"])
        writer.writeheader()
        writer.writerows(out_rows)
    matched = len({r["source"] for r in out_rows if r["recipe"]})
    print(f"{OUT}: {len(out_rows)} lines, {matched} rows matched to a recipe")
    return 0


if __name__ == "__main__":
    sys.exit(main())
