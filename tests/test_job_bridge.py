"""`estimate --from bridge_overrides.yaml` (and the Hydra-style .args): the plan a Megatron-Bridge override file states
(autotune/job_bridge.py). The files autotune emits read back to the plan they were written for, with the same
estimate; a file that does not determine the job says which flag supplies what is missing."""

from __future__ import annotations

import json

import pytest

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.cli import main
from autotune.errors import InputError
from autotune.job_files import read_job
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset

GPU = "h100-sxm-80gb"
# (model, GPUs, plan): a library recipe with a MixedPrecisionConfig (70B), one with a registered precision name (8B),
# the run settings at non-default values, full recompute by blocks, a MoE model on the generic recipe.
CASES = {
    "70b-vpp": ("llama3-70b", 64, dict(tp=8, pp=4, vpp=2, sequence_parallel=True, zero_stage=1, global_batch_size=128)),
    "70b-fp8-current-userbuffers-bf16-grads": ("llama3-70b", 64, dict(
        tp=8, pp=2, sequence_parallel=True, zero_stage=1, global_batch_size=64, precision="fp8",
        fp8_recipe="te-current", tp_overlap="userbuffers", grad_dtype="bf16")),
    "8b-fp8-named": ("llama3-8b", 16, dict(tp=2, sequence_parallel=True, zero_stage=1, global_batch_size=64,
                                           precision="fp8")),
    "8b-full-block": ("llama3-8b", 8, dict(zero_stage=1, global_batch_size=64, recompute="full",
                                           recompute_num_layers=4)),
    "mixtral-ep-generic": ("mixtral-8x7b", 32, dict(tp=2, ep=8, sequence_parallel=True, zero_stage=1,
                                                    global_batch_size=128, recompute="selective")),
    # Megatron-FSDP (ddp.use_megatron_fsdp, data_parallel_sharding_strategy)
    "70b-mfsdp": ("llama3-70b", 64, dict(zero_stage=3, global_batch_size=128, recompute="full",
                                         recompute_num_layers=80)),
    "8b-mfsdp-optim-grads": ("llama3-8b", 8, dict(tp=2, sequence_parallel=True, zero_stage=2, global_batch_size=64)),
    # FP8 attention (mixed_precision.fp8_dot_product_attention)
    "70b-fp8-attention": ("llama3-70b", 64, dict(tp=8, pp=2, sequence_parallel=True, zero_stage=1, global_batch_size=64,
                                                 precision="fp8", fp8_recipe="te-current", fp8_attention=True)),
    # activation CPU offload (model.cpu_offloading, cpu_offloading_num_layers)
    "8b-mfsdp-activation-offload": ("llama3-8b", 8, dict(zero_stage=3, global_batch_size=64, recompute="none",
                                                         activation_offload_layers=8)),
}


def _bundle(case: str):
    name, gpus, kw = CASES[case]
    model, cluster = load_model_preset(name), load_cluster(gpu=GPU, num_gpus=gpus)
    plan = make_plan(model, cluster, engine="megatron", seq_len=4096, **kw)
    est = estimate(model, cluster, plan)
    return est, render_bundle(est).files


