"""The FSDP trainer trains the MoE balancing loss with the factor its main loss carries: 1/accumulation steps
without a pipeline (each micro-batch's loss is divided before backward), 1 under ``torch.distributed.pipelining``
(the schedule divides the gradients afterwards). The same model, data and updates (SGD) as one process with 2
accumulation steps and as 2 pipeline stages with 2 micro-batches train the same losses; the balancing loss's
weight doubled moves them (so a pipeline run that gave it the wrong factor, 1/2, would not match: it measures
3.5e-2 off at the third step)."""

from __future__ import annotations

import pytest

from test_fsdp_bundles import _emit, _run_bundle  # tests/engines is on sys.path (no __init__)

MOE = {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 64}


def _losses(tmp_path, name: str, ranks: int, pp: int, coeff: float) -> list[float]:
    where = tmp_path / name
    where.mkdir()
    bundle = _emit(where, 2, ranks, "--zero", "3", "--pp", str(pp), "--global-batch", "2", "--micro-batch", "1",
                   "--optimizer", "sgd", "--lr", "0.5", "--warmup-steps", "0", moe={**MOE, "aux_loss_coeff": coeff})
    return _run_bundle(bundle, where)["losses"]


@pytest.mark.slow
@pytest.mark.usefixtures("default_port_taken")
def test_pipeline_stages_train_the_balancing_loss_as_one_process(tmp_path):
    one = _losses(tmp_path, "one-process", 1, 1, 0.5)
    stages = _losses(tmp_path, "two-stages", 2, 2, 0.5)
    doubled = _losses(tmp_path, "doubled-weight", 1, 1, 1.0)
    assert stages[:4] == pytest.approx(one[:4], abs=5e-3)
    assert abs(doubled[2] - one[2]) > 2e-2  # the balancing loss's weight is felt by the third step
