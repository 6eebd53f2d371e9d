"""Engines: what trains a plan (DeepSpeed, Megatron-LM, Megatron-DeepSpeed, PyTorch FSDP2 / torchtitan,
Hugging Face Trainer / accelerate), each behind :class:`~autotune.engines.base.Engine`.

``engine_for(plan)`` (or a name) returns the engine object; ``ENGINES`` maps names to them.
"""

from __future__ import annotations

from autotune.engines.base import Engine
from autotune.engines.deepspeed import DeepSpeedEngine
from autotune.engines.facts import CommSchedule, EngineFiles, EngineSupport, Rule
from autotune.engines.fsdp import FSDPEngine
from autotune.engines.hf import HFEngine
from autotune.engines.megatron import MegatronEngine
from autotune.engines.megatron_deepspeed import MegatronDeepSpeedEngine

__all__ = ["ENGINES", "engine_for", "Engine", "EngineSupport", "CommSchedule", "EngineFiles", "Rule"]

ENGINES: dict[str, Engine] = {e.name: e for e in (DeepSpeedEngine(), MegatronEngine(), MegatronDeepSpeedEngine(),
                                                    FSDPEngine(), HFEngine())}


def engine_for(plan_or_name) -> Engine:
    """The engine of a plan (or of an engine name)."""
    name = plan_or_name if isinstance(plan_or_name, str) else plan_or_name.engine
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r} (known: {', '.join(ENGINES)})") from None