@pytest.mark.parametrize("suffix", ["yaml", "args"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_emitted_overrides_read_back_to_the_same_plan_and_estimate(tmp_path, case, suffix):
    est, files = _bundle(case)
    path = tmp_path / f"bridge_overrides.{suffix}"
    path.write_text(files[path.name])
    generic = case.endswith("generic")  # the generic GPT recipe: the model is not named by the file
    job = read_job([str(path)], gpu=GPU, num_gpus=est.cluster.num_gpus,
                   **({"model": CASES[case][0]} if generic else {}))
    assert job.plan == est.plan
    again = estimate(job.model, job.cluster, job.plan, job.settings)
    assert again.time.step_time_s == pytest.approx(est.time.step_time_s, rel=1e-9)
    assert again.memory.total == pytest.approx(est.memory.total, rel=1e-9)


def test_the_generic_recipes_model_is_the_shape_it_states_and_the_world_size_is_asked_for(tmp_path):
    """The generic recipe builds no model of its own: its overrides state the shape (num_layers, hidden_size, ...),
    read as the preset of that shape (autotune.job_bridge_model); the world size is never in the file."""
    _, files = _bundle("mixtral-ep-generic")
    path = tmp_path / "bridge_overrides.yaml"
    path.write_text(files[path.name])
    with pytest.raises(InputError) as err:
        read_job([str(path)], gpu=GPU)
    text = " ".join(err.value.problems)
    assert "--num-gpus" in text and "--model" not in text
    job = read_job([str(path)], gpu=GPU, num_gpus=32)
    assert job.model.name == "mixtral-8x7b" and f"model: the shape {path} states is the preset mixtral-8x7b's" in \
        job.notes


def test_cli_estimate_from_the_overrides_matches_the_plan(tmp_path, capsys):
    est, files = _bundle("70b-fp8-current-userbuffers-bf16-grads")
    path = tmp_path / "bridge_overrides.yaml"
    path.write_text(files[path.name])
    code = main(["estimate", "--from", str(path), "--gpu", GPU, "--num-gpus", "64", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    data = json.loads(out.out)
    assert data["time"]["step_time_s"] == pytest.approx(est.time.step_time_s, rel=1e-9)
    assert data["plan"]["fp8_recipe"] == "te-current" and data["plan"]["tp_overlap"] == "userbuffers"


def test_a_bad_value_is_exit_2_naming_the_key(tmp_path, capsys):
    path = tmp_path / "bridge_overrides.yaml"
    path.write_text("# Base recipe: llama3_8b_pretrain_2gpu_h100_bf16_config\nmodel:\n  tensor_model_parallel_size: -2\n")
    code = main(["estimate", "--from", str(path), "--gpu", GPU, "--num-gpus", "8"])
    err = capsys.readouterr().err
    assert code == 2 and "tensor_model_parallel_size must be a positive integer" in err and "Traceback" not in err


@pytest.mark.parametrize(("model", "why"), [("  tensor_model_parallel_size: 1\n  sequence_parallel: true\n", "< 2"),
                                            ("  tensor_model_parallel_size: 2\n  sequence_parallel: false\n",
                                             "sequence_parallel is not true")])
def test_validate_warns_of_tp_overlap_bridge_turns_off(tmp_path, capsys, model, why):
    path = tmp_path / "bridge_overrides.yaml"
    path.write_text(f"model:\n{model}comm_overlap:\n  tp_comm_overlap: true\n")
    assert main(["validate", str(path), "--world-size", "8"]) == 1
    out = capsys.readouterr().out
    assert "warning: $.comm_overlap.tp_comm_overlap" in out and why in out and "0 error(s)" in out
    # what autotune emits with --tp-overlap userbuffers is clean
    _, files = _bundle("70b-fp8-current-userbuffers-bf16-grads")
    path.write_text(files["bridge_overrides.yaml"])
    assert main(["validate", str(path), "--world-size", "64"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("suffix", ["yaml", "args"])
@pytest.mark.parametrize("name", ["llama3-70b", "llama3-8b"])  # MixedPrecisionConfig fields; bf16_with_nvfp4_mixed
def test_nvfp4_files_read_back_to_the_same_plan_and_estimate(tmp_path, name, suffix):
    """An NVFP4 plan (on Blackwell) written as Bridge overrides and as Megatron-LM arguments reads back as itself."""
    model, cluster = load_model_preset(name), load_cluster(gpu="b200", num_gpus=16)
    plan = make_plan(model, cluster, engine="megatron", seq_len=4096, tp=2, sequence_parallel=True, zero_stage=1,
                     global_batch_size=64, precision="fp4")
    est = estimate(model, cluster, plan)
    files = render_bundle(est).files
    for file in (f"bridge_overrides.{suffix}", "megatron_args.sh"):
        path = tmp_path / file
        path.write_text(files[file])
        job = read_job([str(path)], gpu="b200", num_gpus=16)
        assert job.plan == est.plan and job.plan.precision == "fp4", file
        again = estimate(job.model, job.cluster, job.plan, job.settings)
        assert again.time.step_time_s == pytest.approx(est.time.step_time_s, rel=1e-9)
        assert again.memory.total == pytest.approx(est.memory.total, rel=1e-9)
