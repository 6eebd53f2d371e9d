"""Every DeepSpeed config we emit passes our schema and DeepSpeed 0.19.8's own parser for its world size.

Plans come from the planner (hundreds, over five model/cluster pairs) plus hand-made ones for what
the planner does not pick (NVMe offload, fp16, SGD, Adafactor, FP8, pipelines with full recompute).
Each config also round-trips through JSON, has integer sizes, carries the ledger's bucket sizes, and
builds the optimizer and LR scheduler it names (their kwargs are only checked at deepspeed.initialize).
"""

import json

import pytest
import torch
import yaml

from autotune.api import deepspeed_config_for, make_plan, plan_from_deepspeed_config
from autotune.emit.accelerate import accelerate_config_yaml
from autotune.emit.deepspeed import HF_AUTO_PATHS, deepspeed_config, deepspeed_config_notes, hf_deepspeed_config
from autotune.emit.options import EmitOptions, OptimizerOptions
from autotune.emit.validate import validate_deepspeed_config
from autotune.errors import InputError
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.loading import load_cluster, load_model
from autotune.specs.plan import ParallelPlan
from autotune.specs.settings import MemorySettings

# (model, gpu, GPUs, seq_len, global batch): the brief's five.
SEARCHES = [
    ("llama3-8b", "h100-sxm-80gb", 8, 4096, 64),
    ("llama3-8b", "h100-sxm-80gb", 64, 4096, 256),
    ("llama3-70b", "h100-sxm-80gb", 128, 4096, 512),
    ("mixtral-8x7b", "h100-sxm-80gb", 64, 4096, 256),
    ("gpt3-175b", "a100-80gb", 1024, 2048, 1536),
]
PER_SEARCH = 70  # evenly spaced over the ranked list, distinct configs only


def _sample(model_name, gpu, num_gpus, seq_len, batch):
    model, cluster = load_model(model_name), load_cluster(gpu=gpu, num_gpus=num_gpus)
    ranked = search_plans(model, cluster, seq_len=seq_len, global_batch_size=batch,
                          constraints=SearchConstraints(engines=("deepspeed",))).ranked
    assert len(ranked) >= PER_SEARCH, f"{model_name}: only {len(ranked)} feasible plans"
    step = len(ranked) / PER_SEARCH
    return model, cluster, [ranked[int(i * step)].plan for i in range(PER_SEARCH)]


def _int_fields_are_ints(cfg: dict) -> list[str]:
    z = cfg["zero_optimization"]
    names = ["train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"]
    values = [cfg[n] for n in names] + [z[k] for k in z if k.endswith(("bucket_size", "threshold", "parameters",
                                                                         "distance"))]
    return [f"{v!r}" for v in values if type(v) is not int]


def _check(model, cluster, plan, cfg=None) -> list[str]:
    """Why the config for ``plan`` is wrong (empty when it is right)."""
    cfg = cfg if cfg is not None else deepspeed_config(model, cluster, plan)
    why = [f"{p.severity} {p.path}: {p.message}" for p in
           validate_deepspeed_config(cfg, world_size=cluster.num_gpus, tp=plan.tp, pp=plan.pp, cp=plan.cp)]
    if json.loads(json.dumps(cfg)) != cfg:
        why.append("does not round-trip through JSON")
    why += [f"not an int: {v}" for v in _int_fields_are_ints(cfg)]
    # AutoTP: DeepSpeed 0.19.8 counts the TP ranks in the batch check (runtime/config.py:466-471).
    autotp = (cfg.get("tensor_parallel") or {}).get("autotp_size", 1)
    if cfg["train_batch_size"] != plan.micro_batch_size * plan.grad_accum_steps * plan.dp * autotp:
        why.append("train_batch_size is not micro x accumulation x dp (x autotp_size)")
    if "fp8" in json.dumps(cfg):
        why.append("an fp8 key")
    return why


@pytest.mark.parametrize("search", SEARCHES, ids=[f"{s[0]}-{s[2]}x{s[1]}" for s in SEARCHES])
def test_planner_plans_pass_schema_and_deepspeed(search):
    model, cluster, plans = _sample(*search)
    failures = {}
    for plan in plans:
        why = _check(model, cluster, plan)
        if why:
            failures[str(plan)] = why
    assert not failures, json.dumps(failures, indent=1)[:4000]


