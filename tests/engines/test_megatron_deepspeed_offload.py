"""ZeRO-Offload under Megatron-DeepSpeed: the fork runs it with --cpu-optimizer (DeepSpeedCPUAdam,
deepspeedai/Megatron-DeepSpeed@4efb479d megatron/optimizer/__init__.py:83-94) and the ds_config's offload_optimizer,
so the engine takes the DeepSpeed engine's offload rules and costs, and its files say both."""

import json

from autotune.api import estimate, make_plan
from autotune.engines import engine_for as get_engine
from autotune.specs.loading import load_cluster, load_model


def _plan(**kw):
    model, cluster = load_model("llama3-8b"), load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    return model, cluster, make_plan(model, cluster, engine="megatron-deepspeed", global_batch_size=32, seq_len=4096,
                                     **kw)


def test_optimizer_offload_is_estimated_as_deepspeeds():
    model, cluster, plan = _plan(zero_stage=2, offload_optimizer="cpu")
    on = estimate(model, cluster, plan)
    off = estimate(model, cluster, plan.with_(offload_optimizer="none"))
    assert on.memory.optimizer_states == 0 < off.memory.optimizer_states
    assert on.memory.host_per_node > off.memory.host_per_node and on.time.offload_s > 0


def test_zero1_bf16_offload_runs_zero_not_bf16_optimizer():
    # deepspeed 0.19.8 runtime/engine.py:2305-2308: BF16_Optimizer only without zero_cpu_offload()
    engine = get_engine("megatron-deepspeed")
    _, _, plan = _plan(zero_stage=1, offload_optimizer="cpu")
    assert engine.tag(plan) == "mds-zero1" and engine.tag(plan.with_(offload_optimizer="none")) == "mds-bf16opt"


def test_offload_without_zero_is_refused_with_its_source():
    model, cluster = load_model("llama3-8b"), load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    plan = make_plan(model, cluster, engine="megatron-deepspeed", global_batch_size=32, seq_len=4096, zero_stage=0,
                     offload_optimizer="cpu", check=False)
    rules = get_engine("megatron-deepspeed").extra_problems(model, cluster, plan)
    assert any(r.id == "offload_optimizer_zero" and "offload_config.py" in r.source for r in rules)


def test_files_pass_cpu_optimizer_with_the_offload_block():
    model, cluster, plan = _plan(zero_stage=2, offload_optimizer="cpu")
    from autotune.emit.options import EmitOptions

    files = get_engine("megatron-deepspeed").render_files(model, cluster, plan, EmitOptions(), _Checkpoint(), {})
    assert "--cpu-optimizer" in files.program_args
    assert json.loads(files.files["ds_config.json"])["zero_optimization"]["offload_optimizer"]["device"] == "cpu"


class _Checkpoint:
    def ds_checkpoint_block(self):
        return None
