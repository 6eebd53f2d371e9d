"""Why a search found no feasible plan, and the way out: what `plan` and `plan --from` say when nothing fits."""

from __future__ import annotations

__all__ = ["no_plan_problems"]


def no_plan_problems(result, model, cluster, *, seq_len: int, global_batch: int, batch_given: int | None,
                     constraints) -> list[str]:
    """Why a search found no feasible plan (its rejections) and the way out: the batch, the pipeline split, or the
    GPU count the model needs (``capacity.infeasibility_hint``). ``batch_given``: the global batch the user gave
    (None: the default one)."""
    from autotune.search import capacity

    problems = [f"no plan of the {result.num_enumerated:,} enumerated is feasible: "
                + ", ".join(f"{k} {v:,}" for k, v in result.rejections.items())]
    if set(result.rejections) <= {"batch_triple", "interleave_microbatches"}:
        problems.append(f"global batch {global_batch} is not divisible by micro-batch x dp for any layout: "
                        f"use a multiple of {cluster.num_gpus} (or of a divisor of it that tp*pp*cp leaves)")
    elif set(result.rejections) <= {"layers_vpp", "vpp_needs_pp", "layers_pp"}:  # the split, not the memory
        from autotune.legend import rule_meaning

        problems.append(f"every layout allowed splits the {model.num_layers} layers over pipeline stages the "
                        "engine's split cannot fill ("
                        + "; ".join(f"{rule}: {rule_meaning(rule)}" for rule in result.rejections)
                        + "): give another --pp / --vpp"
                        + ("" if constraints.uneven_layouts else ", or add --uneven-layouts (Megatron-core's "
                           "uneven splits: embedding / loss slots, first / last stages, an explicit layout)"))
    else:
        problems.append(capacity.infeasibility_hint(model, cluster, seq_len=seq_len, global_batch=batch_given,
                                                    constraints=constraints))
    return problems
