"""The real transformer: exact parameter counts, a finite loss, working backward, and recompute
modes that give the same gradients as no recompute."""

from __future__ import annotations

import math

import pytest
import torch

from autotune.specs.model import MLASpec, ModelSpec, MoESpec
from autotune.workloads.transformer import _rope_tables, apply_rope, build_model, rms_norm, swiglu

SEQ_WINDOW = 8192  # Llama 4's chunk: longer than the sequences here, so causal attention over them
GPT = ModelSpec(name="gpt-like", num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=256,
                vocab_size=128, position_embedding="learned", max_position_embeddings=64, activation="gelu",
                norm="layernorm", linear_bias=True, tied_embeddings=True)
LLAMA = ModelSpec(name="llama-like", num_layers=2, hidden_size=64, num_attention_heads=8, num_kv_heads=2,
                  ffn_hidden_size=176, vocab_size=128, position_embedding="rope", activation="swiglu", norm="rmsnorm",
                  tied_embeddings=False)
MIXTRAL = ModelSpec(name="mixtral-like", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                    ffn_hidden_size=176, vocab_size=128, position_embedding="rope", activation="swiglu", norm="rmsnorm",
                    moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=176))
DEEPSEEK_LIKE = ModelSpec(name="moe-shared", num_layers=3, hidden_size=64, num_attention_heads=4, ffn_hidden_size=176,
                          vocab_size=128, qkv_bias=True, position_embedding="rope", activation="swiglu", norm="rmsnorm",
                          embedding_norm=True,
                          moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=48, num_shared_experts=2,
                                      num_dense_layers=1, router_bias=True, router_score="sigmoid"))
FALCON_LIKE = ModelSpec(name="falcon-like", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=1,
                        ffn_hidden_size=256, vocab_size=128, position_embedding="rope", norms_per_layer=1, head_dim=24)
QWEN3_LIKE = ModelSpec(name="qwen3-like", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                       head_dim=32, ffn_hidden_size=96, vocab_size=128, position_embedding="rope", activation="swiglu",
                       norm="rmsnorm", qk_norm="head")
OLMO2_LIKE = ModelSpec(name="olmo2-like", num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=96,
                       vocab_size=128, position_embedding="rope", activation="swiglu", norm="rmsnorm", qk_norm="full",
                       post_norm=True)
LLAMA4_LIKE = ModelSpec(name="llama4-like", num_layers=4, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                        ffn_hidden_size=96, vocab_size=128, position_embedding="rope", activation="swiglu",
                        norm="rmsnorm", qk_norm="l2", sliding_window=SEQ_WINDOW, sliding_window_layers=(0, 1, 2),
                        chunked_attention=True,
                        moe=MoESpec(num_experts=4, top_k=1, expert_ffn_hidden_size=48, num_shared_experts=1,
                                    moe_layer_step=2, router_score="sigmoid"))
LLAMA_BIASED = ModelSpec(name="llama-attention-bias", num_layers=2, hidden_size=64, num_attention_heads=8,
                         num_kv_heads=2, ffn_hidden_size=176, vocab_size=128, position_embedding="rope",
                         activation="swiglu", norm="rmsnorm", qkv_bias=True, attention_output_bias=True)
OPT_LIKE = ModelSpec(name="opt-like", num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=256,
                     vocab_size=128, position_embedding="learned", max_position_embeddings=32, position_offset=2,
                     activation="relu", norm="layernorm", linear_bias=True, tied_embeddings=True)  # 2 + 32 rows
SPECS = [GPT, LLAMA, MIXTRAL, DEEPSEEK_LIKE, FALCON_LIKE, QWEN3_LIKE, OLMO2_LIKE, LLAMA4_LIKE, LLAMA_BIASED, OPT_LIKE]
SEQ = 32


def _batch(spec: ModelSpec, b: int = 2, s: int = SEQ) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, spec.vocab_size, (b, s), generator=g),
            torch.randint(0, spec.vocab_size, (b, s), generator=g))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@pytest.mark.parametrize("flash", [True, False])
