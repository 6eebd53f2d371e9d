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
from autotune.engines import engine_for

__all__ = ["Goodput", "goodput"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Goodput:
    """A plan's goodput and where the rest of its wall time goes."""

    tokens_per_s: float
    """The step-time estimate's throughput while training."""
    fractions: dict[str, float]
    """Of wall time: train, checkpoint, rework, restart, planned (sum 1)."""
    policy: CheckpointPolicy
    replica_groups: int = 1
    """HSDP replica groups (``dp_replicate``): with torchft's fault-tolerant HSDP a failure stops one group and the
    others train on (not emitted by autotune; the figure says what it would bound)."""

    @property
    def blast_radius_gpus(self) -> int:
        """GPUs one failure stops: every GPU of a synchronous job."""
        return self.policy.num_gpus

    @property
    def torchft_blast_radius_gpus(self) -> int | None:
        """GPUs one failure would stop under torchft's fault-tolerant HSDP (one replica group); None without HSDP."""
        return self.policy.num_gpus // self.replica_groups if self.replica_groups > 1 else None

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
                f"{'async' if p.async_save else 'blocking'} save {p.blocking_s:,.2g} s"
                + (f" to node-local storage (durable every {p.durable_interval_steps:,} steps)" if p.local else "")
                + f", restart {p.restart_s:,.0f} s; "
                f"a failure stops all {self.blast_radius_gpus:,} GPUs"
                + (f" (torchft's fault-tolerant HSDP would stop one replica group of "
                   f"{self.torchft_blast_radius_gpus:,})" if self.torchft_blast_radius_gpus else ""))

    def to_dict(self) -> dict:
        p = self.policy
        return {"goodput_tokens_per_s": self.goodput_tokens_per_s, "tokens_per_s": self.tokens_per_s,
                "fractions": dict(self.fractions), "job_mtbf_s": p.job_mtbf_s, "interval_steps": p.interval_steps,
                "interval_s": p.interval_s, "optimal_interval_s": p.optimal_interval_s, "blocking_s": p.blocking_s,
                "write_time_s": p.write_time_s, "restart_s": p.restart_s, "detection_s": p.detection_s,
                "rendezvous_s": p.rendezvous_s, "load_time_s": p.load_time_s, "async_save": p.async_save,
                "checkpoint_tier": p.tier, "durable_interval_steps": p.durable_interval_steps,
                "staging_host_bytes_per_node": p.staging_host_bytes_per_node,
                "consolidation_s": p.consolidation_s, "consolidation_host_bytes": p.consolidation_host_bytes,
                "gather_16bit_weights_on_model_save": p.gather_16bit_weights_on_model_save,
                "checkpoint_bytes": p.sizes.total, "checkpoint_notes": list(p.notes), "blast_radius_gpus": self.blast_radius_gpus,
                "torchft_blast_radius_gpus": self.torchft_blast_radius_gpus}


def goodput(estimate, options: CheckpointOptions | None = None) -> Goodput:
    """The goodput of one estimated plan (``estimate``: :class:`autotune.cost.estimate.Estimate`)."""
    policy = checkpoint_policy(estimate, options or CheckpointOptions())
    hybrid = engine_for(estimate.plan).support.hybrid_shard and estimate.plan.zero_stage in (2, 3)
    return Goodput(tokens_per_s=estimate.time.tokens_per_s, fractions=policy.wall_fractions, policy=policy,
                   replica_groups=estimate.plan.dp_replicate if hybrid else 1)
