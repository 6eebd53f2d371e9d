"""Goodput: the tokens/s a plan keeps once checkpoint stalls, rework and restarts are paid.

``tokens/s x train fraction``, the fraction from the plan's checkpoint policy (what one save weighs
and blocks, the availability-optimal interval: :mod:`autotune.cost.checkpoint`,
:mod:`autotune.cost.availability`). Plans differ in it by what their saves block (asynchronous
Megatron / DCP saves stall only for the device-to-host copy, DeepSpeed's write blocks), what they
write (ZeRO-3 writes no 16-bit weights) and how many GPUs they span; the step-time ranking sees none
of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.cost.checkpoint import CheckpointPolicy, checkpoint_policy
from autotune.emit.options import CheckpointOptions

__all__ = ["Goodput", "goodput"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Goodput:
    """A plan's goodput and where the rest of its wall time goes."""

    tokens_per_s: float
    """The step-time estimate's throughput while training."""
    fractions: dict[str, float]
    """Of wall time: train, checkpoint, rework, restart, planned (sum 1)."""
    policy: CheckpointPolicy

    @property
    def goodput_tokens_per_s(self) -> float:
        return self.tokens_per_s * self.fractions["train"]

    @property
    def lost_fraction(self) -> float:
        return 1.0 - self.fractions["train"]

    def summary(self) -> str:
        f, p = self.fractions, self.policy
        return (f"goodput {self.goodput_tokens_per_s:,.0f} tok/s ({100 * f['train']:.1f}% of wall time trains; "
                f"lost: saving {100 * f['checkpoint']:.2f}%, rework {100 * f['rework']:.2f}%, restarts "
                f"{100 * (f['restart'] + f['planned']):.2f}%); job MTBF {p.job_mtbf_s / 3600:,.1f} h, save every "
                f"{p.interval_steps:,} steps ({p.interval_s / 60:,.1f} min), "
                f"{'async' if p.async_save else 'blocking'} save {p.blocking_s:,.2g} s, restart {p.restart_s:,.0f} s")

    def to_dict(self) -> dict:
        p = self.policy
        return {"goodput_tokens_per_s": self.goodput_tokens_per_s, "tokens_per_s": self.tokens_per_s,
                "fractions": dict(self.fractions), "job_mtbf_s": p.job_mtbf_s, "interval_steps": p.interval_steps,
                "interval_s": p.interval_s, "optimal_interval_s": p.optimal_interval_s, "blocking_s": p.blocking_s,
                "write_time_s": p.write_time_s, "restart_s": p.restart_s, "async_save": p.async_save,
                "checkpoint_bytes": p.sizes.total}


def goodput(estimate, options: CheckpointOptions | None = None, *, relaunch_s: float | None = None) -> Goodput:
    """The goodput of one estimated plan (``estimate``: :class:`autotune.cost.estimate.Estimate`)."""
    policy = checkpoint_policy(estimate, options or CheckpointOptions(), relaunch_s=relaunch_s)
    return Goodput(tokens_per_s=estimate.time.tokens_per_s, fractions=policy.wall_fractions, policy=policy)
