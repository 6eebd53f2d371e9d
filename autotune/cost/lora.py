"""What LoRA fine-tuning (``ParallelPlan.peft == "lora"``) costs, as Megatron-Bridge runs it.

Bridge (NVIDIA-NeMo/Megatron-Bridge @067f987) freezes every base parameter (peft/base.py:187-190) and wraps each
target linear layer in ``LoRALinear`` (peft/lora_layers.py:80-85): the base GEMM, then ``linear_out(linear_in(x))``
on the same input, added to the base output. For a base layer of input width k and output width n the adapter is
``ParallelLinearAdapter`` (peft/utils.py:1033-1072): ``linear_in`` k -> rank and ``linear_out`` rank -> n, each
sharded over the tensor-parallel ranks (column-parallel ``linear_in`` with its output gathered, or row-parallel
with its input already split; ``linear_out`` column-parallel): rank x (k + n) / tp parameters per GPU, and
2 x tokens x rank x (k + n) / tp forward FLOPs. The adapters are ordinary 16-bit layers (``lora_dtype`` None: the
model's dtype, peft/lora.py:154).

What freezing saves (Transformer Engine @d0067d0): a linear layer whose weight has ``requires_grad`` False skips
its weight-gradient GEMM (pytorch/module/linear.py:712 ``requires_wgrad = weight_requires_grad``, :954; the same
in layernorm_linear.py:539, :946): the backward of a frozen layer is its data-gradient GEMM alone. The frozen
output layer likewise (a plain ``requires_grad`` False weight: autograd computes no gradient for it). The data-
parallel reduction, the distributed optimizer and its states cover the parameters that train (Megatron-core's
DDP builds its gradient buffers over ``param.requires_grad`` parameters only): the adapters.
"""

from __future__ import annotations

from autotune.specs.lora import lora_run, target_widths
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["adapter_forward_s"]


def adapter_forward_s(model: ModelSpec, plan: ParallelPlan, bf16_s, hbm: float) -> float:
    """Forward seconds of one layer's adapters for one micro-batch on one GPU: per target the two thin 16-bit GEMMs
    (``bf16_s(flops, m, k, n)``, the GEMM-shape rate) or, where slower, their HBM traffic (the input read, the
    rank-wide intermediate written and read, the output written), and the add into the base output (read both,
    write one). The backward runs each GEMM's data- and weight-gradient GEMM: twice the GEMMs
    (``autotune.cost.layer_time.layer_passes``)."""
    run = lora_run(plan)
    if run is None:
        return 0.0
    t, r = plan.tp, run.rank
    tokens = plan.seq_len * plan.micro_batch_size / plan.cp
    total = 0.0
    for k, n in target_widths(model, run.targets):
        a = bf16_s(2 * tokens * k * r / t, tokens, k, r / t if r >= t else r)
        b = bf16_s(2 * tokens * r * n / t, tokens, r, n / t)
        traffic = 2 * tokens * (k + 2 * r + n / t) / hbm
        total += max(a + b, traffic) + 2 * tokens * 3 * n / t / hbm
    return total



def saved_input_change(model: ModelSpec, plan: ParallelPlan, tokens: float, t_in: int, lin: float) -> tuple[float, float]:
    """(attention block, MLP) change of one dense layer's saved bytes under LoRA, against full training's ledger
    (``autotune.cost.activations.layer_activations``, which saves each linear input at ``lin`` bytes per element).
    A frozen Transformer Engine linear saves no input: it has no weight gradient to compute (pytorch/module/
    linear.py:619-621 ``saved_inputmat`` only when ``backward_needs_input``; layernorm_linear.py:502 the norm output
    only when ``weight.requires_grad``). An adapted layer's adapter saves that input in 16 bits instead (its
    ``linear_in`` weight gradient needs it; the model's dtype, peft/lora.py:154) and its rank-wide intermediate
    (``linear_out``'s input). The output projection's input is the attention output the fused kernel keeps anyway:
    only its FP8 cast goes."""
    run = lora_run(plan)
    if run is None:
        return 0.0, 0.0
    h, f, t = model.hidden_size, model.ffn_hidden_size, plan.tp
    kept = {name: (2.0 if name in run.targets else 0.0) for name in ("linear_qkv", "linear_fc1", "linear_fc2")}
    attn = (kept["linear_qkv"] - lin) * tokens * h / t_in
    if lin != 2:
        attn -= lin * tokens * model.attention_output_width / t
    mlp = (kept["linear_fc1"] - lin) * tokens * h / t_in + (kept["linear_fc2"] - lin) * tokens * f / t
    attn += 2 * tokens * run.rank * sum(name in run.targets for name in ("linear_qkv", "linear_proj"))
    mlp += 2 * tokens * run.rank * sum(name in run.targets for name in ("linear_fc1", "linear_fc2"))
    return attn, mlp
