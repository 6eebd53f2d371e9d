"""The MoE load-balancing loss of the hf engine's transformers models, weighted as the checkpoint states it.

- Mixtral / Qwen3-MoE: transformers' classes add ``router_aux_loss_coef`` x their ``load_balancing_loss_func`` to
  the loss themselves (``output_router_logits`` on: :func:`autotune.train.hf_models._moe_fields`).
- DeepSeek-V3, Kimi-K2, Moonlight, GLM-4.5 (``DeepseekV3ForCausalLM``, ``Glm4MoeForCausalLM``): transformers 5.25
  computes none. :func:`extra_balancing_loss` adds the checkpoint's loss as Megatron-core computes it
  (:mod:`autotune.workloads.moe_balancing`: per MoE layer, per sequence for DeepSeek's ``seq_aux``, summed over
  the layers) from the router logits the model returns.

The HF ``Trainer`` normalises the loss of a model that takes loss kwargs by the token count of the whole
accumulated batch (``num_items_in_batch``, over every rank with ``average_tokens_across_devices``, then multiplies
it by the processes) and then no longer divides it by the accumulation steps (transformers 5.25 trainer.py
``compute_loss`` and ``training_step``, lines 2243-2251 and 2146-2155). A balancing loss added per micro-batch
as it is would weigh accumulation steps x its weight (ms-swift issue #5627 saw it: they scale it by the
micro-batch's share of the tokens). :func:`balanced_trainer` scales it so: the micro-batch's share of the tokens,
times the Trainer's factor, which makes the update average it over the micro-batches and ranks as the cross
entropy is. The ``--accelerate`` driver's loss is each micro-batch's mean and DeepSpeed divides it by the
accumulation steps: the terms are added as they are there.
"""

from __future__ import annotations

from autotune.engines.builtin_trainer import HF_OWN_BALANCING, hf_model_family

__all__ = ["extra_balancing_loss", "model_balancing_loss", "balanced_trainer"]


def extra_balancing_loss(spec, outputs, seq_len: int):
    """The checkpoint's balancing loss where the transformers class adds none (sigmoid-routed families), summed
    over the MoE layers' router logits in ``outputs``; None where there is none to add."""
    from autotune.workloads.moe_balancing import balancing_loss

    moe = spec.moe
    if moe is None or not moe.aux_loss_coeff or hf_model_family(spec) in HF_OWN_BALANCING:
        return None
    logits = getattr(outputs, "router_logits", None)
    if not logits:
        return None
    return sum(balancing_loss(layer, moe, seq_len) for layer in logits)


def model_balancing_loss(spec, outputs):
    """The balancing loss the transformers class itself added to ``outputs.loss`` (router_aux_loss_coef x its
    aux_loss: Mixtral, Qwen3-MoE), or None."""
    moe = spec.moe
    aux = getattr(outputs, "aux_loss", None)
    if moe is None or not moe.aux_loss_coeff or aux is None or hf_model_family(spec) not in HF_OWN_BALANCING:
        return None
    return moe.aux_loss_coeff * aux.to(outputs.loss.device)


def balanced_trainer(spec, seq_len: int):
    """A ``transformers.Trainer`` subclass whose loss carries the balancing loss with the cross entropy's weight."""
    from transformers import Trainer

    class BalancedTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                                 num_items_in_batch=num_items_in_batch)
            share, factor = 1.0, 1.0
            if self.model_accepts_loss_kwargs and num_items_in_batch is not None:
                labels = inputs["labels"][..., 1:]  # the tokens the Trainer counts (causal LMs shift the labels)
                share = (labels != -100).sum() / num_items_in_batch
                if self.args.average_tokens_across_devices:
                    factor = self.accelerator.num_processes // self.get_tp_size() if self.args.n_gpu <= 1 \
                        else self.args.n_gpu
            added = model_balancing_loss(spec, outputs)
            if added is not None:  # already in the loss at weight 1 x factor: bring it to share x factor
                loss = loss + added * (share - 1) * factor
            extra = extra_balancing_loss(spec, outputs, seq_len)
            if extra is not None:
                loss = loss + extra.to(loss.device) * share * factor
            return (loss, outputs) if return_outputs else loss

    return BalancedTrainer
