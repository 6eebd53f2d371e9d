"""Megatron-Bridge overrides (bridge_overrides.yaml / bridge_overrides.args) as files: what they name and hold,
LoRA's pretrained checkpoint, what Bridge cannot express, and reading them back (validate, ``estimate --from``).
test_megatron_bridge_applied.py runs Bridge 0.6.2's own code on the same plans' files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from bridge_cases import CASES, CKPT, PRETRAINED, case_files, case_plan  # tests/emit/ is on sys.path (no __init__)

from autotune.api import make_plan
from autotune.emit.megatron_bridge import BRIDGE_ARGS, BRIDGE_YAML, bridge_files, bridge_recipe
from autotune.emit.options import CheckpointOptions, EmitOptions
from autotune.errors import InputError
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset



def test_lora_plans_set_peft_and_need_a_pretrained_model():
    from autotune.engines import engine_for

    m, cluster, plan = case_plan(*next(c for c in CASES if c[0] == "70b-lora")[1:])
    files = case_files(m, cluster, plan)
    assert yaml.safe_load(files[BRIDGE_YAML])["peft"] == {"_target_": "megatron.bridge.peft.lora.LoRA", "dim": 16,
                                                          "alpha": 32, "dropout": 0.0, "target_modules": ["linear_qkv"]}
    lines = [line for line in files[BRIDGE_ARGS].splitlines() if not line.startswith("#")]
    assert ("peft={_target_: megatron.bridge.peft.lora.LoRA, dim: 16, alpha: 32, dropout: 0.0, "
            "target_modules: [linear_qkv]}") in lines
    with pytest.raises(InputError, match="--pretrained-checkpoint"):
        bridge_files(m, cluster, plan, EmitOptions(), CKPT)
    # both files read back as the plan's LoRA (``estimate --from``)
    import tempfile

    from autotune.job_bridge import bridge_fields

    with tempfile.TemporaryDirectory() as folder:
        for name, text in files.items():
            (Path(folder) / name).write_text(text)
            got = bridge_fields(str(Path(folder) / name), [])
            assert {k: got[k] for k in ("peft", "lora_rank", "lora_alpha", "lora_targets")} == {
                "peft": "lora", "lora_rank": 16, "lora_alpha": 32, "lora_targets": ("linear_qkv",)}, name
    with pytest.raises(InputError, match="alpha is an integer"):
        case_files(m, cluster, plan.with_(lora_alpha=2.5))
    # Megatron-LM has no LoRA: the engine writes Bridge's files alone, run by run_recipe.py
    options = EmitOptions(checkpoint=CheckpointOptions(pretrained_dir=PRETRAINED))
    out = engine_for("megatron").render_files(m, cluster, plan, options, CKPT, {})
    assert "megatron_args.sh" not in out.files and BRIDGE_ARGS in out.files
    assert out.entry == ("scripts/training/run_recipe.py",) and out.program_args[:4] == [
        "--recipe", "llama3_70b_pretrain_32gpu_h100_bf16_config", "--mode", "pretrain"]
    assert f"checkpoint.pretrained_checkpoint={PRETRAINED}" in out.program_args
    # what Bridge cannot take either is refused, naming why Megatron-LM cannot
    llama4 = load_model_preset("llama4-scout")
    c64 = load_cluster(gpu="h100-sxm-80gb", num_gpus=64)
    bad = ParallelPlan(engine="megatron", tp=4, dp=16, sequence_parallel=True, zero_stage=1, global_batch_size=64,
                       seq_len=4096, peft="lora")
    with pytest.raises(InputError, match="Megatron-LM has no LoRA") as err:
        engine_for("megatron").render_files(llama4, c64, bad, options, CKPT, {})
    assert "chunked" in str(err.value)



def test_files_name_the_base_recipe_and_agree():
    m, cluster, plan = case_plan(*CASES[0][1:])
    files = case_files(m, cluster, plan)
    text, args = files[BRIDGE_YAML], files[BRIDGE_ARGS]
    assert "llama3_70b_pretrain_32gpu_h100_bf16_config" in text.split("\n", 2)[1]
    assert "--recipe llama3_70b_pretrain_32gpu_h100_bf16_config" in args and "run_recipe.py" in args
    tree = yaml.safe_load(text)
    assert tree["comm_overlap"]["tp_comm_overlap_cfg"] is None and tree["model"]["tensor_model_parallel_size"] == 8
    lines = [line for line in args.splitlines() if not line.startswith("#")]
    assert "comm_overlap.tp_comm_overlap_cfg=null" in lines and "model.virtual_pipeline_model_parallel_size=2" in lines
    assert "checkpoint.ckpt_format=torch_dist" in lines and "checkpoint.async_save=true" in lines
    mixtral = case_files(*case_plan(*CASES[2][1:]))
    assert "vanilla_gpt_pretrain_1gpu_h100_bf16_config" in mixtral[BRIDGE_YAML].split("\n", 2)[1]
    assert yaml.safe_load(mixtral[BRIDGE_YAML])["model"]["num_moe_experts"] == 8
    # A model named like a preset but shaped otherwise gets the generic recipe and its own shape.
    import dataclasses

    other = dataclasses.replace(m, num_layers=40)
    assert bridge_recipe(other).hf_model is None and bridge_recipe(m).hf_model == "meta-llama/Meta-Llama-3-70B"


def test_plans_bridge_cannot_express_name_the_setting():
    # No Bridge 0.6 recipe for Llama 4 and its chunked attention has no GPTModelProvider override: the emitter
    # refuses, naming it; the Megatron engine writes megatron_args.sh without Bridge files and says why (Maverick:
    # Scout's llama3 RoPE scaling, high_freq_factor 1, is not Megatron-core's, so Megatron-LM refuses Scout too).
    from autotune.engines import engine_for

    m = load_model_preset("llama4-maverick")
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=64)
    plan = make_plan(m, cluster, engine="megatron", tp=4, ep=8, sequence_parallel=True, zero_stage=1,
                     global_batch_size=64, seq_len=4096)
    with pytest.raises(InputError, match="chunked") as err:
        case_files(m, cluster, plan)
    assert "Megatron-Bridge" in str(err.value) and "llama4-maverick" in str(err.value)
    files = engine_for("megatron").render_files(m, cluster, plan, EmitOptions(), CKPT, {})
    assert "megatron_args.sh" in files.files and BRIDGE_YAML not in files.files
    assert any(n.startswith("no Megatron-Bridge files") and "chunked" in n for n in files.user_script_needs)
    # A setting Megatron-LM takes but Bridge's optimizer does not spell is named too.
    m8, c8, p8 = case_plan("llama3-8b", 8, dict(zero_stage=1, global_batch_size=64))
    with pytest.raises(InputError, match="optimizer.optimizer"):
        case_files(m8, c8, p8.with_(optimizer="adafactor"))


def test_validate_reads_both_files(tmp_path):
    from autotune.emit.validate_files import file_kind, sizes_from_file, validate_file

    m, cluster, plan = case_plan(*CASES[0][1:])
    for name, text in case_files(m, cluster, plan).items():
        (tmp_path / name).write_text(text)
        assert file_kind(tmp_path / name) == "megatron-bridge"
        assert validate_file(tmp_path / name, world_size=64) == []
        sizes = sizes_from_file(tmp_path / name, "megatron-bridge")
        assert (sizes.tp, sizes.pp, sizes.cp) == (8, 4, 1)
        assert validate_file(tmp_path / name, world_size=48)  # tp x pp = 32 does not divide 48
    bad = tmp_path / "bridge_overrides_bad.args"
    bad.write_text("train.global_batch_size=3\ntrain.micro_batch_size=1\nmodle.tensor_model_parallel_size=2\n")
    found = {p.path for p in validate_file(bad, world_size=8)}
    assert found == {"$.modle", "$.train.global_batch_size"}
