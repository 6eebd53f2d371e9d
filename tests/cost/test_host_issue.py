"""A Grace host issues each kernel 2.75x slower than an x86 DGX host (``KernelFacts.host_issue_factor``; Transformer
Engine issue #2053: one torch.nn.Linear forward's CPU time 37.08 us on GB200, 13.48 us on an H100 DGX): the launch
waits of the step-time model (``autotune.cost.launch``) scale by it where the host sets the pace, and nowhere else."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
import yaml

from autotune.api import estimate, make_plan
from autotune.cost.launch import host_issue_s
from autotune.engines.facts import EAGER_OP_S as KERNEL_LAUNCH_S
from autotune.errors import InputError
from autotune.specs.hardware import kernel_facts_from_dict
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset

MOE = load_model_preset("qwen3-30b-a3b")
DENSE = load_model_preset("llama3-8b")
GRACE = load_cluster(gpu="gb200", num_gpus=8)
X86_HOSTED = replace(GRACE, gpu=replace(GRACE.gpu, kernels=replace(GRACE.gpu.kernels, host_issue_factor=1.0)))


def _moe_plan(**kw):
    kw = {"seq_len": 256, "global_batch_size": 16, "micro_batch_size": 1} | kw
    return make_plan(MOE, GRACE, engine="megatron", ep=8, zero_stage=1, recompute="none", **kw)


def test_the_presets_say_which_hosts_are_grace():
    assert host_issue_s(GRACE, KERNEL_LAUNCH_S) == pytest.approx(2.75 * KERNEL_LAUNCH_S)
    assert host_issue_s(load_cluster(gpu="gb300", num_gpus=8), KERNEL_LAUNCH_S) == pytest.approx(2.75 * KERNEL_LAUNCH_S)
    for x86 in ("b200", "b300", "h100-sxm-80gb"):
        assert host_issue_s(load_cluster(gpu=x86, num_gpus=8), KERNEL_LAUNCH_S) == KERNEL_LAUNCH_S


def test_a_host_bound_moe_step_is_slower_on_grace_and_a_full_iteration_graph_is_not():
    plan = _moe_plan()  # 256-token micro-batches: the layers' GPU work is shorter than their launches
    grace, x86 = estimate(MOE, GRACE, plan), estimate(MOE, X86_HOSTED, plan)
    assert grace.time.step_time_s > 1.05 * x86.time.step_time_s  # the layers' own launches, 2.75x each
    graphed = _moe_plan(cuda_graph="full-iteration", moe_dispatcher="flex-hybridep")  # one launch a step
    assert estimate(MOE, GRACE, graphed).time.step_time_s == pytest.approx(
        estimate(MOE, X86_HOSTED, graphed).time.step_time_s, rel=1e-12)


def test_large_dense_layers_hide_the_launches_on_either_host():
    plan = make_plan(DENSE, GRACE, engine="megatron", zero_stage=1, seq_len=8192, global_batch_size=64,
                     micro_batch_size=2, recompute="none")
    assert estimate(DENSE, GRACE, plan).time.step_time_s == pytest.approx(
        estimate(DENSE, X86_HOSTED, plan).time.step_time_s, rel=1e-12)


@pytest.mark.parametrize("bad", [0, -1.0, "fast", 1000, True])
def test_a_bad_host_issue_factor_is_refused_naming_it(bad):
    facts = dict(GRACE.gpu.kernels.__class__.__dataclass_fields__)  # every field name
    data = {k: getattr(GRACE.gpu.kernels, k) for k in facts if k != "source"}
    data = {k: dict(v) if hasattr(v, "items") else v for k, v in data.items()} | {"host_issue_factor": bad}
    with pytest.raises(InputError, match="host_issue_factor"):
        kernel_facts_from_dict(data, "my-grace-gpu", "gb200")


def test_estimate_names_the_hosts_launch_time():
    out = subprocess.run([sys.executable, "-m", "autotune", "estimate", "--model", "qwen3-30b-a3b", "--gpu", "gb200",
                          "--num-gpus", "8", "--engine", "megatron", "--ep", "8", "--seq-len", "4096",
                          "--global-batch", "64"], capture_output=True, text=True, check=True).stdout
    assert "kernel launches 37.1 us each (2.75x an x86 host's 13.48 us: gb200's host)" in out
    x86 = subprocess.run([sys.executable, "-m", "autotune", "estimate", "--model", "qwen3-30b-a3b", "--gpu", "b200",
                          "--num-gpus", "8", "--engine", "megatron", "--ep", "8", "--seq-len", "4096",
                          "--global-batch", "64"], capture_output=True, text=True, check=True).stdout
    assert "kernel launches 13.5 us each," in x86


def test_a_users_cluster_yaml_sets_its_hosts_factor(tmp_path):
    # a GPU of the user's own with GB200's kernel facts: on a Grace host (2.75) it costs what the gb200 preset
    # costs; left out, the host is taken as an x86 one (1.0)
    facts = {k: getattr(GRACE.gpu.kernels, k) for k in GRACE.gpu.kernels.__class__.__dataclass_fields__}
    facts = {k: dict(v) if hasattr(v, "items") else v for k, v in facts.items() if k != "source"}
    runs = {}
    for name, factor in (("grace", 2.75), ("x86", None)):
        kernels = {k: v for k, v in facts.items() if k != "host_issue_factor" or factor is not None}
        if factor is not None:
            kernels["host_issue_factor"] = factor
        gpu = {"name": f"my-{name}", "memory_gib": 185.03, "peak_tflops": dict(GRACE.gpu.peak_tflops),
               "hbm_bandwidth_gb_per_s": GRACE.gpu.hbm_bandwidth_gb_per_s, "compute_capability": "10.0",
               "kernels": kernels}
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"gpu": gpu, "num_gpus": 8, "gpus_per_node": 72,
                                        "intra_node_bandwidth_gb_per_s": 900, "inter_node_bandwidth_gb_per_s": 50}))
        cluster = load_cluster(cluster_path=str(path))
        runs[name] = estimate(MOE, cluster, _moe_plan()).time.step_time_s
    assert runs["grace"] == pytest.approx(estimate(MOE, GRACE, _moe_plan()).time.step_time_s, rel=1e-9)
    assert runs["x86"] == pytest.approx(estimate(MOE, X86_HOSTED, _moe_plan()).time.step_time_s, rel=1e-9)
