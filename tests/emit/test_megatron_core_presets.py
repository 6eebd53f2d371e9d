"""Every model preset through megatron-core 0.19.2 itself: for each, a realistic Megatron plan (one that fits H100s by
autotune's estimate; MoE presets with ep > 1), its ``megatron_args.sh`` passed through megatron-core's
``parse_args()``, ``validate_args()``, ``core_transformer_config_from_args()`` (TransformerConfig.__post_init__) and
the NullTokenizer ``pretrain_gpt.py`` builds (tests/emit/fixtures/megatron_core_config_probe.py, one process for
every case); the config must hold the preset's shape. The presets autotune refuses for Megatron on purpose (what
Megatron-core's GPT model cannot express) are refused up front with an InputError that names the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from megatron_core_probe import core_verdicts  # tests/emit/ is on sys.path (no __init__)

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.emit.shell_args import parse_shell_args
from autotune.engines.megatron_rules import megatron_position_type
from autotune.errors import InputError
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset

PRESETS = Path(__file__).resolve().parents[2] / "autotune" / "presets" / "models"
GPU = "h100-sxm-80gb"

# preset -> (GPUs, plan) that autotune runs: megatron-core must accept the file and hold the preset's shape. Sizes
# are those the estimate fits on 80 GB (full recompute where the experts need it); uneven pipeline splits included.
ACCEPTED = {
    "tiny-gpt": (8, dict()),
    "tiny-llama": (8, dict(tp=2)),
    "megatron-gpt-1.7b": (8, dict()),
    "megatron-gpt-3.6b": (8, dict(tp=2)),
    "megatron-gpt-7.5b": (16, dict(tp=4)),
    "megatron-gpt-18.4b": (32, dict(tp=8)),
    "megatron-gpt-22b": (32, dict(tp=8)),
    "megatron-gpt-39.1b": (64, dict(tp=8, pp=2)),
    "megatron-gpt-76.1b": (128, dict(tp=8, pp=4)),
    "megatron-gpt-145.6b": (128, dict(tp=8, pp=8)),
    "megatron-gpt-310.1b": (256, dict(tp=8, pp=16)),
    "megatron-gpt-529.6b": (240, dict(tp=8, pp=15)),
    "megatron-gpt-1t": (512, dict(tp=8, pp=64)),
    "gpt3-175b": (128, dict(tp=8, pp=8)),
    "nemotron-4-340b": (192, dict(tp=8, pp=12)),
    "llama2-7b": (8, dict()),
    "llama2-13b": (16, dict(tp=2)),
    "llama2-70b": (64, dict(tp=8, pp=4)),
    "llama3-8b": (16, dict(tp=2)),
    "llama3-70b": (64, dict(tp=8, pp=4)),
    "llama3-405b": (256, dict(tp=8, pp=16)),  # 126 layers: an uneven split
    "mistral-7b": (8, dict(tp=2)),
    "phi3-mini": (8, dict()),
    "qwen3-8b": (16, dict(tp=2)),
    "qwen2.5-72b": (64, dict(tp=8, pp=4)),
    "mixtral-8x7b": (32, dict(tp=2, ep=8)),
    "mixtral-8x22b": (64, dict(tp=4, pp=4, ep=4)),
    "qwen3-30b-a3b": (32, dict(tp=2, ep=8)),
    "qwen3-235b-a22b": (128, dict(tp=4, pp=2, ep=16)),
    "moonlight-16b-a3b": (16, dict(tp=2, ep=8)),
    "deepseek-v3": (256, dict(pp=8, ep=32, recompute="full")),  # 61 layers: uneven
    "kimi-k2": (512, dict(pp=16, ep=32, recompute="full")),
    "glm-4.5": (256, dict(tp=2, pp=8, ep=16, recompute="full")),
    "gpt-oss-20b": (16, dict(ep=8)),
    "gpt-oss-120b": (64, dict(tp=2, etp=1, ep=32)),  # biased experts: whole on each rank (expert_bias_rules)
    "llama4-maverick": (128, dict(tp=4, pp=2, ep=16)),
}
# preset -> (GPUs, plan, the reason autotune names): Megatron-core's GPT model cannot build the preset.
REFUSED = {
    "bloom-176b": (112, dict(tp=8, pp=7), r" uses ALiBi, which Megatron's GPT model does not implement"),
    "gemma3-27b": (16, dict(tp=4, pp=2), r" has 4 norm\(s\) per layer .*sandwich"),
    "gpt-neox-20b": (32, dict(tp=2, pp=4), r" runs attention and MLP side by side .*parallel residual"),
    "opt-175b": (128, dict(tp=8, pp=8), r"'s MLP is ReLU .* not ReLU"),
    "llama4-scout": (32, dict(tp=2, ep=8), r" scales RoPE as llama3 with low / high frequency factors 1 / 1"),
}
# (id, preset, GPUs, plan autotune refuses, the reason, (old, new) edit of the file of the plan it accepts): the
# edited file is what the refused plan would write, and megatron-core must refuse it with its own words.
REFUSED_PLANS = [
    ("gpt-oss-120b-experts-split-tp", "gpt-oss-120b", 64, dict(tp=2, ep=32), "Bias in Moe is only supported when "
     "ETP==1", ("--expert-tensor-parallel-size 1\n", "")),
]


def _plan(name: str, gpus: int, kw: dict):
    m, c = load_model_preset(name), load_cluster(gpu=GPU, num_gpus=gpus)
    seq = min(4096, m.max_position_embeddings // 256 * 256)  # learned position tables: within their length
    return m, c, make_plan(m, c, engine="megatron", zero_stage=1, global_batch_size=4 * gpus, seq_len=seq, **kw)


def _args_file(name: str, gpus: int, kw: dict) -> str:
    m, c, plan = _plan(name, gpus, kw)
    return render_bundle(estimate(m, c, plan)).files["megatron_args.sh"]


def test_every_preset_has_a_case():
    presets = {p.stem for p in PRESETS.glob("*.yaml")}
    assert presets == set(ACCEPTED) | set(REFUSED), presets ^ (set(ACCEPTED) | set(REFUSED))
    assert not set(ACCEPTED) & set(REFUSED)


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_plan_fits(name):
    m, c, plan = _plan(name, *ACCEPTED[name])
    assert estimate(m, c, plan).memory.fits, name
    assert (plan.ep > 1) == (m.moe is not None), plan


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_autotune_refuses_what_megatron_core_cannot_build(name):
    gpus, kw, reason = REFUSED[name]
    with pytest.raises(InputError, match=f"Megatron-LM: {name}" + reason):
        _plan(name, gpus, kw)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    jobs = [(gpus, parse_shell_args(_args_file(name, gpus, kw))[0]) for name, (gpus, kw) in ACCEPTED.items()]
    for _, name, _, _, _, (old, new) in REFUSED_PLANS:  # the accepted plan's file, edited
        text = _args_file(name, *ACCEPTED[name])
        assert old in text, text
        jobs.append((ACCEPTED[name][0], parse_shell_args(text.replace(old, new))[0]))
    lines = core_verdicts(tmp_path_factory.mktemp("core019presets"), jobs)
    return dict(zip(list(ACCEPTED) + [c[0] for c in REFUSED_PLANS], lines))


def _padded(vocab: int, tp: int) -> int:
    """megatron/core/tokenizers/utils/build_tokenizer.py vocab_size_with_padding: a multiple of 128 x tp."""
    return -(-vocab // (128 * tp)) * 128 * tp


def _window_layers(config: dict) -> list[int]:
    """The layers megatron-core gives a window (core/transformer/utils.py:495-511 is_layer_window_attention,
    layer numbers from 1)."""
    skip, layers = config["window_attn_skip_freq"], range(config["num_layers"])
    if not config["window_size"]:
        return []
    if skip is None:
        return list(layers)
    return [i for i in layers if ((i + 1) % skip != 0 if isinstance(skip, int) else skip[i])]


def _moe_layers(config: dict) -> list[int]:
    """The layers megatron-core builds as MoE (core/models/gpt/gpt_layer_specs.py:643-660)."""
    freq, n = config["moe_layer_freq"], config["num_layers"]
    return [i for i in range(n) if (i % freq == 0 if isinstance(freq, int) else freq[i])]


@pytest.mark.slow  # one process of megatron-core imports (~15 s)
@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_megatron_core_builds_the_preset(verdicts, name):
    got = verdicts[name]
    assert got["ok"], got
    m, _, plan = _plan(name, *ACCEPTED[name])
    config, args = got["config"], got["args"]
    assert (config["num_layers"], config["hidden_size"], config["num_attention_heads"]) == (
        m.num_layers, m.hidden_size, m.num_attention_heads)
    assert config["ffn_hidden_size"] == m.ffn_hidden_size
    assert config["num_query_groups"] == m.kv_heads
    assert config["multi_latent_attention"] == (m.mla is not None)
    if m.mla is None:
        assert config["kv_channels"] == m.attention_head_dim
    # the embedding megatron-core builds: the vocabulary padded to 128 x tp (NullTokenizer of --vocab-size)
    assert args["padded_vocab_size"] == _padded(m.vocab_size, plan.tp) >= m.vocab_size
    assert got["vocab_size"] == m.vocab_size  # the NullTokenizer's (test_null_tokenizer_holds_the_vocabulary)
    assert args["untie_embeddings_and_output_weights"] == (not m.tied_embeddings)
    assert args["position_embedding_type"] == megatron_position_type(m)
    if m.position_embedding == "rope":
        assert args["rotary_base"] == m.rope_theta and args["rotary_percent"] == m.rotary_fraction
        assert args["use_rope_scaling"] == (m.rope_scaling == "llama3")  # Llama 3.1's, factors 1 / 4 / 8192
        if m.rope_scaling in ("llama3", "yarn"):
            assert args["rope_scaling_factor" if m.rope_scaling == "llama3" else "rotary_scaling_factor"] == (
                m.rope_scaling_factor)
    assert config["normalization"] == {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[m.norm]
    assert config["gated_linear_unit"] == (m.activation in ("swiglu", "geglu"))
    assert config["add_bias_linear"] == m.linear_bias
    assert config["qk_layernorm"] == (m.qk_norm is not None)
    assert config["softmax_type"] == ("learnable" if m.attention_sinks else "vanilla")
    assert config["activation_func_clamp_value"] == m.activation_clamp
    # Llama 4's chunks: a sequence within one chunk is plain causal attention (megatron_attention)
    local = m.sliding_window is not None and not (m.chunked_attention and plan.seq_len <= m.sliding_window)
    windowed = list(m.sliding_window_layers or range(m.num_layers)) if local else []
    assert _window_layers(config) == windowed
    if windowed:  # (left, right): the token itself and window - 1 before it (megatron_attention)
        assert config["window_size"] == [m.sliding_window - 1, 0]
    if m.moe is None:
        assert config["num_moe_experts"] is None
        return
    moe = m.moe
    assert (config["num_moe_experts"], config["moe_router_topk"]) == (moe.num_experts, moe.top_k)
    assert config["moe_ffn_hidden_size"] == moe.expert_ffn_hidden_size
    assert config["moe_shared_expert_intermediate_size"] == (moe.num_shared_experts * moe.shared_width or None)
    assert _moe_layers(config) == [i for i in range(m.num_layers) if m.is_moe_layer(i)]


@pytest.mark.slow
def test_null_tokenizer_holds_the_vocabulary(verdicts):
    """megatron-core 0.16-0.19's NullTokenizer (core/tokenizers/text/libraries/null_tokenizer.py:16-19,
    build_tokenizer.py:88-103) holds exactly --vocab-size, its EOD the last id: the file writes the model's."""
    wrong = {name: (verdicts[name]["vocab_size"], load_model_preset(name).vocab_size) for name in ACCEPTED
             if verdicts[name]["vocab_size"] != load_model_preset(name).vocab_size}
    assert not wrong, wrong


@pytest.mark.parametrize("case", [c[0] for c in REFUSED_PLANS])
def test_autotune_refuses_the_plan(case):
    _, name, gpus, kw, words, _ = next(c for c in REFUSED_PLANS if c[0] == case)
    with pytest.raises(InputError, match=words):
        _plan(name, gpus, kw)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c[0] for c in REFUSED_PLANS])
def test_megatron_core_refuses_the_plan(verdicts, case):
    words = next(c for c in REFUSED_PLANS if c[0] == case)[4]
    got = verdicts[case]
    assert not got["ok"] and got["stage"] == "TransformerConfig" and words in got["error"], got
