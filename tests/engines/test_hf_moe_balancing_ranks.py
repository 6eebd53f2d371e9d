"""2 processes (gloo, CPU), 2 accumulated micro-batches each: transformers' own ``Trainer.train()`` (its accelerator,
its DDP wrapping, its ``get_batch_samples`` token count gathered over the ranks) trains the MoE balancing loss
with the weights of the cross entropy, as one batch of the 4 micro-batches would, with
:func:`autotune.train.hf_balancing.balanced_trainer`; the plain ``Trainer`` does not (Mixtral).

The target. Micro-batch k (rank r, step g; K = R x G of them, R = 2 ranks, G = 2 steps) has n_k label tokens
(``labels[..., 1:] != -100``), cross-entropy sum C_k and balancing loss B_k (Mixtral: router_aux_loss_coef x
its aux_loss; DeepSeek-V3: the checkpoint's per-sequence loss, :func:`extra_balancing_loss`); N = sum_k n_k. One
batch weighs every label token alike, so the cross entropy is sum_k C_k / N, and the balancing loss, averaged with
the same weights, sum_k (n_k / N) B_k (a micro-batch's routers count by its share of the tokens, as its cross
entropy does)::

    L* = sum_k C_k / N + sum_k (n_k / N) B_k          (the routers' gradient below is that of L*)

What the Trainer does (transformers 5.25 trainer.py): ``_get_num_items_in_batch`` (2384-2387) gathers
N over the ranks; ``compute_loss`` (2243-2251) multiplies the model's loss, C_k / N (+ B_k for Mixtral, whose
class adds it at weight 1), by R = ``num_processes // get_tp_size()``; ``training_step`` (2146-2155) no longer
divides it by G; DDP averages the ranks' gradients (1/R). So the gradient is that of
sum_k C_k / N + sum_k B_k: Mixtral's balancing loss at K x its weight, DeepSeek's not at all. The balanced
trainer puts B_k x (n_k / N) x R on each micro-batch's loss (for Mixtral: (n_k / N - 1) x R more than the
class's B_k x R); DDP's 1/R leaves sum_k (n_k / N) B_k. The factor R is the Trainer's own (the R it puts on
C_k / N against DDP's mean); with factor 1 micro-batch k's balancing loss would train at weight
(n_k / N + R - 1) / R instead of n_k / N (Mixtral) or at 1 / R of it (DeepSeek): the test fails then.
(The balancing loss routes every input token, masked labels too, and is not linear over micro-batches: "as one
batch" means the micro-batches' losses averaged as the cross entropy averages them, what balanced_trainer does.)

The labels are masked (-100) so that n_k differ between the micro-batches and between the ranks (43 tokens: 15,
10, 5, 13); the sampler gives each rank 2 of the 4 (checked), the reference sums over all 4 in one process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from autotune.train.hf_balancing import balanced_trainer, extra_balancing_loss, model_balancing_loss  # noqa: E402
from autotune.train.hf_models import build_hf_model  # noqa: E402
from test_hf_moe_balancing import SEQ, _mixtral, _moonlight, _routers  # noqa: E402 (tests/engines on sys.path)

RANKS, GAS = 2, 2
MASKED = (0, 6, 11, 3)  # the first labels of each micro-batch masked: 15, 10, 5, 13 tokens are counted
MODELS = {"mixtral": _mixtral, "deepseek-v3-layer": _moonlight}
TIMEOUT = 240  # both ranks together, seconds (the run takes ~30 s on 2 cores)
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # starts 2 processes and trains


def _examples():
    gen = torch.Generator().manual_seed(11)
    examples = []
    for ids, masked in zip(torch.randint(0, 128, (RANKS * GAS, SEQ), generator=gen), MASKED):
        labels = ids.clone()
        labels[:masked] = -100
        examples.append({"input_ids": ids, "labels": labels})
    return examples


def _counts(examples):
    return [int((e["labels"][1:] != -100).sum()) for e in examples]  # as the Trainer counts (the shift)


# ---- each rank -----------------------------------------------------------------------------------------------

def _train_one_step(spec, trainer_class, out: Path) -> dict:
    """One optimizer step (SGD, lr 1, no clipping) of ``trainer_class`` from the seeded model: the routers'
    gradients when the optimizer steps (after DDP's averaging), the update it made, what compute_loss saw."""
    torch.manual_seed(0)
    model = build_hf_model(spec, seq_len=SEQ, dtype=None)
    before = [w.detach().clone() for w in _routers(model)]
    seen, grads = [], []

    class Recording(trainer_class):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            seen.append((inputs["input_ids"].clone(), int(num_items_in_batch)))
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

    class Grab(transformers.TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            grads.extend(w.grad.detach().clone() for w in _routers(model))

    args = transformers.TrainingArguments(
        output_dir=str(out), use_cpu=True, ddp_backend="gloo", per_device_train_batch_size=1,
        gradient_accumulation_steps=GAS, average_tokens_across_devices=True, max_steps=1, optim="sgd",
        learning_rate=1.0, lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0, seed=0,
        report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True)
    trainer = Recording(model=model, args=args, train_dataset=_examples(), callbacks=[Grab()])
    trainer.train()
    return {"grads": grads, "update": [b - w.detach() for b, w in zip(before, _routers(model))], "init": before,
            "seen": seen, "wrapped": type(trainer.model_wrapped).__name__,
            "processes": trainer.accelerator.num_processes}


def _rank_main(out: Path) -> None:
    results = {}
    for name, make in MODELS.items():
        spec = make()
        for kind, cls in (("balanced", balanced_trainer(spec, SEQ)), ("plain", transformers.Trainer)):
            results[name, kind] = _train_one_step(spec, cls, out / f"{name}-{kind}")
    torch.save(results, out / f"rank{os.environ['RANK']}.pt")


# ---- the test process ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    from conftest import pick_free_port  # tests/ is on sys.path (no __init__)

    out = tmp_path_factory.mktemp("ranks")
    port = pick_free_port()
    procs, logs = [], []
    start = time.monotonic()
    for rank in range(RANKS):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "LOCAL_RANK": str(rank), "WORLD_SIZE": str(RANKS), "LOCAL_WORLD_SIZE": str(RANKS),
               "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                                                  os.environ.get("PYTHONPATH")]))}
        logs.append(open(out / f"rank{rank}.log", "w"))  # noqa: SIM115 - closed below
        procs.append(subprocess.Popen([sys.executable, __file__, str(out)], env=env, stdout=logs[-1],
                                      stderr=subprocess.STDOUT, cwd=REPO))
    try:
        for proc in procs:
            proc.wait(timeout=max(1.0, TIMEOUT - (time.monotonic() - start)))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for proc in procs:  # never leave a rank behind (a rank waiting on the other in a collective)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
    tails = "\n".join(f"--- rank {r} (exit {p.returncode}) ---\n" + (out / f"rank{r}.log").read_text()[-4000:]
                      for r, p in enumerate(procs))
    assert all(p.returncode == 0 for p in procs), tails
    print(f"2 ranks: {time.monotonic() - start:.1f} s")
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(RANKS)]


def _reference(spec, weights: list[float], init) -> list:
    """The routers' gradient of sum_k C_k / N + sum_k weights[k] x B_k over the 4 micro-batches, one process."""
    examples, counts = _examples(), _counts(_examples())
    torch.manual_seed(0)
    model = build_hf_model(spec, seq_len=SEQ, dtype=None)
    model.train()
    for got, want in zip(_routers(model), init):
        assert torch.equal(got.detach(), want)  # the ranks started from the same weights
    loss = 0.0
    for e, w in zip(examples, weights):
        out = model(input_ids=e["input_ids"][None], labels=e["labels"][None])
        ce = torch.nn.functional.cross_entropy(out.logits[0, :-1].float(), e["labels"][1:], reduction="sum")
        balancing = model_balancing_loss(spec, out)
        if balancing is None:
            balancing = extra_balancing_loss(spec, out, SEQ)
        loss = loss + ce / sum(counts) + w * balancing
    return torch.autograd.grad(loss, _routers(model))


def _max_diff(got, want) -> float:
    return max(float((g - w).abs().max()) for g, w in zip(got, want))


def _scale(grads) -> float:
    return max(float(g.abs().max()) for g in grads)


def test_the_ranks_ran_ddp_over_their_own_micro_batches_with_the_gathered_token_count(ranks):
    examples, counts = _examples(), _counts(_examples())
    assert len(set(counts)) == len(counts)
    for key in ranks[0]:
        seen = [ranks[r][key]["seen"] for r in range(RANKS)]
        assert all(ranks[r][key]["wrapped"] == "DistributedDataParallel" for r in range(RANKS)), key
        assert all(ranks[r][key]["processes"] == RANKS for r in range(RANKS)), key
        which = [[next(i for i, e in enumerate(examples) if torch.equal(ids[0], e["input_ids"])) for ids, _ in s]
                 for s in seen]
        assert sorted(sum(which, [])) == list(range(RANKS * GAS)), (key, which)  # each micro-batch once
        assert len({sum(counts[i] for i in w) for w in which}) == RANKS  # the ranks' shares differ
        assert all(n == sum(counts) for s in seen for _, n in s), key  # N over both ranks, on both ranks
        for got, want in zip(ranks[1][key]["grads"], ranks[0][key]["grads"]):
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-8), key  # DDP's averaged gradient on both
        assert _max_diff(ranks[0][key]["update"], ranks[0][key]["grads"]) < 1e-6, key  # SGD lr 1 applied it


