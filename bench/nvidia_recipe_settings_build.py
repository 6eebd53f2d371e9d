"""Build bench/data/nvidia_recipe_settings.csv: the run settings of NVIDIA's Megatron-Bridge performance recipes, per
row of bench/data/nvidia_recipes_blackwell.csv, each with the file and line that sets it.

    python bench/nvidia_recipe_settings_build.py --git-dir PATH/TO/Megatron-Bridge/.git [--commit 067f987df03b]

A development tool: it reads a local clone of NVIDIA-NeMo/Megatron-Bridge (``git show``, nothing is imported or run)
and writes the CSV the bench reads. Each row is read at the release that first documents its container
(``container_commits``: the earliest release tag whose docs/performance-summary*.md has a "## <container> NeMo
Container" section; 26.06.01 and 26.08 at v0.6.0), or at the summary's own commit where no tag documents it.

From v0.6.0 the recipes are flat functions ``src/megatron/bridge/perf_recipes/<family>/<system>/<model>.py::<model>
_pretrain_<N>gpu_<system>_<prec>_config``; each statement ``cfg.<part>.<name> = <literal>`` (and ``cfg.comm_overlap =
CommOverlapConfig(...)``) is a setting. A function that starts from another (``cfg = base()``) or calls a helper
(``helper(cfg)``) takes that function's settings first, in order, as Python runs them; statements under ``if`` and
values that are not literals are not followed. Before v0.6.0 (releases v0.2-v0.5) a run was the per-GPU function
``scripts/performance/configs/<family>/<model>_llm_pretrain.py::<model>_pretrain_config_<system>`` (read the same
way, with its base recipe) and a ``WorkloadBaseConfig`` variant ``<MODEL>_PRETRAIN_CONFIG_<SYSTEM>_<PREC>_V<n>`` of
``*_workload_base_configs.py`` that ``utils/overrides.py::set_workload_base_configs`` applies on top (its fields as
that function maps them: ``WORKLOAD_FIELDS``). A row is matched to the function or variant of its model, system, GPU
count and precision whose parallel plan (tp/pp/cp/vp/ep/mbs) is the row's; of variants that run the same plan, the
one whose ``global_batch_size`` is the row's (e.g. v0.5.0 ``GPT_OSS_120B_PRETRAIN_CONFIG_GB200_FP8_MX_V1``, GBS 512,
and ``..._V2``, GBS 1280 with full-iteration CUDA graphs and HybridEP: the same ep64 mbs4 plan); where none runs it,
the row is written unmatched with the reason.
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
ROOTS = ("src/megatron/bridge/perf_recipes", "src/megatron/bridge/recipes", "scripts/performance/configs")
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
        "fp8_dot_product_attention", "fp8_output_proj", "use_transformer_engine_op_fuser", "moe_paged_stash",
        "cross_entropy_fusion_impl")
"""Settings written to the file (the last part of the dotted name); others the recipes set are not run settings the
cost model reads (logging, data, tokenizer, environment)."""


@dataclass(frozen=True)
class Setting:
    value: str
    where: str  # path#Lnn


def git_show(git_dir: str, commit: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout


class RecipeIndex(dict):
    """Every top-level function of the recipe trees, by name and by each import alias (name -> (path, function): the
    first file in ROOTS order that defines or aliases it), and ``resolve``, which looks a name up as one file sees it:
    its own functions, then what it imports, followed through re-exports. Names collide across the trees (v0.6.0's
    ``perf_recipes/qwen/h100/qwen3_moe.py`` and ``recipes/qwen/h100/qwen3_moe.py`` both define
    ``qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config``: a perf recipe and the base recipe every Qwen3-235B perf recipe
    starts from), so a call is resolved from the file that makes it."""

    def __init__(self) -> None:
        super().__init__()
        self.defs: dict[str, dict[str, ast.FunctionDef]] = {}
        self.imports: dict[str, dict[str, tuple[str, str]]] = {}  # file -> local name -> (module file, its name)

    def resolve(self, path: str, name: str, depth: int = 0) -> tuple[str, ast.FunctionDef] | None:
        if depth > 8:
            return None
        if name in self.defs.get(path, {}):
            return path, self.defs[path][name]
        target = self.imports.get(path, {}).get(name)
        return self.resolve(*target, depth + 1) if target else None


def module_file(importer: str, node: ast.ImportFrom, files: set[str]) -> str | None:
    """The indexed file an ``from X import ...`` in ``importer`` reads (absolute ``megatron.bridge...`` under src/, or
    relative), or None where it is outside the trees."""
    if node.level:
        base = Path(importer).parent
        for _ in range(node.level - 1):
            base = base.parent
        stem = base / (node.module or "").replace(".", "/") if node.module else base
        stems = [str(stem)]
    else:
        stems = [f"src/{(node.module or '').replace('.', '/')}", (node.module or "").replace(".", "/")]
    for stem in stems:
        for candidate in (f"{stem}.py", f"{stem}/__init__.py"):
            if candidate in files:
                return candidate
    return None


def index_functions(git_dir: str, commit: str) -> RecipeIndex:
    """Every top-level function of the recipe trees at ``commit``, by name and by each import alias, resolvable per
    file."""
    names = subprocess.run(["git", "--git-dir", git_dir, "ls-tree", "-r", "--name-only", commit, *ROOTS],
                           check=True, capture_output=True, text=True).stdout.split()
    return index_sources({n: git_show(git_dir, commit, n) for n in names
                          if n.endswith(".py") and "workload_base_configs" not in n})


def index_sources(sources: dict[str, str]) -> RecipeIndex:
    """``index_functions`` over file path -> Python source (in ROOTS order: the first file defining a name keeps it)."""
    files = set(sources)
    index = RecipeIndex()
    aliases: dict[str, str] = {}
    for path, text in sources.items():
        index.defs[path], index.imports[path] = {}, {}
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef):
                index.defs[path][node.name] = node
                index.setdefault(node.name, (path, node))
            elif isinstance(node, ast.ImportFrom):
                aliases.update({a.asname: a.name for a in node.names if a.asname})
                source = module_file(path, node, files)
                if source is not None:
                    index.imports[path].update({a.asname or a.name: (source, a.name) for a in node.names})
    for alias, name in aliases.items():
        if name in index and alias not in index:
            index[alias] = index[name]
    return index


def literal(node: ast.expr) -> str:
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def settings_of(name: str, funcs: dict, seen: tuple = (), caller: str | None = None) -> dict[str, Setting]:
    """The settings function ``name`` leaves on ``cfg`` (its callees' first), by dotted name. ``caller``: the file
    whose code calls ``name``, where the name is looked up as that file imports it (``RecipeIndex.resolve``); else, or
    where that finds nothing, by name."""
    hit = funcs.resolve(caller, name) if caller and isinstance(funcs, RecipeIndex) else None
    hit = hit or funcs.get(name)
    if hit is None or (hit[0], hit[1].name) in seen:
        return {}
    path, fn = hit
    seen = (*seen, (path, fn.name))
    out: dict[str, Setting] = {}
    for stmt in fn.body:
        at = f"{path}#L{stmt.lineno}"
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
            dotted = ast.unparse(target)
            if dotted == "cfg" and isinstance(value, ast.Call) and ast.unparse(value.func) == "_with_global_batch_size" \
                    and len(value.args) == 2 and isinstance(value.args[0], ast.Call):
                # cfg = _with_global_batch_size(other_config(), N): the other recipe's settings at N sequences a step
                out.update(settings_of(ast.unparse(value.args[0].func), funcs, seen, path))
                out["train.global_batch_size"] = Setting(literal(value.args[1]), at)
            elif dotted == "cfg" and isinstance(value, ast.Call):
                out.update(settings_of(ast.unparse(value.func), funcs, seen, path))
            elif dotted.startswith("cfg.") and isinstance(value, ast.Call) and \
                    ast.unparse(value.func) == "CommOverlapConfig":
                out = {k: v for k, v in out.items() if not k.startswith("comm_overlap.")}
                out.update({f"comm_overlap.{kw.arg}": Setting(literal(kw.value), at) for kw in value.keywords})
            elif dotted.startswith("cfg.") and isinstance(value, ast.Call) and \
                    ast.unparse(value.func) == "_perf_precision":
                out["precision"] = Setting(literal(value.args[0]), at)
            elif dotted.startswith("cfg.") and not any(isinstance(n, ast.Name) and n.id == "cfg"
                                                       for n in ast.walk(value)):
                out[dotted[4:]] = Setting(literal(value), at)  # (a value read from cfg keeps the earlier one)
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and stmt.value.args and \
                ast.unparse(stmt.value.args[0]) == "cfg":
            callee = ast.unparse(stmt.value.func)
            if callee == "_enable_overlap_param_gather_with_optimizer_step":
                out["optimizer.overlap_param_gather_with_optimizer_step"] = Setting("True", at)
            elif callee == "_benchmark_common":
                # throughput-run defaults (logging, checkpoints, fusions); of them, what the cost model reads: 16-bit
                # gradient reduction and the loss kernel (perf_recipes/_common.py:31-73 at 067f987)
                impl = next((literal(kw.value) for kw in stmt.value.keywords if kw.arg == "cross_entropy_impl"), "te")
                out["ddp.grad_reduce_in_fp32"] = Setting("False", at)
                out["mixed_precision.grad_reduce_in_fp32"] = Setting("False", at)
                out["model.cross_entropy_fusion_impl"] = Setting(impl, at)
            else:
                out.update(settings_of(callee, funcs, seen, path))
    return out


def plan_of(settings: dict[str, Setting]) -> dict[str, int]:
    plan = {short: 1 for short in PLAN.values()}
    for key, s in settings.items():
        short = PLAN.get(key.rsplit(".", 1)[-1])
        if short and s.value not in ("None", ""):
            plan[short] = int(s.value)
    return plan


def row_plan(row: dict) -> dict[str, int]:
    return {k: bench.count(row[k]) for k in ("tp", "pp", "cp", "vp", "ep", "mbs")}


def match(row: dict, funcs: dict) -> tuple[str, dict[str, Setting], str]:
    """(recipe function, its settings, why unmatched)."""
    family, variant = bench.family_of(row["model"])
    prefix = MODEL_PREFIX.get(family)
    system = row["system"].removeprefix("DGX-").lower()
    tags = bench.precision_tag(row["precision"])
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


WORKLOAD_FIELDS = {
    "cuda_graph_impl": (("model.cuda_graph_impl", None),),
    "cuda_graph_scope": (("model.cuda_graph_scope", None),),
    "recompute_modules": (("model.recompute_granularity", "selective"), ("model.recompute_modules", None)),
    "recompute_num_layers": (("model.recompute_granularity", "full"), ("model.recompute_num_layers", None)),
    "cpu_offloading_num_layers": (("model.cpu_offloading", "True"), ("model.cpu_offloading_num_layers", None)),
    "moe_a2a_overlap": (("comm_overlap.overlap_moe_expert_parallel_comm", None),
                        ("comm_overlap.delay_wgrad_compute", None)),
    "moe_flex_dispatcher_backend": (("model.moe_token_dispatcher_type", "flex"),
                                    ("model.moe_flex_dispatcher_backend", None)),
    "pp_layout": (("model.pipeline_model_parallel_layout", None),),
}
"""WorkloadBaseConfig field -> the settings ``set_workload_base_configs`` (scripts/performance/utils/overrides.py,
``_set_cuda_graph_overrides`` / ``_set_recompute_overrides`` / ``_set_moe_a2a_overlap_overrides``, v0.4.2 lines
105-162) makes of it when the field is set (value None: the field's own value). moe_a2a_overlap=False sets nothing."""

def container_commits(git_dir: str, tags: list[str]) -> dict[str, str]:
    """Container -> the earliest release tag whose performance summary (or its archive) has its section."""
    out: dict[str, str] = {}
    for tag in tags:
        text = ""
        for doc in ("docs/performance-summary.md", "docs/performance-summary-archive.md"):
            try:
                text += git_show(git_dir, tag, doc)
            except subprocess.CalledProcessError:
                pass
        for line in text.splitlines():
            if line.startswith("## ") and line.endswith(" NeMo Container"):
                out.setdefault(line.split()[1], tag)
    return out


def workload_variants(git_dir: str, commit: str) -> dict[str, dict[str, Setting]]:
    """Every WorkloadBaseConfig of the release's *_workload_base_configs.py files: name -> its set fields."""
    names = subprocess.run(["git", "--git-dir", git_dir, "ls-tree", "-r", "--name-only", commit,
                            "scripts/performance/configs"], check=True, capture_output=True, text=True).stdout.split()
    out: dict[str, dict[str, Setting]] = {}
    for path in (n for n in names if n.endswith("workload_base_configs.py")):
        for node in ast.parse(git_show(git_dir, commit, path)).body:
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
                continue
            value, fields = node.value, {}
            if isinstance(value, ast.Name):
                fields = dict(out.get(value.id, {}))
            elif isinstance(value, ast.Call) and ast.unparse(value.func) in ("replace", "WorkloadBaseConfig"):
                if ast.unparse(value.func) == "replace" and value.args:
                    fields = dict(out.get(ast.unparse(value.args[0]), {}))
                for kw in value.keywords:
                    fields[kw.arg] = Setting(literal(kw.value), f"{path}#L{kw.value.lineno}")
            else:
                continue
            out[node.targets[0].id] = fields
    return out


def legacy_match(row: dict, funcs: dict, variants: dict) -> tuple[str, dict[str, Setting], str]:
    """(variant name, settings, why unmatched) of a row read at a release before the flat recipes."""
    family, _ = bench.family_of(row["model"])
    prefix, system = MODEL_PREFIX.get(family), row["system"].removeprefix("DGX-").lower()
    if prefix is None or not bench.precision_tag(row["precision"]):
        return "", {}, "no recipe sought (family or precision not estimated)"
    tags = {"fp8cs": ("FP8_CS", "FP8_SC"), "fp8mx": ("FP8_MX",), "bf16": ("BF16",), "nvfp4": ("NVFP4",)}
    want = row_plan(row)
    tried, found = [], []
    for tag in bench.precision_tag(row["precision"]):
        for name, fields in sorted(variants.items()):
            # v0.3+: <MODEL>_PRETRAIN_CONFIG_<SYSTEM>_<PREC>_<VARIANT>; v0.2: <MODEL>_<SYSTEM>_<PREC>_BASE_CONFIG
            rest = name.removeprefix(f"{prefix.upper()}_").removeprefix("PRETRAIN_CONFIG_")
            if not name.startswith(f"{prefix.upper()}_") or not rest.startswith(f"{system.upper()}_") or \
                    not any(rest[len(system) + 1:].startswith(t + "_") or rest[len(system) + 1:] == t
                            for t in tags[tag]):
                continue
            plan = {short: 1 for short in PLAN.values()}
            plan.update({short: int(fields[k].value) for k, short in PLAN.items()
                         if k in fields and fields[k].value not in ("None", "")})
            gpus = int(fields["num_gpus"].value) if "num_gpus" in fields else 0
            gbs = fields["global_batch_size"].value if "global_batch_size" in fields else ""
            if plan == want:  # the variant written for the row's GPUs first, then for its global batch
                found.append((gpus != int(row["gpus"]), gbs != row["gbs"], name, fields))
            else:
                tried.append(f"{name} runs {plan}")
    if not found:
        return "", {}, "; ".join(tried[:3]) or f"no {prefix.upper()} {system.upper()} workload variant"
    _, _, name, fields = min(found, key=lambda f: (f[0], f[1], f[2]))
    got = {k: v for k, v in settings_of(f"{prefix}_pretrain_config_{system}", funcs).items() if is_literal(v.value)}
    for field_name, targets in WORKLOAD_FIELDS.items():
        s = fields.get(field_name)
        if s is None or s.value == "None" or (field_name == "moe_a2a_overlap" and s.value == "False"):
            continue
        for key, fixed in targets:
            got[key] = Setting(fixed or s.value, s.where)
    return name, got, ""


def is_literal(text: str) -> bool:
    """A value ``literal`` wrote from a Python literal (not an expression's source text)."""
    return all(part.replace("_", "").replace(".", "").isalnum() for part in text.split()) and "(" not in text


def release_tags(git_dir: str) -> list[str]:
    """The release tags vX.Y.Z (no release candidates), oldest first."""
    out = subprocess.run(["git", "--git-dir", git_dir, "tag", "--list", "v*", "--sort=creatordate"], check=True,
                         capture_output=True, text=True).stdout.split()
    return [t for t in out if "rc" not in t and "a" not in t.removeprefix("v")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--git-dir", required=True)
    parser.add_argument("--commit", default="067f987df03b", help="where no release documents a row's container")
    args = parser.parse_args(argv)
    documented = container_commits(args.git_dir, release_tags(args.git_dir))
    read: dict[str, tuple[str, dict, dict]] = {}  # tag -> (commit, functions, workload variants)
    out_rows = []
    for row in bench.load_rows():
        tag = documented.get(row["container"], args.commit)
        if tag not in read:
            commit = subprocess.run(["git", "--git-dir", args.git_dir, "rev-parse", f"{tag}^{{commit}}"], check=True,
                                    capture_output=True, text=True).stdout.strip()[:12]
            read[tag] = (commit, index_functions(args.git_dir, tag), workload_variants(args.git_dir, tag))
        commit, funcs, variants = read[tag]
        flat = any(path.startswith(ROOTS[0]) for path, _ in funcs.values())
        name, got, why = match(row, funcs) if flat or not variants else legacy_match(row, funcs, variants)
        if not flat and not variants and not name:
            why = f"{tag} has neither flat recipes nor workload configs"
        base = {"source": row["source"], "read_at": tag, "recipe": name, "unmatched": why}
        kept = [(key, s) for key, s in sorted(got.items()) if key.rsplit(".", 1)[-1] in KEPT]
        for key, s in kept:
            out_rows.append({**base, "setting": key, "value": s.value,
                             "where": f"NVIDIA-NeMo/Megatron-Bridge@{commit}:{s.where}"})
        if not kept:  # every row has a line: its recipe setting nothing kept, or why there is none
            out_rows.append({**base, "setting": "", "value": "", "where": ""})
    with OUT.open("w", encoding="utf-8", newline="") as fh:
        fh.write("# NVIDIA's Megatron-Bridge performance recipes' run settings, per row of nvidia_recipes_blackwell.csv "
                 "(its source column), read at the release that first documents the row's container (read_at);\n"
                 "# written by bench/nvidia_recipe_settings_build.py; each setting's where column is the line that "
                 "sets it.\n")
        writer = csv.DictWriter(fh, fieldnames=["source", "read_at", "recipe", "setting", "value", "where",
                                                "unmatched"])
        writer.writeheader()
        writer.writerows(out_rows)
    matched = len({r["source"] for r in out_rows if r["recipe"]})
    print(f"{OUT}: {len(out_rows)} lines, {matched} rows matched to a recipe; containers read at {documented}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
