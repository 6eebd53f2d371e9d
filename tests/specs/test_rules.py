"""Plan rules: each rule fires on its own, and every violated rule is reported at once."""

import pytest

from autotune.api import make_plan
from autotune.errors import InputError
from autotune.rules import plan_problems
from autotune.specs.hardware import ClusterSpec, GPUSpec
from autotune.specs.model import ModelSpec, MoESpec
from autotune.specs.plan import ParallelPlan

GPU = GPUSpec(name="a100", memory_gib=80, peak_tflops={"bf16": 312, "fp16": 312}, hbm_bandwidth_gb_per_s=2039)
CLUSTER = ClusterSpec(gpu=GPU, num_nodes=2, gpus_per_node=8, intra_node_bandwidth_gb_per_s=300,
                      inter_node_bandwidth_gb_per_s=25)
MODEL = ModelSpec(name="m", num_layers=24, hidden_size=2048, num_attention_heads=16, num_kv_heads=4,
                  ffn_hidden_size=8192, vocab_size=32000)
MOE = ModelSpec(name="moe", num_layers=8, hidden_size=1024, num_attention_heads=8, ffn_hidden_size=4096,
                vocab_size=32000, moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=2048))


def rules(model=MODEL, **kw):
    base = dict(dp=16, global_batch_size=16, grad_accum_steps=1, seq_len=2048)
    base.update(kw)
    return {rule for rule, _ in plan_problems(model, CLUSTER, ParallelPlan(**base))}


def test_valid_plan_has_no_problems():
    assert rules() == set()
    assert rules(tp=2, pp=2, dp=4, grad_accum_steps=4, sequence_parallel=True, engine="megatron") == set()
    # The same layout under plain DeepSpeed: no Megatron SP, and AutoTP does not compose with PipelineModule.
    assert rules(tp=2, pp=2, dp=4, grad_accum_steps=4, sequence_parallel=True) == {
        "deepspeed:sequence_parallel", "deepspeed:tp_pp"}


@pytest.mark.parametrize("kw,rule", [
    (dict(dp=8), "world_size"),
    (dict(pp=5, dp=3), "world_size"),
    (dict(pp=32, dp=1, global_batch_size=1), "world_size"),
    (dict(pp=16, dp=1, global_batch_size=1, engine="megatron"), "megatron:layer_split"),
    # 24 layers + embedding + loss cannot fill 2 x 16 virtual stages (Megatron-core runs any split without an empty one).
    (dict(pp=2, dp=8, vpp=16, engine="megatron", global_batch_size=16, grad_accum_steps=2), "layers_vpp"),
    (dict(vpp=2), "vpp_needs_pp"),
    (dict(global_batch_size=17), "batch_triple"),
    (dict(cp=4, dp=4, seq_len=2052), "seq_cp"),
    (dict(ep=2), "ep_dense"),
    (dict(pp=2, dp=8, zero_stage=2, global_batch_size=16, grad_accum_steps=2), "deepspeed:zero_pp"),
    (dict(zero_stage=3, offload_optimizer="cpu", engine="megatron"), "megatron:offload_optimizer"),
    (dict(zero_stage=1, engine="fsdp"), "fsdp:zero_stage"),
    (dict(tp=2, dp=8, engine="hf"), "hf:tp"),
    (dict(cp=2, dp=8, engine="hf"), "hf:cp"),
    (dict(cp=2, dp=8, tp=2, global_batch_size=8), "deepspeed:ulysses_layout"),
    (dict(zero_stage=3, offload_param="cpu", engine="fsdp"), "fsdp:offload"),
    (dict(zero_stage=1, offload_optimizer="cpu", engine="megatron"), "megatron:offload_optimizer"),
    (dict(dp_replicate=2, zero_stage=3), "deepspeed:hybrid_shard"),
    (dict(zero_stage=2, offload_param="cpu"), "offload_param_zero3"),
    (dict(offload_optimizer="cpu"), "offload_optimizer_zero"),
    (dict(zero_stage=3, offload_optimizer="nvme"), "nvme_path"),
    (dict(sequence_parallel=True), "sp_tp"),
    (dict(precision="fp8"), "precision_gpu"),
    (dict(recompute="selective", recompute_num_layers=2), "recompute_layers"),
])
def test_each_rule_fires(kw, rule):
    assert rule in rules(**kw)