def test_parameter_count_equals_spec(spec: ModelSpec, flash: bool) -> None:
    model = build_model(spec, seq_len=SEQ, flash_attention=flash)
    assert sum(p.numel() for p in model.parameters()) == spec.num_params


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_loss_is_finite_and_backward_reaches_every_trainable_parameter(spec: ModelSpec) -> None:
    model = build_model(spec, seq_len=SEQ)
    ids, labels = _batch(spec)
    loss = model(ids, labels)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert abs(loss.item() - math.log(spec.vocab_size)) < 0.5  # near-uniform at init
    loss.backward()
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad.float()).all(), name


def _grads(spec: ModelSpec, recompute: str, flash: bool) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = build_model(spec, seq_len=SEQ, recompute=recompute, flash_attention=flash)
    ids, labels = _batch(spec)
    model(ids, labels).backward()
    return {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("spec", [GPT, LLAMA, MIXTRAL], ids=lambda s: s.name)
@pytest.mark.parametrize("flash", [True, False])
def test_recompute_gives_the_same_gradients(spec: ModelSpec, flash: bool) -> None:
    ref = _grads(spec, "none", flash)
    for mode in ("selective", "full"):
        got = _grads(spec, mode, flash)
        assert got.keys() == ref.keys()
        for name in ref:
            # bf16: recompute replays the same kernels, so differences stay at rounding level
            torch.testing.assert_close(got[name], ref[name], rtol=2e-2, atol=1e-3, msg=f"{mode} {name}")


def test_flash_and_unfused_attention_agree() -> None:
    spec = LLAMA
    torch.manual_seed(0)
    a = build_model(spec, seq_len=SEQ, flash_attention=True, dtype=torch.float32)
    b = build_model(spec, seq_len=SEQ, flash_attention=False, dtype=torch.float32)
    b.load_state_dict(a.state_dict())
    ids, labels = _batch(spec)
    torch.testing.assert_close(a(ids, labels), b(ids, labels), rtol=1e-5, atol=1e-5)


def test_custom_kernels_match_autograd() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: rms_norm(x, w), (x, w))
    assert torch.autograd.gradcheck(swiglu, (torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True),))
    cos, sin = _rope_tables(5, 8)
    x3 = torch.randn(2, 5, 3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: apply_rope(x, cos.double(), sin.double()), (x3,))


def test_mla_is_not_implemented() -> None:
    spec = ModelSpec(name="mla", num_layers=1, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128,
                     vocab_size=128, position_embedding="rope",
                     mla=MLASpec(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8))
    with pytest.raises(NotImplementedError, match="MLA"):
        build_model(spec, seq_len=SEQ)


def test_moe_layer_matches_a_per_token_loop() -> None:
    from autotune.workloads.transformer import MoE

    torch.manual_seed(0)
    moe = MoE(DEEPSEEK_LIKE).double()
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.1)
    moe.router_bias.requires_grad_(False)
    x = torch.randn(2, 5, DEEPSEEK_LIKE.hidden_size, dtype=torch.float64)
    got = moe(x)
    t = x.reshape(-1, x.shape[-1])
    scores = torch.sigmoid(moe.router(t))  # DeepSeek-V3: the bias moves the choice, the weights are the scores'
    idx = (scores + moe.router_bias).topk(moe.top_k, dim=-1).indices
    want = torch.zeros_like(t)
    for i in range(t.shape[0]):
        w = scores[i, idx[i]] / scores[i, idx[i]].sum()
        for j in range(moe.top_k):
            want[i] += w[j] * moe.experts[int(idx[i, j])](t[i:i + 1])[0]
        for shared in moe.shared:
            want[i] += shared(t[i:i + 1])[0]
    torch.testing.assert_close(got.reshape(-1, x.shape[-1]), want)
