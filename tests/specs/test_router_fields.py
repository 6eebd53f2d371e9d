"""The router as config.json states it (MoESpec.router_*): score function, group-limited routing, the weights'
scale and normalisation, read from scoring_func / n_group / topk_group / routed_scaling_factor / norm_topk_prob with
each config class's defaults, and refused with a message where Megatron-core has no such router."""

import json

import pytest

from autotune.errors import InputError
from autotune.specs.loading import load_model, model_from_hf_config
from autotune.specs.model_parts import MoESpec

FIXTURES = "tests/fixtures/hf"


@pytest.mark.parametrize(("name", "score", "groups", "scale"), [
    ("deepseek-v3", "sigmoid", (8, 4), 2.5),
    ("kimi-k2", "sigmoid", (None, None), 2.827),
    ("glm-4.5", "sigmoid", (None, None), 2.5),
    ("moonlight-16b-a3b", "sigmoid", (None, None), 2.446),
    ("llama4-scout", "sigmoid", (None, None), 1.0),
    ("qwen3-30b-a3b", "softmax", (None, None), 1.0),
    ("gpt-oss-120b", "softmax", (None, None), 1.0),
    ("mixtral-8x7b", "softmax", (None, None), 1.0),
])
def test_each_config_reads_its_router_and_the_preset_agrees(name, score, groups, scale):
    read = model_from_hf_config(f"{FIXTURES}/{name}/config.json").moe
    assert (read.router_score, (read.router_groups, read.router_group_topk), read.router_scaling_factor) == (
        score, groups, scale)
    assert not read.router_pre_softmax
    assert load_model(name).moe == read


def _qwen3(tmp_path, **change):
    data = json.loads(open(f"{FIXTURES}/qwen3-30b-a3b/config.json").read()) | change
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


def test_unnormalised_top_k_weights_are_a_softmax_before_the_top_k(tmp_path):
    assert model_from_hf_config(_qwen3(tmp_path, norm_topk_prob=False)).moe.router_pre_softmax
    assert not model_from_hf_config(_qwen3(tmp_path, norm_topk_prob=True)).moe.router_pre_softmax


def test_a_score_function_megatron_has_not_is_refused_by_name(tmp_path):
    with pytest.raises(InputError) as err:
        model_from_hf_config(_qwen3(tmp_path, scoring_func="sqrtsoftplus"))
    assert "scoring_func 'sqrtsoftplus' is not modelled" in str(err.value)


@pytest.mark.parametrize(("fields", "says"), [
    (dict(router_score="relu"), "router_score must be softmax or sigmoid"),
    (dict(router_score="sigmoid", router_pre_softmax=True), "applies to a softmax router only"),
    (dict(router_groups=8), "go together"),
    (dict(router_groups=3, router_group_topk=2), "must divide num_experts"),
    (dict(router_groups=8, router_group_topk=9), "must divide num_experts"),
    (dict(router_scaling_factor=0.0), "must be > 0"),
])
def test_an_inconsistent_router_is_named(fields, says):
    moe = MoESpec(num_experts=256, top_k=8, expert_ffn_hidden_size=2048, **fields)
    assert any(says in p for p in moe.problems()), moe.problems()