def test_kv_heads_may_be_a_divisor_of_tp():
    # 4 KV heads with tp=8: each KV head is replicated on 2 ranks (Megatron allows it); 3 KV heads would not be.
    assert rules(tp=8, dp=2, global_batch_size=2) == set()
    odd_kv = ModelSpec(name="kv3", num_layers=24, hidden_size=2304, num_attention_heads=24, num_kv_heads=3,
                       ffn_hidden_size=8192, vocab_size=32000)
    assert "kv_heads_tp" in rules(odd_kv, tp=2, dp=8, global_batch_size=8)


def test_heads_not_multiple_of_tp():
    odd = ModelSpec(name="odd", num_layers=24, hidden_size=1536, num_attention_heads=12, ffn_hidden_size=6144,
                    vocab_size=32000)
    assert "heads_tp" in rules(odd, tp=8, dp=2, global_batch_size=2)


def test_experts_divisible_by_ep():
    # on an engine with expert parallelism (DeepSpeed on the user's model has none: deepspeed:ep)
    assert "experts_ep" in rules(MOE, ep=16, engine="megatron")
    assert rules(MOE, ep=8, engine="megatron") == set()
    assert rules(MOE, ep=8) == {"deepspeed:ep"}


def test_every_violation_is_reported_at_once():
    with pytest.raises(InputError) as err:
        make_plan(MODEL, CLUSTER, tp=3, pp=25, global_batch_size=7, zero_stage=3, offload_param="nvme",
                  precision="fp8", engine="megatron")
    text = str(err.value)
    for needle in ("not divisible by tp*pp*cp", "multiple of tp (3)", "cannot be split over pp=25 stages",
                   "nvme_path", "no fp8", "no parameter offload to nvme",
                   "no engine runs this plan as it is"):
        assert needle in text, needle
    assert len(err.value.problems) >= 6


def test_make_plan_derives_dp_and_accumulation():
    plan = make_plan(MODEL, CLUSTER, tp=2, pp=2, global_batch_size=64, micro_batch_size=2, engine="megatron")
    assert (plan.dp, plan.grad_accum_steps, plan.sequence_parallel) == (4, 8, True)
    assert plan.tokens_per_step == 64 * 2048


def test_uneven_pipeline_split_as_llama3_405b():
    # Llama 3 paper Sec. 3.3.2: 126 layers on 16 stages, one layer fewer on the first and last: 7 + 14 x 8 + 7.
    from autotune.specs.layout import pipeline_split, stage_layers

    assert pipeline_split(126, 16) == (7, 8, 7)
    assert stage_layers(126, 16, 0) == (0, 7) and stage_layers(126, 16, 1) == (7, 8)
    assert stage_layers(126, 16, 15) == (119, 7)
    assert pipeline_split(24, 5) is None  # 5 + 5 + 5 leaves 9 for two end stages: no equal split
    assert pipeline_split(80, 8) == (10, 10, 10)


def test_deepspeed_pipeline_splits_unevenly_as_partition_uniform():
    # BLOOM-176B ran 70 layers on 12 stages under Megatron-DeepSpeed; DeepSpeed's partition_uniform gives the
    # first 70 % 12 = 10 stages one layer more: 10 x 6 + 2 x 5.
    from autotune.specs.layout import layer_counts, stage_layers

    assert layer_counts(70, 12, "uniform") == (6,) * 10 + (5, 5)
    assert stage_layers(70, 12, 11, "uniform") == (65, 5)
    assert layer_counts(24, 5, "uniform") == (5, 5, 5, 5, 4)
    # Megatron-core: no even or halved split of 24 over 5, so the slot split (--decoder-first 5 --decoder-last 4);
    # torchtitan ("any") keeps partition_uniform's.
    assert layer_counts(24, 5, "megatron") == (5, 5, 5, 5, 4) and layer_counts(24, 5, "any") == (5, 5, 5, 5, 4)
    assert rules(pp=4, dp=4, global_batch_size=16, grad_accum_steps=4,
                 model=ModelSpec(name="m70", num_layers=70, hidden_size=1024, num_attention_heads=16,
                                 ffn_hidden_size=4096, vocab_size=32000)) == set()
