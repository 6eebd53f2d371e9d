"""What a plan search answers (``SearchResult``, the contract's ``plan --json``), apart from how it searched
(``autotune.search.planner``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.cost.estimate import Estimate
from autotune.cost.uncertainty import Uncertainty
from autotune.report import plan_summary
from autotune.specs.hardware import ClusterSpec
from autotune.specs.model import ModelSpec

__all__ = ["SearchResult", "explain_winner"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchResult:
    """The contract's ``plan --json``: ranked candidates and what pruned the rest."""

    model: ModelSpec
    cluster: ClusterSpec
    candidates: tuple[Estimate, ...]
    num_enumerated: int
    num_feasible: int
    rejections: dict[str, int]
    search_time_s: float
    explanation: str = ""
    ranked: tuple[Estimate, ...] = field(default=(), repr=False)
    """Every feasible plan, fastest first by prediction (what the goodput ranking walks)."""
    decided: tuple[Estimate, ...] = field(default=(), repr=False)
    """Every feasible plan in the planner's order: ``ranked`` with tied plans regrouped simplest first
    (autotune.search.ties); the candidates are its first K. Empty: the same as ``ranked`` (``ties=False``)."""
    tied: int = 1
    """Plans tied with the first: within each other's error of the fastest (autotune.search.ties); 1 when the
    search ranked by predicted speed alone (``ties=False``)."""
    uncertainty: Uncertainty | None = None
    """The fastest plan's interval (autotune.cost.uncertainty), the tie rule's width."""
    engine_versions: dict[str, str] = field(default_factory=dict)
    """{engine: release} the search modelled (``SearchConstraints.engine_versions`` of the engines searched)."""
    release_defaults: dict[str, dict] = field(default_factory=dict)
    """{engine: {"release": R, "settings": {setting: value}}}: the run settings the engine's release ran in its
    plans unless told otherwise (``Engine.release_defaults``; ``SearchConstraints.engine_versions``)."""
    release_cost_settings: dict[str, dict] = field(default_factory=dict)
    """{engine: {"release": R, "settings": {field: value}}}: what the engine's release's code does that no plan field
    says, which its plans were estimated with (``Engine.release_cost_settings``: torchtitan 0.3's op-SAC save set),
    as ``estimate --engine-version`` estimates them."""
    setting_gains: object = None
    """What the opt-in run settings the search left at the engine's defaults would gain on the first plan
    (``autotune.search.setting_gains.SettingGains``; None where not asked: `autotune plan` asks)."""
    last_stage_hint: object = None
    """What a lighter last pipeline stage (``--loss-slots K``) would gain on the first plan
    (``autotune.search.last_stage_hint.LastStageHint``; None where it gains nothing or was not asked)."""

    @property
    def in_order(self) -> tuple[Estimate, ...]:
        """Every feasible plan in the planner's order (``decided``, or ``ranked`` without ties)."""
        return self.decided or self.ranked

    def to_dict(self) -> dict:
        return {"candidates": [c.to_dict() for c in self.candidates], "num_enumerated": self.num_enumerated,
                "num_feasible": self.num_feasible, "rejections": dict(self.rejections),
                "search_time_s": self.search_time_s, "explanation": self.explanation, "tied_with_first": self.tied,
                "uncertainty": None if self.uncertainty is None else self.uncertainty.to_dict(),
                "engine_versions": self.engine_versions, "release_defaults": self.release_defaults,
                "release_cost_settings": self.release_cost_settings,
                "setting_gains": None if self.setting_gains is None else self.setting_gains.to_dict(),
                "last_stage_hint": None if self.last_stage_hint is None else self.last_stage_hint.to_dict()}


def explain_winner(ranked: tuple[Estimate, ...]) -> str:
    """One line on why the best plan beats the runner-up: the step-time terms that differ most."""
    if not ranked:
        return ""
    if len(ranked) == 1:
        return "only one plan fits"

    best, second = ranked[0], ranked[1]
    gain = best.time.tokens_per_s / second.time.tokens_per_s - 1
    terms = ("compute_s", "exposed_comm_s", "bubble_s", "offload_s", "optimizer_s")
    diffs = sorted(((getattr(second.time, t) - getattr(best.time, t), t) for t in terms), key=lambda d: -abs(d[0]))
    parts = []
    for delta, term in diffs[:2]:
        if abs(delta) < 1e-3 * best.time.step_time_s:
            continue
        name = term.removesuffix("_s").replace("_", " ")
        parts.append(f"{name} {abs(delta):.3g} s {'lower' if delta > 0 else 'higher'}")
    why = ", ".join(parts) if parts else "equal step time, more memory headroom"
    return (f"{plan_summary(best.plan)} beats {plan_summary(second.plan)} by {gain:.1%} tokens/s: {why}"
            f" (per step)")
