"""How an engine runs RoPE on the queries and keys: HBM bytes per element of q and k, forward and backward.

* one fused kernel (Transformer Engine ``fused_apply_rotary_pos_emb``; torch.compile's fusion): read and write each
  element, 4 B forward, the same backward;
* Megatron-core with YaRN: unfused. Megatron-core routes RoPE to TE's fused kernel only with ``mscale == 1.0``
  (megatron/core/models/common/embeddings/rope_utils.py:351-356 at d98e8a64dd: "mscale ... is not supported by
  TE's fused RoPE. Using unfused implementation."), and attention passes YaRN's concentration factor as the mscale
  (megatron/core/transformer/attention.py:326 and :1508-1533; yarn_rotary_pos_embedding.py:275-293:
  0.1 ln(factor) + 1, 1.347 for GPT-OSS's factor 32). Megatron-Bridge turns the fusion off besides for any
  position embedding but plain ``rope`` (src/megatron/bridge/utils/fusions.py:84-92 at 067f987; GPT-OSS's bridge
  sets ``position_embedding_type = "yarn"``, models/gpt_oss/gpt_oss_bridge.py:65). Multi-latent attention keeps
  its own fused YaRN path (multi_latent_attention.py:707), so this is for non-MLA models.

  ``_apply_rotary_pos_emb_bshd`` (rope_utils.py:92-156) on 16-bit tensors, bytes per element of q or k:
  forward ``t * cos`` 4, ``_rotate_half`` (rope_utils.py:73-84) ``-x2`` on half 2 and its ``cat`` 4, ``* sin`` 4,
  the add 6, the closing ``cat((t, t_pass))`` 4: 24; backward (autograd) ``grad * sin`` 4, the negation's on
  half 2, ``chunk``'s gradient assembled 4, ``grad * cos`` 4, the two paths' gradients added 6, and the
  ``t[..., :rot_dim]`` slice's gradient written into a zeroed tensor (zero 2, copy 4): 26. cos / sin
  ([s, 1, 1, d], shared by the heads and the batch) are left out.
"""

from __future__ import annotations

import functools

from autotune.specs.model import ModelSpec

__all__ = ["FUSED_ROPE_BYTES", "UNFUSED_YARN_BYTES", "rope_bytes", "rotary_share"]

FUSED_ROPE_BYTES = (4, 4)
UNFUSED_YARN_BYTES = (24, 26)


def rope_bytes(model: ModelSpec, kernels: str) -> tuple[int, int]:
    """(forward, backward) bytes per element of q and k where the plan's elementwise kernels run ``kernels``:
    "fused" (the engine's fused kernels: Megatron / TE) or "compiled" (torch.compile fuses what it traces). The
    eager engines' op-by-op chains are ``autotune.cost.layer_time.EAGER_BYTES``."""
    if kernels == "fused" and model.rope_scaling == "yarn" and model.mla is None:
        return UNFUSED_YARN_BYTES
    return FUSED_ROPE_BYTES


def rotary_share(model: ModelSpec, moe_layer: bool) -> float:
    """The share of the model's dense (``moe_layer`` False) or MoE layers that run RoPE (``ModelSpec.is_rotary_layer``):
    position-free (NoPE) layers run no rotary kernel (SmolLM3: 27 of 36; EXAONE 4: its 48 sliding-window layers of
    64; Llama 4: its chunked layers, three of four; Megatron-core attention.py ``no_rope_freq``: the layer skips
    ``apply_rotary_pos_emb``). One layer's time stands for each of its kind, so it carries their mean. 0 without
    RoPE; 1 where the model has no layer of that kind."""
    if model.position_embedding != "rope":
        return 0.0
    if model.rope_layers is None and not model.chunked_attention:  # every layer rotates (the search's hot path)
        return 1.0
    return _mixed_share(model, moe_layer)


@functools.lru_cache(maxsize=256)
def _mixed_share(model: ModelSpec, moe_layer: bool) -> float:
    kind = [i for i in range(model.num_layers) if model.is_moe_layer(i) == moe_layer]
    return sum(map(model.is_rotary_layer, kind)) / len(kind) if kind else 1.0
