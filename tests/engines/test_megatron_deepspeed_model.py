"""Megatron-DeepSpeed (the microsoft fork) builds the models its GPT layer and DeepSpeed-MoE's gate can express,
and the planner proposes no other (emit.megatron_deepspeed_model). Before, GPT-OSS-20B on 8 H100 was ranked first on
Megatron-DeepSpeed, whose files dropped its sliding windows, attention sinks, YaRN scaling, clamped GLU and biased
router; and every RoPE model was written with the fork's default base (10000, not Llama 3's 500000)."""

import pytest

from autotune.api import make_plan
from autotune.bundle.writer import render_bundle
from autotune.cost.estimate import estimate
from autotune.emit.megatron_deepspeed_model import megatron_deepspeed_model_problems
from autotune.emit.shell_args import parse_shell_args_with_lines
from autotune.errors import InputError
from autotune.rules import plan_problems
from autotune.search.planner import search_plans
from autotune.search.space import SearchConstraints
from autotune.specs.loading import load_cluster, load_model

H100_8 = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)


@pytest.mark.parametrize(("name", "says"), [
    ("gpt-oss-20b", ["sliding-window", "attention sinks", "scales RoPE (yarn)", "clamps its GLU", "router (softmax, biased)"]),
    ("qwen3-8b", ["normalises Q and K (qk_norm head)"]),
    ("deepseek-v3", ["multi-latent attention", "router (sigmoid, biased, group-limited, scaled)"]),
    ("llama4-scout", ["chunked attention (8192 tokens on 36 of 48 layers), under seq_len 16384", "router (sigmoid)"]),
])
def test_what_the_fork_cannot_build_is_named(name, says):
    problems = " | ".join(megatron_deepspeed_model_problems(load_model(name), 16384))
    for text in says:
        assert text in problems, problems
    assert "use engine" not in problems  # the way out is the engines that run the plan, asked (next test)


@pytest.mark.parametrize("name", ["opt-175b", "gemma3-27b"])
def test_the_refusal_names_only_engines_that_run_the_model(name):
    """Megatron-LM builds neither OPT's ReLU nor Gemma 3's layer: the refusal used to say "use engine megatron or
    fsdp" after each part; the way out is now the engines asked one by one, each of which accepts the plan."""
    from autotune.api import make_plan
    from autotune.errors import InputError

    model, cluster = load_model(name), load_cluster(gpu="h100-sxm-80gb", num_gpus=64)
    with pytest.raises(InputError) as err:
        make_plan(model, cluster, engine="megatron-deepspeed", seq_len=2048, global_batch_size=64)
    text = " | ".join(err.value.problems)
    assert "megatron or fsdp" not in text
    line = next(p for p in err.value.problems if p.startswith("engines that can run this plan as it is: "))
    named = line.split(": ", 1)[1].split(", ")
    assert named and "megatron" not in named
    for engine in named:
        make_plan(model, cluster, engine=engine, seq_len=2048, global_batch_size=64)  # accepted: no InputError


@pytest.mark.parametrize("name", ["llama3-8b", "gpt3-175b", "bloom-176b", "mixtral-8x7b"])
def test_what_it_builds_passes(name):
    assert megatron_deepspeed_model_problems(load_model(name), 4096) == []


def test_a_window_as_long_as_the_sequence_is_full_attention():
    phi3 = load_model("phi3-mini")  # sliding window 2047
    assert megatron_deepspeed_model_problems(phi3, 2047) == []
    assert megatron_deepspeed_model_problems(phi3, 2048)


def test_the_planner_no_longer_proposes_it_for_gpt_oss():
    model = load_model("gpt-oss-20b")
    plan = make_plan(model, H100_8, engine="megatron", ep=8, global_batch_size=256, seq_len=4096)
    refused = dict(plan_problems(model, H100_8, plan.with_(engine="megatron-deepspeed", zero_stage=2)))
    assert "megatron-deepspeed:architecture" in refused
    result = search_plans(model, H100_8, global_batch_size=256, seq_len=4096,
                          constraints=SearchConstraints(engines=("megatron-deepspeed",)))
    assert not result.candidates and result.rejections.get("megatron-deepspeed:architecture")


def test_the_rope_base_is_written():
    model = load_model("llama3-8b")
    plan = make_plan(model, H100_8, engine="megatron-deepspeed", zero_stage=1, global_batch_size=8, seq_len=4096)
    files = render_bundle(estimate(model, H100_8, plan)).files
    argv = " ".join(parse_shell_args_with_lines(files["megatron_deepspeed_args.sh"])[0])
    assert "--use-rotary-position-embeddings --no-position-embedding --rotary-position-embeddings-theta 500000" in argv


def test_the_emitter_refuses_what_the_rules_refuse():
    model = load_model("qwen3-8b")
    with pytest.raises(InputError) as err:
        make_plan(model, H100_8, engine="megatron-deepspeed", zero_stage=1, global_batch_size=8, seq_len=4096)
    assert "normalises Q and K (qk_norm head)" in str(err.value)



def test_no_engine_can_build_it_is_judged_at_the_requests_sequence():
    """`plan --engine megatron-deepspeed` for Phi-3-mini (window 2047) at seq 4096 said it fits on no number of GPUs
    (the model-level check asked a 128-token plan, where the window is full attention); it names the window now."""
    from autotune.search.capacity import model_refusal

    phi3 = load_model("phi3-mini")
    only = SearchConstraints(engines=("megatron-deepspeed",))
    refused = model_refusal(phi3, H100_8, only, seq_len=4096)
    assert refused is not None and "sliding-window attention (2047 tokens on 32 of 32 layers), under seq_len 4096" in refused
    assert "give another --engine" in refused
    assert model_refusal(phi3, H100_8, only, seq_len=2047) is None
