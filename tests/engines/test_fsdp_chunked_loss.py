"""The built-in FSDP trainer's chunked loss (the plan's ``loss_chunks``, torchtitan 0.3's ``ChunkedLossWrapper``):
the output layer runs once per chunk, and the loss, the trunk's gradient and the head's gradient are those of the
unchunked loss at the same scale (one process, fp32, no parallelism; the 2-rank FSDP2 runs are in
tests/engines/test_fsdp_bundles.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autotune.train.fsdp_model import chunked_lm_loss, lm_loss


def _grads(chunks: int | None, scale: float):
    torch.manual_seed(0)
    trunk, head = nn.Linear(16, 16), nn.Linear(16, 40, bias=False)
    ids = torch.randn(2, 24, 16)
    labels = torch.randint(0, 40, (2, 24))
    calls = []
    head.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[1]))
    hidden = torch.tanh(trunk(ids))
    if chunks is None:
        loss = lm_loss(head(hidden), labels) * scale
    else:
        loss = chunked_lm_loss(head, hidden, labels, chunks, scale=scale)
    loss.backward()
    return float(loss), trunk.weight.grad.clone(), head.weight.grad.clone(), calls


@pytest.mark.parametrize("chunks", [1, 3, 8])
def test_the_chunked_loss_is_the_loss_with_its_gradients(chunks):
    loss, trunk, head, _ = _grads(None, 0.5)
    c_loss, c_trunk, c_head, calls = _grads(chunks, 0.5)
    assert calls == [24 // chunks] * chunks  # the head ran chunk by chunk
    assert c_loss == pytest.approx(loss, rel=1e-6)
    assert torch.allclose(c_trunk, trunk, rtol=1e-5, atol=1e-7)  # through the accumulated hidden-state gradient
    assert torch.allclose(c_head, head, rtol=1e-5, atol=1e-7)  # taken in the chunks, at the loss's scale
    _, _, unscaled, _ = _grads(chunks, 1.0)
    assert torch.allclose(unscaled, 2 * c_head, rtol=1e-5)


def test_a_sequence_the_chunks_do_not_divide_is_refused():
    with pytest.raises(ValueError, match="does not split into 5"):
        _grads(5, 1.0)
