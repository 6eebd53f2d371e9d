"""The built-in model's MoE load-balancing loss (autotune.workloads.moe_balancing), against transformers' own loss
function and against the gradient of the loss added to the main loss.

transformers' ``load_balancing_loss_func`` (Mixtral, Qwen3-MoE) computes E * sum_i (count_i / T) * P_i: the same
Switch loss as Megatron-core's without the 1/k, so k times ours at weight 1. A sigmoid router's loss is the same
function of the normalised sigmoid scores, which transformers' function reproduces from their logarithms (its
softmax of log p is p)."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from autotune.specs.model import MoESpec  # noqa: E402
from autotune.specs.loading import load_model  # noqa: E402
from autotune.workloads.moe_balancing import balancing_loss, backward_scale, set_backward_scale  # noqa: E402
from autotune.workloads.transformer import MoE  # noqa: E402

E, K = 8, 2


def _hf_loss(logits: torch.Tensor) -> float:
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    return float(load_balancing_loss_func((logits,), num_experts=E, top_k=K))


def _logits(tokens: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, E, generator=g) * 2


@pytest.mark.parametrize("coeff", [1.0, 0.02])
def test_softmax_router_loss_is_transformers_over_k(coeff):
    logits = _logits(96)
    ours = balancing_loss(logits, MoESpec(num_experts=E, top_k=K, expert_ffn_hidden_size=8, aux_loss_coeff=coeff), 96)
    assert float(ours) == pytest.approx(coeff * _hf_loss(logits) / K, rel=1e-5)


def test_sigmoid_router_loss_is_the_same_function_of_the_normalised_scores():
    logits = _logits(64, seed=1)
    moe = MoESpec(num_experts=E, top_k=K, expert_ffn_hidden_size=8, router_score="sigmoid", aux_loss_coeff=1.0)
    scores = torch.sigmoid(logits)
    normalised = scores / scores.sum(-1, keepdim=True)
    assert float(balancing_loss(logits, moe, 64)) == pytest.approx(_hf_loss(normalised.log()) / K, rel=1e-5)
    # not the softmax of the raw logits: a sigmoid router normalises its own scores
    assert float(balancing_loss(logits, moe, 64)) != pytest.approx(_hf_loss(logits) / K, rel=1e-3)


def test_per_sequence_loss_is_the_mean_of_each_sequences_loss():
    """DeepSeek-V3's sequence-wise loss (Megatron's seq_aux_loss): each sequence's own f and P, then the mean."""
    logits = _logits(3 * 32, seed=2)
    moe = MoESpec(num_experts=E, top_k=K, expert_ffn_hidden_size=8, aux_loss_coeff=0.5, aux_loss_per_sequence=True)
    expected = sum(0.5 * _hf_loss(part) / K for part in logits.split(32)) / 3
    assert float(balancing_loss(logits, moe, 32)) == pytest.approx(expected, rel=1e-5)
    whole = balancing_loss(logits, replace(moe, aux_loss_per_sequence=False), 32)
    assert float(whole) != pytest.approx(expected, rel=1e-3)


def test_no_weight_no_loss():
    assert balancing_loss(_logits(8), MoESpec(num_experts=E, top_k=K, expert_ffn_hidden_size=8), 8) is None


def _layer(coeff: float | None):
    spec = load_model("tiny-llama")
    spec = replace(spec, moe=MoESpec(num_experts=E, top_k=K, expert_ffn_hidden_size=32, aux_loss_coeff=coeff))
    torch.manual_seed(0)
    return MoE(spec)


@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_the_routers_gradient_is_that_of_the_loss_added_to_the_main_loss(scale):
    """Backward of (scale x main loss) alone gives the router the gradient of scale x (main + balancing loss): the
    balancing loss joins with the trainer's factor, on the layer, without being added to the loss."""
    layer = _layer(0.3)
    x = torch.randn(2, 16, layer.router.in_features, generator=torch.Generator().manual_seed(3))
    previous = backward_scale()
    try:
        set_backward_scale(scale)
        layer.train()
        (scale * layer(x).square().mean()).backward()
    finally:
        set_backward_scale(previous)
    attached = layer.router.weight.grad.clone()
    layer.zero_grad()
    layer.eval()  # no balancing loss attached: it is added to the main loss by hand
    aux = balancing_loss(layer.router(x.reshape(-1, x.shape[-1])), layer.moe, 16)
    (scale * (layer(x).square().mean() + aux)).backward()
    assert torch.allclose(attached, layer.router.weight.grad, rtol=1e-5, atol=1e-8)
    layer.zero_grad()
    layer(x).square().mean().backward()  # without the balancing loss the router's gradient differs
    assert not torch.allclose(attached / scale, layer.router.weight.grad, rtol=1e-3)


def test_the_loss_is_attached_in_training_only_and_with_a_weight():
    x = torch.randn(1, 8, 256)
    for coeff, mode, attached in ((0.3, "train", True), (0.3, "eval", False), (None, "train", False)):
        layer = _layer(coeff)
        getattr(layer, mode)()
        assert (type(layer(x).grad_fn).__name__ == "AttachBalancingLossBackward") is attached, (coeff, mode)
    with torch.no_grad():
        assert layer(x).grad_fn is None
