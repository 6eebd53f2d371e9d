"""One plan's prediction: the memory ledger and the step time together (:class:`Estimate`, the contract's
``estimate --json`` document), and rebuilding one from that document (:func:`estimate_from_dict`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from autotune.cost.memory import MemoryEstimate, estimate_memory
from autotune.cost.step_time import StepTimeEstimate, TimeSettings, estimate_step_time
from autotune.cost.uncertainty import Uncertainty, uncertainty_of
from autotune.errors import InputError
from autotune.rules import plan_problems
from autotune.specs.hardware import KERNEL_FACT_FIELDS, OPTIONAL_KERNEL_FACT_FIELDS, ClusterSpec
from autotune.specs.loading import load_cluster, model_from_mapping
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan
from autotune.specs.settings import MemorySettings

__all__ = ["Estimate", "estimate", "cluster_spec_dict", "estimate_from_dict"]


def cluster_spec_dict(cluster: ClusterSpec) -> dict:
    """The cluster as a cluster-YAML mapping (schemas/cluster.schema.json), GPU inline."""
    gpu = cluster.gpu
    gpu_doc = {"name": gpu.name, "memory_gib": gpu.memory_gib, "peak_tflops": dict(gpu.peak_tflops),
               "hbm_bandwidth_gb_per_s": gpu.hbm_bandwidth_gb_per_s}
    if gpu.compute_capability is not None:  # what the FP8 / FP4 recipes' rules read (rules._fp8_recipe_gpu)
        gpu_doc["compute_capability"] = gpu.compute_capability
    if gpu.kernels is not None:  # the kernel facts travel with the GPU, so a plan.json re-estimates the same
        k = gpu.kernels
        gpu_doc["kernels"] = {name: (dict(getattr(k, name)) if isinstance(getattr(k, name), Mapping)
                                     else getattr(k, name)) for name in KERNEL_FACT_FIELDS}
        gpu_doc["kernels"].update({name: getattr(k, name) for name in OPTIONAL_KERNEL_FACT_FIELDS
                                   if getattr(k, name) is not None})
        if k.source:
            gpu_doc["kernels"]["source"] = k.source
    return {"gpu": gpu_doc,
            "num_nodes": cluster.num_nodes, "gpus_per_node": cluster.gpus_per_node,
            "intra_node_bandwidth_gb_per_s": cluster.intra_node_bandwidth_gb_per_s,
            "inter_node_bandwidth_gb_per_s": cluster.inter_node_bandwidth_gb_per_s,
            "host_memory_gib_per_node": cluster.host_memory_gib_per_node,
            "pcie_bandwidth_gb_per_s": cluster.pcie_bandwidth_gb_per_s,
            "nvme_bandwidth_gb_per_s": cluster.nvme_bandwidth_gb_per_s,
            "nvme_capacity_gib_per_node": cluster.nvme_capacity_gib_per_node}


def estimate_from_dict(doc: dict) -> Estimate:
    """Rebuild (and re-estimate) the plan of an ``estimate --json`` document or one ``plan --json`` candidate."""
    problems = [f"missing '{k}' block (give the output of `autotune estimate --json` or one candidate of "
                f"`autotune plan --json`)" for k in ("model", "cluster", "plan") if k not in doc]
    if not problems:
        if "spec" not in doc["model"] or "spec" not in doc["cluster"]:
            problems.append("the model and cluster blocks need their 'spec' (written by autotune 0.1+)")
    if problems:
        raise InputError(problems, subject="plan JSON")
    model = model_from_mapping(doc["model"]["spec"], origin="plan JSON model")
    spec = dict(doc["cluster"]["spec"])
    gpu = spec.pop("gpu")
    num_gpus = spec.pop("num_nodes") * spec["gpus_per_node"]
    per_node = spec.pop("gpus_per_node")
    cluster = load_cluster(gpu=gpu, num_gpus=num_gpus, gpus_per_node=per_node, **spec)
    plan_doc = dict(doc["plan"])
    if "framework" in plan_doc:  # files written before engines were first-class
        plan_doc.setdefault("engine", plan_doc.pop("framework"))
    try:
        plan = ParallelPlan(**plan_doc)
    except TypeError as err:
        raise InputError([f"plan block: {err}"], subject="plan JSON") from None
    problems = [msg for _, msg in plan_problems(model, cluster, plan)]
    if problems:
        raise InputError(problems, subject="plan JSON")
    return estimate(model, cluster, plan)


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """One plan's prediction (the contract's ``estimate --json``)."""

    @property
    def fits(self) -> bool:
        return self.memory.fits

    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    memory: MemoryEstimate
    time: StepTimeEstimate

    def to_dict(self) -> dict:
        return {
            "model": {"name": self.model.name, "num_params": self.model.num_params,
                      "num_active_params": self.model.num_active_params, "spec": self.model.to_dict()},
            "cluster": {"gpu": self.cluster.gpu.name, "num_gpus": self.cluster.num_gpus,
                        "gpus_per_node": self.cluster.gpus_per_node, "spec": cluster_spec_dict(self.cluster)},
            "plan": self.plan.to_dict(),
            "memory": self.memory.to_dict(),
            "time": self.time.to_dict(),
            "uncertainty": self.uncertainty.to_dict(),
        }

    @property
    def uncertainty(self) -> Uncertainty:
        """The interval of the step time and throughput (autotune.cost.uncertainty)."""
        return uncertainty_of(self.plan, self.cluster, moe=self.model.is_moe)


def estimate(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, settings: MemorySettings | None = None,
             time_settings: TimeSettings | None = None) -> Estimate:
    """The memory ledger and step time of one (valid) plan."""
    return Estimate(model=model, cluster=cluster, plan=plan, memory=estimate_memory(model, cluster, plan, settings),
                    time=estimate_step_time(model, cluster, plan, time_settings))