def _llama8(num_gpus=8, **overrides):
    model, cluster = load_model("llama3-8b"), load_cluster(gpu="h100-sxm-80gb", num_gpus=num_gpus)
    fields = dict(tp=1, pp=1, cp=1, micro_batch_size=1, seq_len=4096, global_batch_size=num_gpus * 2)
    fields.update(overrides)
    # Built directly, not with make_plan: these layouts test the writer, whatever the engine's rules say of them.
    dp = num_gpus // (fields["tp"] * fields["pp"] * fields["cp"])
    accum = fields["global_batch_size"] // (fields["micro_batch_size"] * dp)
    return model, cluster, ParallelPlan(dp=dp, grad_accum_steps=accum, **fields)


# Plans the planner does not choose here: each emitted config must still be valid.
HAND_MADE = {
    "zero3-offload-cpu": dict(zero_stage=3, offload_optimizer="cpu", offload_param="cpu"),
    "zero3-offload-nvme": dict(zero_stage=3, offload_optimizer="nvme", offload_param="nvme", nvme_path="/local_nvme"),
    "zero2-offload-opt-nvme": dict(zero_stage=2, offload_optimizer="nvme", nvme_path="/local_nvme"),
    "zero1-offload-cpu-fp16": dict(zero_stage=1, offload_optimizer="cpu", precision="fp16"),
    "zero0-fp16": dict(zero_stage=0, precision="fp16"),
    "zero2-sgd": dict(zero_stage=2, optimizer="sgd"),
    "zero0-sgd": dict(zero_stage=0, optimizer="sgd"),
    "zero1-adafactor": dict(zero_stage=1, optimizer="adafactor"),
    "zero3-adamw8bit-fp8": dict(zero_stage=3, optimizer="adamw8bit", precision="fp8"),
    "pp4-full-recompute": dict(pp=4, zero_stage=1, recompute="full", micro_batch_size=1, global_batch_size=16),
    "pp2-tp2-selective": dict(pp=2, tp=2, zero_stage=0, recompute="selective", sequence_parallel=True),
    "tp8-zero3-full-block": dict(tp=8, zero_stage=3, recompute="full", recompute_num_layers=4, sequence_parallel=True),
    "no-overlap": dict(zero_stage=2, overlap_comm=False, micro_batch_size=2, global_batch_size=32),
    "megatron-deepspeed-tp2-pp2": dict(tp=2, pp=2, zero_stage=1, engine="megatron", sequence_parallel=True),
}


@pytest.mark.parametrize("name", HAND_MADE)
def test_hand_made_plans_pass_schema_and_deepspeed(name):
    model, cluster, plan = _llama8(**HAND_MADE[name])
    assert _check(model, cluster, plan) == []


def test_blocks_follow_the_plan():
    model, cluster, plan = _llama8(zero_stage=3, offload_optimizer="nvme", offload_param="nvme", nvme_path="/nvme",
                                   tp=2, recompute="full", sequence_parallel=True)
    cfg = deepspeed_config(model, cluster, plan)
    z = cfg["zero_optimization"]
    assert z["offload_param"] == {"device": "nvme", "pin_memory": True, "nvme_path": "/nvme", "buffer_count": 5,
                                  "buffer_size": 100_000_000}  # the ledger's 5 x 1e8 x 2 B staging buffers
    assert z["offload_optimizer"]["device"] == "nvme" and z["stage3_gather_16bit_weights_on_model_save"] is True
    assert cfg["tensor_parallel"] == {"autotp_size": 2}
    # 32 layers, pp 1: 32 checkpoints per forward; partitioned over the 2 TP ranks.
    assert cfg["activation_checkpointing"] == {"partition_activations": True, "number_checkpoints": 32,
                                               "contiguous_memory_optimization": False, "cpu_checkpointing": False}
    assert "pipeline" not in cfg and cfg["bf16"] == {"enabled": True} and "fp16" not in cfg
    assert cfg["checkpoint"] == {"tag_validation": "Warn", "load_universal": False, "use_node_local_storage": False}

    _, _, pp_plan = _llama8(pp=4, zero_stage=1, recompute="full", global_batch_size=16)
    pp_cfg = deepspeed_config(model, cluster, pp_plan)
    assert pp_cfg["pipeline"] == {"activation_checkpoint_interval": 1}
    assert pp_cfg["activation_checkpointing"]["number_checkpoints"] == 8  # 32 layers / 4 stages
    assert "tensor_parallel" not in pp_cfg  # tp 1
    _, _, fp16_plan = _llama8(precision="fp16")
    fp16 = deepspeed_config(model, cluster, fp16_plan)["fp16"]
    assert fp16 == {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                    "hysteresis": 2, "min_loss_scale": 1}


