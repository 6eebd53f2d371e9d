"""The built-in model (autotune.workloads.transformer) computes what transformers' own model of the same architecture
computes: the weights of a small transformers model copied in, the same logits and loss. Q/K norms per head (Qwen3),
over the whole width with the norms after each sublayer (OLMo 2), and Llama 4's weightless Q/K norm on its rotary
layers, with its global layers left without RoPE."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from autotune.specs.loading import load_model
from autotune.specs.model import ModelSpec
from autotune.workloads.transformer import build_model

SEQ = 32
FIXTURES = "tests/fixtures/hf"


def _batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (2, SEQ), generator=g), torch.randint(0, vocab, (2, SEQ), generator=g)


def _copy_llama_like(ours, theirs, *, interleaved_rope: bool, mlp: str) -> None:
    """transformers' weights into the built-in model. ``interleaved_rope``: transformers rotates (2i, 2i+1) pairs
    (Llama 4's complex RoPE) and the built-in model (i, i + d/2) ones, so Q and K rows are reordered per head (the
    permutation Meta's and Hugging Face's conversion scripts apply)."""
    spec = ours.spec
    d = spec.attention_head_dim
    order = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])

    def rows(w: torch.Tensor, heads: int) -> torch.Tensor:
        return w.view(heads, d, -1)[:, order].reshape(heads * d, -1) if interleaved_rope else w

    with torch.no_grad():
        ours.embed.weight.copy_(theirs.model.embed_tokens.weight)
        ours.final_norm.weight.copy_(theirs.model.norm.weight)
        ours.output.weight.copy_(theirs.lm_head.weight)
        for mine, layer in zip(ours.layers, theirs.model.layers):
            a = layer.self_attn
            if spec.post_norm:  # OLMo 2: the norms on the sublayers' outputs
                mine.norm1.weight.copy_(layer.post_attention_layernorm.weight)
                mine.norm2.weight.copy_(layer.post_feedforward_layernorm.weight)
            else:
                mine.norm1.weight.copy_(layer.input_layernorm.weight)
                mine.norm2.weight.copy_(layer.post_attention_layernorm.weight)
            mine.attn.q.weight.copy_(rows(a.q_proj.weight, spec.num_attention_heads))
            mine.attn.k.weight.copy_(rows(a.k_proj.weight, spec.kv_heads))
            mine.attn.v.weight.copy_(a.v_proj.weight)
            mine.attn.o.weight.copy_(a.o_proj.weight)
            if spec.qk_norm in ("head", "full"):
                mine.attn.q_norm.weight.copy_(a.q_norm.weight)
                mine.attn.k_norm.weight.copy_(a.k_norm.weight)
            ffn = getattr(layer, mlp)
            mine.mlp.fc1.weight.copy_(torch.cat([ffn.gate_proj.weight, ffn.up_proj.weight]))
            mine.mlp.fc2.weight.copy_(ffn.down_proj.weight)


def copy_attention(mine, theirs, spec) -> None:
    """A transformers attention's q/k/v/o projections (and per-head Q/K norms) into the built-in one, rows as they
    are (no RoPE reordering)."""
    with torch.no_grad():
        for name in ("q", "k", "v", "o"):
            getattr(mine, name).weight.copy_(getattr(theirs, f"{name}_proj").weight)
        if spec.qk_norm == "head":
            mine.q_norm.weight.copy_(theirs.q_norm.weight)
            mine.k_norm.weight.copy_(theirs.k_norm.weight)


def _same_loss(ours, theirs) -> None:
    ids, labels = _batch(ours.spec.vocab_size)
    with torch.no_grad():
        logits = theirs(input_ids=ids).logits
        expected = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))
        got = ours(ids, labels)
    assert got.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-5)
    # and the weights matter: another norm or no RoPE on a layer moves the loss far more than that
    assert abs(expected.item() - F.cross_entropy(torch.zeros_like(logits).view(-1, logits.shape[-1]),
                                                 labels.reshape(-1)).item()) > 1e-3


def _another_loss(ours, changed: ModelSpec, flash: bool = True) -> None:
    """The built-in model of ``changed`` (the spec without one of the features), given ``ours``'s weights, computes
    another loss: the feature is in the model, not a no-op the comparison could not see."""
    other = build_model(changed, seq_len=SEQ, dtype=torch.float32, flash_attention=flash).eval()
    other.load_state_dict(ours.state_dict())
    ids, labels = _batch(ours.spec.vocab_size)
    with torch.no_grad():
        assert abs(other(ids, labels).item() - ours(ids, labels).item()) > 1e-4


def test_qwen3_per_head_qk_norm_matches_transformers() -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    spec = ModelSpec(name="qwen3-like", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                     head_dim=32, ffn_hidden_size=96, vocab_size=128, position_embedding="rope", activation="swiglu",
                     norm="rmsnorm", rope_theta=1_000_000.0, qk_norm="head")
    torch.manual_seed(0)
    theirs = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5, rope_theta=1_000_000.0, tie_word_embeddings=False,
        attn_implementation="eager")).eval()
    with torch.no_grad():  # norms away from 1, so that a missing norm would show
        for layer in theirs.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    ours = build_model(spec, seq_len=SEQ, dtype=torch.float32).eval()
    assert sum(p.numel() for p in ours.parameters()) == spec.num_params == sum(p.numel() for p in theirs.parameters())
    _copy_llama_like(ours, theirs, interleaved_rope=False, mlp="mlp")
    _same_loss(ours, theirs)


def test_olmo2_post_norms_and_whole_width_qk_norm_match_transformers() -> None:
    from transformers import Olmo2Config, Olmo2ForCausalLM

    spec = load_model(f"{FIXTURES}/olmo2-13b/config.json")
    assert spec.post_norm and spec.qk_norm == "full"
    spec = replace(spec, name="olmo2-like", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=4,
                   ffn_hidden_size=96, vocab_size=128)
    torch.manual_seed(0)
    theirs = Olmo2ForCausalLM(Olmo2Config(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, rms_norm_eps=spec.norm_eps, rope_theta=spec.rope_theta, tie_word_embeddings=False,
        attn_implementation="eager")).eval()
    with torch.no_grad():  # norms away from 1, so that a norm in the wrong place would show
        for name, p in theirs.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    ours = build_model(spec, seq_len=SEQ, dtype=torch.float32).eval()
    assert sum(p.numel() for p in ours.parameters()) == spec.num_params == sum(p.numel() for p in theirs.parameters())
    _copy_llama_like(ours, theirs, interleaved_rope=False, mlp="mlp")
    _same_loss(ours, theirs)
    _another_loss(ours, replace(spec, post_norm=False))


@pytest.mark.parametrize("flash", [True, False])
def test_llama4_l2_qk_norm_and_global_layers_without_rope_match_transformers(flash: bool) -> None:
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    # A dense Llama 4 (moe_layers empty): layers 0-2 chunked with RoPE and the L2 norm, layer 3 global without
    # either. The chunk (8192) is longer than the sequence, so every layer is causal over it, as the built-in
    # trainers run it (builtin_trainer.window_problem refuses longer sequences).
    cfg = Llama4TextConfig(vocab_size=128, hidden_size=64, intermediate_size=96, intermediate_size_mlp=96,
                           num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                           rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=None, moe_layers=[],
                           use_qk_norm=True, no_rope_layer_interval=4, attention_chunk_size=8192,
                           tie_word_embeddings=False, attn_implementation="eager")
    spec = ModelSpec(name="llama4-dense-like", num_layers=4, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                     head_dim=16, ffn_hidden_size=96, vocab_size=128, position_embedding="rope",
                     activation="swiglu", norm="rmsnorm", rope_theta=500000.0, qk_norm="l2", sliding_window=8192,
                     sliding_window_layers=(0, 1, 2), chunked_attention=True)
    assert [spec.is_rotary_layer(i) for i in range(4)] == [bool(x) for x in cfg.no_rope_layers] == [1, 1, 1, 0]
    torch.manual_seed(0)
    theirs = Llama4ForCausalLM(cfg).eval()
    ours = build_model(spec, seq_len=SEQ, dtype=torch.float32, flash_attention=flash).eval()
    assert sum(p.numel() for p in ours.parameters()) == spec.num_params == sum(p.numel() for p in theirs.parameters())
    _copy_llama_like(ours, theirs, interleaved_rope=True, mlp="feed_forward")
    _same_loss(ours, theirs)
    # without the global layer's exemption from RoPE, or without the norm, the loss is another one
    _another_loss(ours, replace(spec, chunked_attention=False, sliding_window=None, sliding_window_layers=None), flash)
    _another_loss(ours, replace(spec, qk_norm=None), flash)


@pytest.mark.parametrize("act, form", [("gelu", "gelu"), ("gelu_fast", "gelu_tanh")])
def test_gpt_neox_parallel_residual_and_partial_rope_match_transformers(tmp_path, act, form) -> None:
    """GPT-NeoX: attention and MLP side by side, each with its own LayerNorm; RoPE on the first quarter of each
    head; biases everywhere; the fused QKV stored per head as [q | k | v]; its GeLU exact ("gelu") or in the tanh
    form (NeoX-20B's "gelu_fast"), and the other form gives another loss."""
    import json

    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=256, rotary_pct=0.25, hidden_act=act, layer_norm_eps=1e-5,
                           use_parallel_residual=True, tie_word_embeddings=False, attn_implementation="eager")
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    spec = load_model(str(tmp_path / "config.json"))
    assert spec.parallel_residual and spec.rotary_fraction == 0.25 and spec.rotary_dim == 4
    assert spec.activation == form
    torch.manual_seed(0)
    theirs = GPTNeoXForCausalLM(config).eval()
    with torch.no_grad():  # norms and biases away from their initial 1 and 0
        for name, p in theirs.named_parameters():
            if p.dim() == 1:
                p.uniform_(-0.5, 0.5) if name.endswith("bias") else p.uniform_(0.5, 1.5)
    ours = build_model(spec, seq_len=SEQ, dtype=torch.float32).eval()
    assert sum(p.numel() for p in ours.parameters()) == spec.num_params == sum(p.numel() for p in theirs.parameters())
    heads, d, h = 4, 16, 64
    with torch.no_grad():
        ours.embed.weight.copy_(theirs.gpt_neox.embed_in.weight)
        ours.final_norm.weight.copy_(theirs.gpt_neox.final_layer_norm.weight)
        ours.final_norm.bias.copy_(theirs.gpt_neox.final_layer_norm.bias)
        ours.output.weight.copy_(theirs.lm_head.weight)
        for mine, layer in zip(ours.layers, theirs.gpt_neox.layers):
            for our_norm, their_norm in ((mine.norm1, layer.input_layernorm),
                                         (mine.norm2, layer.post_attention_layernorm)):
                our_norm.weight.copy_(their_norm.weight)
                our_norm.bias.copy_(their_norm.bias)
            qkv = layer.attention.query_key_value
            w, b = qkv.weight.view(heads, 3, d, h), qkv.bias.view(heads, 3, d)
            for j, name in enumerate("qkv"):
                getattr(mine.attn, name).weight.copy_(w[:, j].reshape(heads * d, h))
                getattr(mine.attn, name).bias.copy_(b[:, j].reshape(heads * d))
            mine.attn.o.weight.copy_(layer.attention.dense.weight)
            mine.attn.o.bias.copy_(layer.attention.dense.bias)
            mine.mlp.fc1.weight.copy_(layer.mlp.dense_h_to_4h.weight)
            mine.mlp.fc1.bias.copy_(layer.mlp.dense_h_to_4h.bias)
            mine.mlp.fc2.weight.copy_(layer.mlp.dense_4h_to_h.weight)
            mine.mlp.fc2.bias.copy_(layer.mlp.dense_4h_to_h.bias)
    _same_loss(ours, theirs)
    _another_loss(ours, replace(spec, parallel_residual=False))
    # the two GeLU forms differ by under 5e-4, below what the loss shows: the MLPs themselves
    x = torch.randn(2, SEQ, 64) * 3
    with torch.no_grad():
        theirs_mlp = theirs.gpt_neox.layers[0].mlp(x)
        assert torch.allclose(ours.layers[0].mlp(x), theirs_mlp, atol=1e-6)
        other = build_model(replace(spec, activation="gelu_tanh" if form == "gelu" else "gelu"), seq_len=SEQ,
                            dtype=torch.float32)
        other.load_state_dict(ours.state_dict())
        assert (other.layers[0].mlp(x) - theirs_mlp).abs().max() > 2e-5


