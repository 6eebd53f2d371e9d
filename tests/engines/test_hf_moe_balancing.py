"""The hf engine's built-in trainer (transformers' own Trainer.training_step) trains the MoE balancing loss at the
checkpoint's weight with gradient accumulation: the router's gradient over 2 accumulated micro-batches is that of
the mean over them of (cross entropy + weight x balancing loss), as one batch would give it.

transformers 5.25's Trainer, for a model that takes loss kwargs, normalises the loss by the accumulated token
count and stops dividing by the accumulation steps, so the balancing loss a Mixtral adds per micro-batch weighs
accumulation steps x its weight: the plain Trainer below measures it. DeepSeek-V3's class adds none; the trainer
adds the checkpoint's per-sequence loss (autotune.train.hf_balancing)."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from autotune.specs.loading import load_model  # noqa: E402
from autotune.train.hf_balancing import balanced_trainer, extra_balancing_loss  # noqa: E402
from autotune.train.hf_models import build_hf_model  # noqa: E402

SEQ, GAS = 16, 2


def _mixtral():
    preset = load_model("mixtral-8x7b")
    return dataclasses.replace(preset, name="mixtral-small", num_layers=2, hidden_size=64, num_attention_heads=4,
                               num_kv_heads=2, ffn_hidden_size=96, vocab_size=128,
                               moe=dataclasses.replace(preset.moe, expert_ffn_hidden_size=32, aux_loss_coeff=0.5))


def _moonlight():
    preset = load_model("moonlight-16b-a3b")
    return dataclasses.replace(preset, name="moonlight-small", num_layers=3, hidden_size=64, num_attention_heads=4,
                               num_kv_heads=4, ffn_hidden_size=96, vocab_size=128,
                               mla=dataclasses.replace(preset.mla, kv_lora_rank=16, qk_nope_head_dim=8,
                                                       qk_rope_head_dim=8, v_head_dim=8),
                               moe=dataclasses.replace(preset.moe, num_experts=8, top_k=2, expert_ffn_hidden_size=32,
                                                       num_shared_experts=1, aux_loss_coeff=0.5))


def _batches():
    gen = torch.Generator().manual_seed(7)
    return [{"input_ids": t, "labels": t} for t in torch.randint(0, 128, (GAS, 1, SEQ), generator=gen)]


def _routers(model):
    return [m.weight for n, m in model.named_modules() if n.endswith("mlp.gate")]


def _trainer_gradients(spec, model, trainer_class, tmp_path):
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=1,
                                          gradient_accumulation_steps=GAS, use_cpu=True, report_to="none",
                                          max_steps=1, disable_tqdm=True)
    trainer = trainer_class(model=model, args=args, train_dataset=_batches())
    batches = _batches()
    num_items = sum((b["labels"][..., 1:] != -100).sum() for b in batches)  # as Trainer.get_batch_samples counts
    model.zero_grad()
    for b in batches:
        trainer.training_step(model, b, num_items)
    return [w.grad.clone() for w in _routers(model)]


def _one_batch_gradients(spec, model):
    """The mean over the micro-batches of (cross entropy + weight x balancing loss), each micro-batch's loss as
    the class computes it (Mixtral adds its own) plus the loss the class leaves out (DeepSeek)."""
    model.zero_grad()
    for b in _batches():
        out = model(**b)
        extra = extra_balancing_loss(spec, out, SEQ)
        ((out.loss if extra is None else out.loss + extra) / GAS).backward()
    return [w.grad.clone() for w in _routers(model)]


@pytest.mark.parametrize("make", [_mixtral, _moonlight], ids=["mixtral", "deepseek-v3-layer"])
def test_accumulated_micro_batches_train_the_balancing_loss_at_its_weight(make, tmp_path):
    spec = make()
    torch.manual_seed(0)
    model = build_hf_model(spec, seq_len=SEQ, dtype=None)
    assert _routers(model)
    reference = _one_batch_gradients(spec, model)
    ours = _trainer_gradients(spec, model, balanced_trainer(spec, SEQ), tmp_path / "ours")
    for got, want in zip(ours, reference):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-7)
    plain = _trainer_gradients(spec, model, transformers.Trainer, tmp_path / "plain")
    # transformers' own Trainer: Mixtral's balancing loss at GAS x its weight; DeepSeek's class adds none at all
    assert not all(torch.allclose(got, want, rtol=1e-3) for got, want in zip(plain, reference))


def test_deepseek_layers_return_their_router_logits_and_the_loss_is_per_sequence():
    spec = _moonlight()
    torch.manual_seed(0)
    model = build_hf_model(spec, seq_len=SEQ, dtype=None)
    ids = torch.randint(0, 128, (2, SEQ))
    out = model(input_ids=ids, labels=ids)
    assert len(out.router_logits) == spec.num_layers - spec.moe.num_dense_layers  # the MoE layers' routers
    assert float(extra_balancing_loss(spec, out, SEQ).detach()) > 0
    assert extra_balancing_loss(dataclasses.replace(spec, moe=dataclasses.replace(
        spec.moe, aux_loss_coeff=None, aux_loss_per_sequence=False)), out, SEQ) is None


def test_plan_md_tells_a_users_trainer_script_what_the_balancing_loss_needs(tmp_path):
    import subprocess
    import sys

    def needs(model: str, gas_batch: int) -> str:
        out = tmp_path / f"{model}-{gas_batch}"
        proc = subprocess.run([sys.executable, "-m", "autotune", "emit", "--model", model, "--gpu", "h100-sxm-80gb",
                               "--num-gpus", "16", "--engine", "hf", "--seq-len", "4096", "--global-batch",
                               str(gas_batch), "--zero", "3", "--recompute", "full", "--out", str(out)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return (out / "plan.md").read_text()

    mixtral = needs("mixtral-8x7b", 64)  # 16 GPUs x micro-batch 1: 4 accumulation steps
    assert "weight 0.02: set output_router_logits=True" in mixtral and "weighs 4 x its weight" in mixtral
    moonlight = needs("moonlight-16b-a3b", 16)  # no accumulation
    assert "weight 0.0001: transformers' class adds none" in moonlight and "per sequence" in moonlight
    assert "weighs" not in moonlight
    assert "load-balancing loss" not in needs("llama3-8b", 64)