def test_bucket_sizes_are_the_ledgers():
    model, cluster, plan = _llama8(zero_stage=3)
    settings = MemorySettings(reduce_bucket_size=200_000_000, allgather_bucket_size=300_000_000,
                              stage3_prefetch_bucket_size=40_000_000, stage3_max_live_parameters=700_000_000)
    z = deepspeed_config(model, cluster, plan, memory_settings=settings)["zero_optimization"]
    assert (z["reduce_bucket_size"], z["allgather_bucket_size"], z["stage3_prefetch_bucket_size"],
            z["stage3_max_live_parameters"]) == (200_000_000, 300_000_000, 40_000_000, 700_000_000)
    # And the inverse: the plan and settings a config implies are the ones it was written from.
    back, back_settings = plan_from_deepspeed_config(deepspeed_config(model, cluster, plan, memory_settings=settings),
                                                     model, cluster, seq_len=plan.seq_len)
    assert back_settings.reduce_bucket_size == 200_000_000 and back_settings.stage3_max_live_parameters == 700_000_000
    assert (back.zero_stage, back.micro_batch_size, back.grad_accum_steps, back.dp, back.overlap_comm) == \
        (plan.zero_stage, plan.micro_batch_size, plan.grad_accum_steps, plan.dp, plan.overlap_comm)


def test_optimizer_and_scheduler_build_from_the_config():
    from deepspeed.runtime.lr_schedules import WarmupCosineLR

    options = EmitOptions(optimizer=OptimizerOptions(lr=2e-4, min_lr=2e-5, warmup_steps=10, train_steps=100))
    model, cluster, plan = _llama8(zero_stage=1)
    for optimizer in ("adamw", "sgd", "adafactor"):
        cfg = deepspeed_config(model, cluster, plan.with_(optimizer=optimizer), options)
        params = [torch.nn.Parameter(torch.zeros(4))]
        opt = getattr(torch.optim, cfg["optimizer"]["type"])(params, **cfg["optimizer"]["params"])
        sched = WarmupCosineLR(opt, **cfg["scheduler"]["params"])
        assert cfg["scheduler"]["params"]["cos_min_ratio"] == pytest.approx(0.1)  # 2e-5 / 2e-4
        for _ in range(100):
            opt.step()
            sched.step()
        assert sched.get_lr()[0] == pytest.approx(2e-5, rel=1e-3)  # decayed to min_lr at train_steps


def test_notes_say_what_the_config_cannot():
    assert deepspeed_config_notes(_llama8(zero_stage=1)[2]) == []
    (note,) = deepspeed_config_notes(_llama8(optimizer="adafactor")[2])
    assert "Adafactor" in note and "AdamW" in note
    notes = deepspeed_config_notes(_llama8(optimizer="adamw8bit", precision="fp8")[2])
    assert len(notes) == 2 and "Transformer Engine" in notes[1]


def test_checkpoint_block_can_be_extended():
    model, cluster, plan = _llama8()
    cfg = deepspeed_config(model, cluster, plan, checkpoint_block={"load_universal": True,
                                                                   "parallel_write": {"pipeline_stage": True}})
    assert cfg["checkpoint"] == {"tag_validation": "Warn", "load_universal": True, "use_node_local_storage": False,
                                 "parallel_write": {"pipeline_stage": True}}
    assert validate_deepspeed_config(cfg, world_size=8) == []


def _auto_paths(data, prefix=()):
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in _auto_paths(v, prefix + (k,))]
    return [".".join(prefix)] if data == "auto" else []


@pytest.mark.parametrize("name", ["zero3-offload-cpu", "zero2-sgd", "pp4-full-recompute", "zero0-fp16"])
def test_hf_variant_autos_only_where_the_integration_fills(name):
    model, cluster, plan = _llama8(**HAND_MADE[name])
    cfg = hf_deepspeed_config(model, cluster, plan)
    autos = set(_auto_paths(cfg))
    assert autos <= HF_AUTO_PATHS
    assert {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
            "optimizer.params.lr", "optimizer.params.weight_decay", "scheduler.params.total_num_steps",
            "scheduler.params.warmup_num_steps", "bf16.enabled", "fp16.enabled",
            "zero_optimization.reduce_bucket_size"} <= autos
    assert ("zero_optimization.stage3_prefetch_bucket_size" in autos) == (plan.zero_stage == 3)
    # Everything else is concrete and the plan's.
    assert cfg["zero_optimization"]["stage"] == plan.zero_stage and cfg["scheduler"]["type"] == "WarmupCosineLR"
    assert validate_deepspeed_config(cfg, world_size=8, pp=plan.pp, tp=plan.tp, hf=True) == []
    plain = validate_deepspeed_config(cfg, world_size=8, pp=plan.pp, tp=plan.tp)
    assert {p.path.removeprefix("$.") for p in plain} == autos and all(p.severity == "error" for p in plain)
    assert all("--hf" in p.fix for p in plain)


