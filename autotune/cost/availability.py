"""How much of a job's wall time trains: checkpoint stalls, rework after a failure, restarts.

The renewal model (Young 1974; Daly 2006; with the recovery time in the objective, Saxena et al. 2024,
"Optimal Checkpoint Interval with Availability as an Objective Function", arXiv 2410.18124). A cycle is
``tau`` seconds of training plus ``delta`` seconds blocked by a save, ``c = tau + delta``. Unexpected
failures arrive at rate ``1/M`` (the job's MTBF: a GPU's over the GPU count, failures in series); each
loses the work since the last durable checkpoint (on average ``c/2``, plus ``lag`` while an asynchronous
write is still being persisted) and ``R`` seconds to detect, relaunch and load. Planned interruptions
(maintenance, upgrades) arrive at rate ``1/P``; the job saves first, so each costs ``R_planned`` and no
rework. Expected wall time per cycle, to first order in the rates:

    W = c + c/M (c/2 + lag + R) + c/P R_planned

The fraction of wall time that trains is ``tau / W``. Maximising it over ``tau`` (derived here from
that objective): ``c^2 - 2 delta c - 2 delta a M = 0`` with ``a = 1 + (lag + R)/M + R_planned/P``, so

    tau* = sqrt(delta^2 + 2 delta a M)

which is Young's ``sqrt(2 delta M)`` when ``delta``, ``R`` and ``lag`` are small against ``M``, and
longer when a restart is expensive (each failure then costs more than the work it loses).

Reliability facts (the defaults' sources):
- Llama 3 405B, 16,384 H100 for 54 days: 466 interruptions, 47 planned and 419 unexpected (Dubey et
  al. 2024, "The Llama 3 Herd of Models", Sec. 3.3.4 and Table 5), i.e. 16,384 x 1,296 h / 419 =
  50,677 GPU-hours per unexpected interruption (``CheckpointOptions.gpu_mtbf_hours`` = 50,000) and
  451,780 GPU-hours per planned one (:data:`PLANNED_GPU_HOURS`); "higher than 90% effective
  training time" (same section). The failures by component are :data:`LLAMA3_UNEXPECTED`.
- A job's failures in series, its MTTF inversely proportional to its node count: the model fitted to
  two Meta research clusters (Kokolis et al. 2024, "Revisiting Reliability in Large-Scale Machine
  Learning Research Clusters", arXiv 2410.21680, HPCA 2025).
"""

from __future__ import annotations

import math

__all__ = ["LLAMA3_UNEXPECTED", "PLANNED_GPU_HOURS", "availability_optimal_interval_s", "expected_detection_s",
           "wall_time_fractions"]

PLANNED_GPU_HOURS = 16_384 * 54 * 24 / 47
"""GPU-hours per planned interruption (Llama 3: 47 in 54 days on 16,384 GPUs); assumed to scale with the GPU
count like failures (node firmware and host maintenance are per node)."""

LLAMA3_UNEXPECTED = {  # Llama 3 Table 5: the 419 unexpected interruptions by root cause
    "faulty GPU": 148, "GPU HBM3 memory": 72, "software bug": 54, "network switch / cable": 35,
    "host maintenance (unplanned)": 32, "GPU SRAM memory": 19, "GPU system processor": 17, "NIC": 7,
    "NCCL watchdog timeouts": 7, "silent data corruption": 6, "GPU thermal interface + sensor": 6, "SSD": 3,
    "power supply": 3, "server chassis": 2, "IO expansion board": 2, "dependency": 2, "CPU": 2,
    "system memory": 2,
}


HANG_SHARE = LLAMA3_UNEXPECTED["NCCL watchdog timeouts"] / sum(LLAMA3_UNEXPECTED.values())
"""Failures that hang the job rather than end a process (Llama 3: 7 of 419 were NCCL watchdog timeouts)."""
WATCHDOG_TIMEOUT_S = 600.0
"""torch.distributed's default NCCL process-group timeout (10 minutes): how long a hang takes to be seen."""
CRASH_DETECTION_S = 5.0
"""A process that dies is seen by torchrun's elastic agent at its next monitor poll (seconds) and its peers'
collectives fail with it; assumed 5 s."""


def expected_detection_s(*, watchdog_timeout_s: float = WATCHDOG_TIMEOUT_S) -> float:
    """Mean seconds from a failure to the job knowing it: crashes at once, hangs after the watchdog timeout."""
    return (1 - HANG_SHARE) * CRASH_DETECTION_S + HANG_SHARE * watchdog_timeout_s


def availability_optimal_interval_s(*, delta_s: float, mtbf_s: float, restart_s: float, lag_s: float = 0.0,
                                    planned_s: float = math.inf, planned_restart_s: float = 0.0) -> float:
    """Training seconds between saves that maximise the fraction of wall time that trains (module docstring)."""
    assert delta_s >= 0 and mtbf_s > 0 and restart_s >= 0 and lag_s >= 0 and planned_s > 0
    a = 1 + (lag_s + restart_s) / mtbf_s + planned_restart_s / planned_s
    return math.sqrt(delta_s * delta_s + 2 * delta_s * a * mtbf_s)


def wall_time_fractions(*, interval_s: float, delta_s: float, mtbf_s: float, restart_s: float, lag_s: float = 0.0,
                        planned_s: float = math.inf, planned_restart_s: float = 0.0) -> dict[str, float]:
    """Fractions of wall time, summing to 1: ``train`` (new work), ``checkpoint`` (blocked by saves),
    ``rework`` (redoing work lost to failures), ``restart`` (detection, relaunch, load after a failure),
    ``planned`` (restarts for planned interruptions)."""
    assert interval_s > 0 and delta_s >= 0 and mtbf_s > 0 and planned_s > 0
    c = interval_s + delta_s
    rework, restart = c / mtbf_s * (c / 2 + lag_s), c / mtbf_s * restart_s
    planned = c / planned_s * planned_restart_s
    wall = c + rework + restart + planned
    return {"train": interval_s / wall, "checkpoint": delta_s / wall, "rework": rework / wall,
            "restart": restart / wall, "planned": planned / wall}
