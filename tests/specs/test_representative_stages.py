"""The stages the ledger and the step time evaluate (``model_representative_stages``) stand in for every stage: each
stage has an evaluated one with the same layer count and the same mix of layer kinds (MoE or dense, local or global
attention). Before, stages were told apart by their layer count alone, so DeepSeek-V3 on 32 stages (two layers a
stage; the three dense first layers fill stage 0 and 1) was judged by its dense stages and its 22.5B expert
parameters a stage never counted: `autotune plan` put a plan needing 577 GiB per GPU first on 185 GiB GB200s."""

import json

import pytest

from autotune.cli import main
from autotune.specs.layout import layer_counts
from autotune.specs.stage_mix import layer_kinds, model_representative_stages, representative_stages
from autotune.specs.loading import load_model

MODELS = ["deepseek-v3", "kimi-k2", "glm-4.5", "gpt-oss-120b", "llama4-maverick", "gemma3-27b", "llama3-70b"]


def _mix(kinds, counts, stage):
    start = sum(counts[:stage])
    n = counts[stage]
    return n, tuple(sorted(kinds[start:start + n])) if kinds is not None else ()


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("scheme", ["megatron", "any", "any+loss1"])
def test_every_stage_has_an_evaluated_stand_in_of_its_layer_mix(name, scheme):
    model = load_model(name)
    kinds = layer_kinds(model)
    for pp in (2, 3, 4, 8, 16, 32):
        counts = layer_counts(model.num_layers, pp, scheme)
        if counts is None or pp > model.num_layers:
            continue
        chosen = model_representative_stages(model, pp, scheme)
        assert {0, pp - 1} <= set(chosen)
        evaluated = {_mix(kinds, counts, s) for s in chosen}
        for stage in range(pp):
            assert _mix(kinds, counts, stage) in evaluated, (name, scheme, pp, stage)


def test_kinds_are_none_for_a_model_of_one_kind_and_the_count_rule_stays():
    llama = load_model("llama3-70b")
    assert layer_kinds(llama) is None
    assert model_representative_stages(llama, 8) == representative_stages(llama.num_layers, 8)


def test_deepseek_on_32_stages_is_judged_by_its_moe_stages():
    model = load_model("deepseek-v3")
    kinds = layer_kinds(model)
    assert kinds is not None and kinds[:3] == (0, 0, 0) and set(kinds[3:]) == {1}
    assert representative_stages(model.num_layers, 32, "any+loss1") == (0, 1, 31)  # layer counts alone
    assert 2 in model_representative_stages(model, 32, "any+loss1")  # stage 2: two MoE layers


def test_the_ledger_counts_the_moe_stages_experts(capsys):
    argv = ["estimate", "--model", "deepseek-v3", "--gpu", "gb200", "--num-gpus", "256", "--gpus-per-node", "64",
            "--global-batch", "4096", "--seq-len", "4096", "--precision", "fp8", "--engine", "fsdp", "--pp", "32",
            "--zero", "0", "--json"]
    assert main(argv) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    # two MoE layers of 256 experts (3 x 7168 x 2048 each): 22.5B parameters, unsharded (zero 0, ep 1), fp32
    assert memory["stage"] >= 2
    assert memory["weights"] > 22e9 * 4 * 0.99
    assert not memory["fits"]


def _every_stage(model, pp, scheme="megatron", vpp=1):
    return tuple(range(pp))


@pytest.mark.parametrize("name", ["deepseek-v3", "gpt-oss-120b", "llama4-maverick", "gemma3-27b"])
def test_the_stages_chosen_give_what_every_stage_gives(name, monkeypatch):
    """The ledger's peak and the step time over the chosen stages equal those over every stage, for pipelines with
    and without interleaving, on the engines' own splits (megatron's and torchtitan's)."""
    import autotune.cost.memory as memory
    import autotune.cost.step_time as step_time
    from autotune.api import make_plan
    from autotune.errors import InputError
    from autotune.specs.loading import load_cluster

    model = load_model(name)
    cluster = load_cluster(gpu="gb200", num_gpus=256, gpus_per_node=64)
    checked = 0
    for engine, pp, vpp in [("megatron", 4, 1), ("megatron", 8, 2), ("fsdp", 8, 1), ("fsdp", 8, 3), ("fsdp", 16, 1),
                            ("megatron", 16, 1), ("fsdp", 32, 1)]:
        plan = None
        for ep in (8, 1) if model.is_moe else (1,):  # fsdp runs EP only in torchtitan's MoE models (no Llama 4)
            try:
                plan = make_plan(model, cluster, global_batch_size=4096, seq_len=4096, pp=pp, vpp=vpp, ep=ep,
                                 engine=engine, zero_stage=1 if engine == "megatron" else 3)
                break
            except InputError:
                continue
        if plan is None:
            continue
        memory._activations_cache.clear()
        memory._states_cache.clear()
        chosen = (memory.estimate_memory(model, cluster, plan), step_time.estimate_step_time(model, cluster, plan))
        monkeypatch.setattr(memory, "model_representative_stages", _every_stage)
        monkeypatch.setattr(step_time, "model_representative_stages", _every_stage)
        memory._activations_cache.clear()
        memory._states_cache.clear()
        every = (memory.estimate_memory(model, cluster, plan), step_time.estimate_step_time(model, cluster, plan))
        monkeypatch.undo()
        memory._activations_cache.clear()
        memory._states_cache.clear()
        assert chosen[0].total == pytest.approx(every[0].total), (engine, pp, vpp)
        assert chosen[1].step_time_s == pytest.approx(every[1].step_time_s), (engine, pp, vpp)
        checked += 1
    assert checked >= 4