def test_accelerate_yaml():
    model, cluster, plan = _llama8(zero_stage=3)
    text = accelerate_config_yaml(plan, cluster, "ds_config.json")
    data = yaml.safe_load(text)
    assert data["distributed_type"] == "DEEPSPEED" and data["compute_environment"] == "LOCAL_MACHINE"
    assert data["deepspeed_config"] == {"deepspeed_config_file": "ds_config.json", "zero3_init_flag": True}
    assert (data["num_machines"], data["num_processes"], data["machine_rank"]) == (1, 8, 0)
    # No mixed_precision next to deepspeed_config_file: accelerate 1.16 raises on it (tests/emit/test_accelerate.py).
    assert data["main_training_function"] == "main" and "mixed_precision" not in data
    big = load_cluster(gpu="h100-sxm-80gb", num_gpus=32)
    _, _, fp16_plan = _llama8(num_gpus=32, precision="fp16", zero_stage=1)
    multi = yaml.safe_load(accelerate_config_yaml(fp16_plan, big, "ds.json"))
    assert (multi["num_machines"], multi["num_processes"]) == (4, 32) and "mixed_precision" not in multi
    assert multi["deepspeed_config"]["zero3_init_flag"] is False and multi["main_process_port"] == 29500


def test_python_api_runs_the_planner_or_builds_the_plan():
    best = deepspeed_config_for(model="llama3-8b", gpu="h100-sxm-80gb", num_gpus=8)
    assert validate_deepspeed_config(best, world_size=8) == []
    assert best["train_batch_size"] == 8  # default global batch: one sequence per GPU
    given = deepspeed_config_for("llama3-8b", "h100-sxm-80gb", 8, global_batch=64, tp=2, zero=3, micro_batch=2,
                                 offload_optimizer="cpu")
    assert given["zero_optimization"]["stage"] == 3 and given["tensor_parallel"] == {"autotp_size": 2}
    # dp = 8 / 2 = 4: 64 = 2 x 8 x 4
    assert (given["train_micro_batch_size_per_gpu"], given["gradient_accumulation_steps"]) == (2, 8)
    assert validate_deepspeed_config(given, world_size=8, tp=2) == []


def test_python_api_says_why_nothing_fits():
    with pytest.raises(InputError, match="no DeepSpeed plan .* is feasible"):
        deepspeed_config_for("llama3-405b", "h100-sxm-80gb", 1)
    with pytest.raises(InputError, match="does not fit: needs .* GiB per GPU"):
        deepspeed_config_for("llama3-70b", "h100-sxm-80gb", 8, zero_stage=0)
    with pytest.raises(InputError, match="did you mean zero_stage"):
        deepspeed_config_for("llama3-8b", "h100-sxm-80gb", 8, zero_stag=1)
    with pytest.raises(InputError, match="divisible"):
        deepspeed_config_for("llama3-8b", "h100-sxm-80gb", 8, tp=3)


def test_nvme_offload_without_path_is_refused():
    model, cluster, _ = _llama8()
    plan = make_plan(model, cluster, zero_stage=3, offload_param="none")
    with pytest.raises(InputError, match="nvme_path"):
        deepspeed_config(model, cluster, plan.with_(offload_optimizer="nvme"))


def test_a_cpu_cluster_config_runs_torch_adamw_not_a_jit_built_fused_adam():
    # A user's script with the emitted config on CPU used to JIT-build DeepSpeed's CPU FusedAdam (minutes) on its
    # first step; the built-in trainer set torch_adam itself. ZeRO-Offload keeps DeepSpeedCPUAdam (cpu_adam).
    model, cpu = load_model("tiny-gpt"), load_cluster(gpu="cpu", num_gpus=2)
    plan = make_plan(model, cpu, seq_len=256, zero_stage=1)
    assert deepspeed_config(model, cpu, plan)["optimizer"]["params"]["torch_adam"] is True
    offload = make_plan(model, cpu, seq_len=256, zero_stage=1, offload_optimizer="cpu")
    assert "torch_adam" not in deepspeed_config(model, cpu, offload)["optimizer"]["params"]
    gpu_model, h100 = load_model("llama3-8b"), load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    assert "torch_adam" not in deepspeed_config(gpu_model, h100, make_plan(gpu_model, h100))["optimizer"]["params"]
