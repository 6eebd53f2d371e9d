"""`autotune validate megatron_args.sh`: beyond the file's flags and Megatron-LM's validate_args rules, what
megatron-core's TransformerConfig refuses of the model and plan the file states (autotune.lint.engine_rule_problems:
the engine's own rules, each citing megatron-core's line), as `autotune estimate --from` reads the file. Each file
here is one autotune wrote, which megatron-core 0.19.2 accepts (tests/emit/test_megatron_core_presets.py), edited the
way a user would break it."""

from __future__ import annotations

import pytest

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.cli import main
from autotune.lint import lint_file
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset


def _args_file(tmp_path, name: str, gpus: int, file: str = "megatron_args.sh", **kw) -> str:
    model, cluster = load_model_preset(name), load_cluster(gpu="h100-sxm-80gb", num_gpus=gpus)
    plan = make_plan(model, cluster, engine="megatron", zero_stage=1, seq_len=4096, global_batch_size=4 * gpus, **kw)
    path = tmp_path / file
    path.write_text(render_bundle(estimate(model, cluster, plan)).files[file])
    return str(path)


def _edit(path: str, old: str, new: str) -> str:
    text = open(path).read()
    assert old in text, text
    open(path, "w").write(text.replace(old, new))
    return path


def test_the_files_autotune_writes_pass(tmp_path):
    path = _args_file(tmp_path, "gpt-oss-20b", 16, tp=2, etp=1, ep=8, sequence_parallel=True)
    assert lint_file(path, world_size=16) == []


def test_biased_experts_split_by_expert_tp_are_refused(tmp_path):
    # megatron-core: "Bias in Moe is only supported when ETP==1" (transformer_config.py:2279-2282); without the flag
    # --expert-tensor-parallel-size defaults to tp (arguments.py:569-570)
    path = _args_file(tmp_path, "gpt-oss-20b", 16, tp=2, etp=1, ep=8, sequence_parallel=True)
    _edit(path, "  --expert-tensor-parallel-size 1\n", "")
    found = lint_file(path, world_size=16)
    assert [(p.source, p.severity) for p in found] == [("megatron-core", "error")], found
    assert "Bias in Moe is only supported when ETP==1" in found[0].message
    assert "--expert-tensor-parallel-size 1" in found[0].message and "--etp 1" in found[0].fix


def test_per_layer_graphs_beside_full_recompute_are_refused(tmp_path, capsys):
    path = _args_file(tmp_path, "llama3-8b", 8, recompute="full")
    _edit(path, "  --recompute-granularity full\n",
          "  --recompute-granularity full\n  --cuda-graph-impl transformer_engine\n")
    assert main(["validate", path, "--world-size", "8"]) == 1
    out = capsys.readouterr().out
    assert "full recompute is only supported with full iteration CUDA graph" in out and "transformer_config.py" in out


@pytest.mark.parametrize("name, gpus, kw", [("mixtral-8x7b", 32, dict(tp=2, ep=8, sequence_parallel=True)),
                                            ("deepseek-v3", 256, dict(pp=8, ep=32, recompute="full"))])
def test_moe_files_autotune_writes_pass(tmp_path, name, gpus, kw):
    assert lint_file(_args_file(tmp_path, name, gpus, **kw), world_size=gpus) == []


def test_bridge_overrides_get_the_same_check(tmp_path):
    """Megatron-Bridge overrides build the same TransformerConfig (Bridge 0.6's validate() runs its __post_init__)."""
    path = _args_file(tmp_path, "gpt-oss-20b", 16, file="bridge_overrides.yaml", tp=2, etp=1, ep=8,
                      sequence_parallel=True)
    assert lint_file(path, world_size=16) == []
    _edit(path, "  expert_tensor_parallel_size: 1\n", "  expert_tensor_parallel_size: 2\n")
    found = lint_file(path, world_size=16)
    assert [(p.source, p.severity) for p in found] == [("megatron-core", "error")], found
    assert "Bias in Moe is only supported when ETP==1" in found[0].message


def test_the_reader_returns_the_plan_unjudged_for_the_linter(tmp_path):
    """engine_rule_problems reads the file's plan without the rules (read_job check=False) and asks the engine's
    own: the same file, read to estimate, is refused with the rule's words."""
    from autotune.errors import InputError
    from autotune.job_files import read_job

    path = _args_file(tmp_path, "gpt-oss-20b", 16, tp=2, etp=1, ep=8, sequence_parallel=True)
    _edit(path, "  --expert-tensor-parallel-size 1\n", "")
    with pytest.raises(InputError, match="Bias in Moe is only supported when ETP==1"):
        read_job([path], gpu="b200", num_gpus=16)
    plan = read_job([path], gpu="b200", num_gpus=16, check=False).plan
    assert (plan.tp, plan.expert_tp) == (2, 2)