@pytest.mark.parametrize("name", list(MODELS))
def test_two_ranks_train_the_balancing_loss_with_the_cross_entropys_weights(ranks, name):
    spec, counts = MODELS[name](), _counts(_examples())
    run = ranks[0][name, "balanced"]
    target = _reference(spec, [n / sum(counts) for n in counts], run["init"])
    diff, scale = _max_diff(run["grads"], target), _scale(target)
    print(f"{name}: balanced trainer vs target: max |diff| {diff:.3g} (gradient scale {scale:.3g})")
    for got, want in zip(run["grads"], target):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-7), f"{name}: max |diff| {diff:.3g} of {scale:.3g}"
    # the balancing loss is felt: without it (weight 0) the routers' gradient is measurably elsewhere
    assert _max_diff(target, _reference(spec, [0.0] * len(counts), run["init"])) > 1e3 * max(diff, 1e-9)


@pytest.mark.parametrize("name", list(MODELS))
def test_the_plain_trainer_weighs_it_otherwise(ranks, name):
    """Mixtral's class adds B_k at weight 1 per micro-batch: the plain Trainer trains sum_k B_k, K x the
    token-weighted mean; DeepSeek's class adds none."""
    spec, counts = MODELS[name](), _counts(_examples())
    run = ranks[0][name, "plain"]
    target = _reference(spec, [n / sum(counts) for n in counts], run["init"])
    expected = _reference(spec, [1.0 if name == "mixtral" else 0.0] * len(counts), run["init"])
    off, explained = _max_diff(run["grads"], target), _max_diff(run["grads"], expected)
    print(f"{name}: plain trainer vs target: max |diff| {off:.3g}; vs its predicted weights: {explained:.3g}")
    assert off > 1e3 * max(explained, 1e-9)
    assert not all(torch.allclose(got, want, rtol=1e-3, atol=1e-6) for got, want in zip(run["grads"], target))


if __name__ == "__main__":  # a rank (started by the ``ranks`` fixture)
    _rank_main(Path(sys.argv[1]))