def test_opt_relu_mlp_matches_transformers(tmp_path) -> None:
    """OPT: a ReLU MLP (not GeLU), learned positions offset by 2 rows, biases, tied embeddings."""
    import json

    from transformers import OPTConfig, OPTForCausalLM

    config = OPTConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, ffn_dim=256, num_attention_heads=4,
                       max_position_embeddings=64, word_embed_proj_dim=64, dropout=0.0, attention_dropout=0.0,
                       attn_implementation="eager")
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    spec = load_model(str(tmp_path / "config.json"))
    assert spec.activation == "relu" and (spec.max_position_embeddings, spec.position_offset) == (64, 2)
    torch.manual_seed(0)
    theirs = OPTForCausalLM(config).eval()
    with torch.no_grad():  # OPT's init (std 0.02) leaves the logits near uniform: larger weights, so the loss tells
        for p in theirs.parameters():
            p.normal_(0.0, 0.3)
    ours = build_model(spec, seq_len=SEQ, dtype=torch.float32).eval()
    assert sum(p.numel() for p in ours.parameters()) == spec.num_params == sum(p.numel() for p in theirs.parameters())
    d = theirs.model.decoder
    with torch.no_grad():
        ours.embed.weight.copy_(d.embed_tokens.weight)
        ours.pos.weight.copy_(d.embed_positions.weight)  # both look up position p at row p + 2
        ours.final_norm.weight.copy_(d.final_layer_norm.weight)
        ours.final_norm.bias.copy_(d.final_layer_norm.bias)
        for mine, layer in zip(ours.layers, d.layers):
            for our_norm, their_norm in ((mine.norm1, layer.self_attn_layer_norm),
                                         (mine.norm2, layer.final_layer_norm)):
                our_norm.weight.copy_(their_norm.weight)
                our_norm.bias.copy_(their_norm.bias)
            for ours_name, theirs_name in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "out_proj")):
                getattr(mine.attn, ours_name).weight.copy_(getattr(layer.self_attn, theirs_name).weight)
                getattr(mine.attn, ours_name).bias.copy_(getattr(layer.self_attn, theirs_name).bias)
            for ours_name, theirs_name in (("fc1", "fc1"), ("fc2", "fc2")):
                getattr(mine.mlp, ours_name).weight.copy_(getattr(layer, theirs_name).weight)
                getattr(mine.mlp, ours_name).bias.copy_(getattr(layer, theirs_name).bias)
    _same_loss(ours, theirs)
