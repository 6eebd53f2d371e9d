"""Activation CPU offload (``ParallelPlan.activation_offload_layers``, Megatron-core ``--cpu-offloading-num-layers``):
what leaves the GPU, what the host holds, and the copy time the layers' compute does not hide.

How Megatron-core runs it: each TransformerBlock layer's forward runs inside Transformer Engine's
``get_cpu_offload_context(cpu_offloading, cpu_offloading_num_layers, num_layers, ...)`` and its output passes
through the returned ``group_prefetch_offload_commit_async`` (Megatron-LM @d98e8a6
megatron/core/transformer/transformer_block.py:304-318 and :737-742). Transformer Engine @d0067d0
docs/features/other_optimizations/cpu_offloading/cpu_offloading.rst, "Default Offloading Scheduling": the first
``num_layers`` layers are offloaded; a copy starts as soon as a tensor is saved for backward; "at most
(model_layers - num_layers) sets of activations are on GPU at any time; both compute and reload may be stalled to
enforce this limit"; reloading completes by the layer's backward; the copies run on a side stream
(transformer_engine/pytorch/cpu_offload.py ``get_cpu_offload_context``: ``offload_stream``). The code at v2.14 (the
26.04 containers'): every tensor a layer saves for backward leaves, but parameters, tensors marked not to (TE's
modules mark their weights, layernorm_linear.py:445-452) and ones under 256K elements (cpu_offload.py:452-473,
FP8 tensors by their components, :374-385); layer i's GPU copy is freed before layer L - N + i runs forward and
reloaded as layer L - 1 - N + i starts backward (:600-624, :626-645), so L - N sets are never exceeded;
Megatron-core 0.19.2 passes ``cpu_offloading_num_layers`` and ``config.num_layers`` (transformer_block.py:298-312)
with activations on and weights off by default (model_parallel_config.py:471-474; TE ignores weights, cpu_offload.py:824-835).

So, per GPU and micro-batch (Megatron refuses offload with pipeline parallelism, so one micro-batch is in flight):
- GPU: the stage's layers' saved activations less the first N layers' (``autotune.cost.activations``: the "layers"
  part); the embedding, the output layer and the loss keep theirs;
- host: the first N layers' saved activations (pinned host buffers), every GPU of a node its own;
- time: N layers' bytes go device-to-host over the GPU's host link during the forward and come back during the
  backward (``ClusterSpec.pcie_bandwidth_gb_per_s``: PCIe Gen5 x16 on DGX B200 / B300, NVLink-C2C on GB200 /
  GB300, per GPU and direction, gpus.yaml); what a direction's copies take beyond that pass's compute waits.
  The copies' HBM traffic is not counted (tiny beside the GEMMs; TE's docs name it for memory-bound kernels).
"""

from __future__ import annotations

from autotune.cost.activations import stage_activation_bytes
from autotune.engines.facts import ActivationFacts
from autotune.specs.hardware import GB, ClusterSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import ParallelPlan

__all__ = ["offloaded_activation_bytes", "offload_exposed_s"]


def offloaded_activation_bytes(model: ModelSpec, plan: ParallelPlan, facts: ActivationFacts, scheme: str) -> float:
    """Bytes of saved activations one GPU keeps in host memory per micro-batch: the first
    ``activation_offload_layers`` layers' (0 without offload). The difference of the stage's "layers" part with
    and without the offload, so it is exactly what the ledger removed from the GPU."""
    if not plan.activation_offload_layers:
        return 0.0
    kept = stage_activation_bytes(model, plan, 0, facts, scheme)["layers"]
    every = stage_activation_bytes(model, plan.with_(activation_offload_layers=None), 0, facts, scheme)["layers"]
    return max(0.0, every - kept)


def offload_exposed_s(offloaded_bytes: float, cluster: ClusterSpec, forward_s: float, backward_s: float) -> float:
    """Per micro-batch, the seconds the offload's copies add: the device-to-host copy of ``offloaded_bytes`` behind
    the forward (``forward_s``), the host-to-device one behind the backward (``backward_s``), each over the GPU's
    host link one way; what a copy takes beyond its pass waits (TE stalls compute to keep its limit of sets)."""
    if offloaded_bytes <= 0:
        return 0.0
    copy_s = offloaded_bytes / (cluster.pcie_bandwidth_gb_per_s * GB)
    return max(0.0, copy_s - forward_s) + max(0.0, copy_s - backward_s)
