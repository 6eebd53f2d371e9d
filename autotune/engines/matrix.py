"""What each engine runs, as a table made from the engines' own data (docs/engines.md is this table)."""

from __future__ import annotations

from autotune.engines import ENGINES

__all__ = ["support_rows", "support_markdown"]

_DIMENSIONS = (
    ("tensor parallel", lambda s: s.tp or "no"),
    ("Megatron sequence parallel", lambda s: "yes" if s.sequence_parallel else "no"),
    ("pipeline", lambda s: s.pp or "no"),
    ("interleaved (vpp)", lambda s: "yes" if s.vpp else "no"),
    ("uneven layer split", lambda s: s.layer_split if s.pp else "-"),
    ("tp with pp", lambda s: "yes" if s.tp and s.pp and s.tp_with_pp else "no"),
    ("context parallel", lambda s: s.cp or "no"),
    ("expert parallel", lambda s: "yes" if s.ep else "no"),
    ("expert tensor parallel (folding)", lambda s: "yes" if s.etp else "no"),
    ("MoE token dispatchers", lambda s: ", ".join(s.moe_dispatchers) if s.ep else "-"),
    ("MoE token dropping (capacity)", lambda s: "yes" if s.token_drop else "no"),
    ("multi-token prediction (MTP)", lambda s: "yes" if s.mtp else "no"),
    ("output layer + loss layer slots (loss_slots)", lambda s: "yes" if s.loss_slots else "no"),
    ("activation CPU offload", lambda s: "yes" if s.activation_offload else "no"),
    ("ZeRO / sharding stages", lambda s: ", ".join(map(str, s.zero_stages))),
    ("stages with pp", lambda s: ", ".join(map(str, s.zero_stages_with_pp)) if s.pp else "-"),
    ("optimizer offload", lambda s: ", ".join(x for x in s.offload_optimizer if x != "none") or "no"),
    ("parameter offload", lambda s: ", ".join(x for x in s.offload_param if x != "none") or "no"),
    ("hybrid sharding", lambda s: "yes" if s.hybrid_shard else "no"),
    ("precisions", lambda s: ", ".join(s.precisions)),
    ("FP8 attention", lambda s: "yes" if s.fp8_attention else "no"),
    ("MXFP8 output layer", lambda s: "yes" if s.fp8_output_proj else "no"),
)


def support_rows() -> list[tuple[str, list[str]]]:
    """(dimension, one cell per engine in registry order)."""
    engines = list(ENGINES.values())
    rows = [(dim, [cell(e.support) for e in engines]) for dim, cell in _DIMENSIONS]
    rows.append(("checkpoint format", [e.checkpoint_format for e in engines]))
    rows.append(("trial workload", [e.workload for e in engines]))
    return rows


def support_markdown() -> str:
    engines = list(ENGINES.values())
    lines = ["# Engines", "",
             "Made by `python -m autotune.engines.matrix` from `autotune/engines/*.py` (a test keeps it current).",
             "", "| | " + " | ".join(f"`{e.name}`" for e in engines) + " |",
             "|---|" + "---|" * len(engines)]
    lines += [f"| {dim} | " + " | ".join(cells) + " |" for dim, cells in support_rows()]
    lines += ["", "Versions modelled (`--engine-version`; default: the installed release where modelled, else the "
                  "newest):", ""]
    lines += [f"- `{e.name}` ({e.title}): {e.versions.describe()}; {e.version}" for e in engines]
    lines += ["", "Why each refusal, in the engine's words (rule id: source):", ""]
    for e in engines:
        for dim, source in sorted(getattr(e, "sources", {}).items()):
            lines.append(f"- `{e.name}:{dim}`: {source}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(support_markdown(), end="")
