"""Activation CPU offload (``ParallelPlan.activation_offload_layers``, Megatron --cpu-offloading-num-layers): the
ledger drops the offloaded layers' saved activations into host memory, the copies cost time only where the host link
cannot keep up with the layers' compute, and Megatron-core's refusals (transformer_config.py at d98e8a6) hold."""

import pytest

from autotune.api import make_plan
from autotune.cost.activation_offload import offload_exposed_s
from autotune.cost.memory import estimate_memory
from autotune.cost.step_time import estimate_step_time
from autotune.engines import engine_for
from autotune.errors import InputError
from autotune.specs.hardware import GB
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset

MODEL = load_model_preset("llama3-70b")
GB300 = load_cluster(gpu="gb300", num_gpus=64)
B200 = load_cluster(gpu="b200", num_gpus=64)


def _plan(cluster=GB300, **kw):
    base = dict(engine="megatron", zero_stage=3, seq_len=8192, micro_batch_size=2, global_batch_size=256,
                precision="fp8", grad_dtype="bf16", recompute="none")
    return make_plan(MODEL, cluster, **(base | kw))


def test_ledger_drops_the_offloaded_layers_activations_into_host_memory():
    plain, off20, off40 = (estimate_memory(MODEL, GB300, _plan(activation_offload_layers=n)) for n in (None, 20, 40))
    per_layer = plain.activation_parts["layers"] / MODEL.num_layers  # Llama-3: every layer alike
    assert off20.activation_parts["layers"] == pytest.approx(plain.activation_parts["layers"] - 20 * per_layer)
    assert off40.activation_parts["layers"] == pytest.approx(plain.activation_parts["layers"] - 40 * per_layer)
    # the embedding, the output layer and the loss keep theirs
    assert {k: v for k, v in off20.activation_parts.items() if k != "layers"} == pytest.approx(
        {k: v for k, v in plain.activation_parts.items() if k != "layers"})
    # every GPU of the node holds its own offloaded layers in host memory
    assert off20.host_per_node - plain.host_per_node == pytest.approx(20 * per_layer * GB300.gpus_per_node)
    assert off40.host_per_node > off20.host_per_node
    # NVIDIA's GB300 row (20 layers offloaded) does not fit without the offload and fits with it
    assert not plain.fits and off20.fits


def test_copies_hide_behind_compute_on_nvlink_c2c_and_show_over_pcie():
    plan = _plan(activation_offload_layers=40)
    gb300 = estimate_step_time(MODEL, GB300, plan)
    assert gb300.offload_s == 0.0  # 225 GB/s each way: the copies take less than a pass's compute
    assert gb300.step_time_s == pytest.approx(estimate_step_time(MODEL, GB300, _plan()).step_time_s)
    b200 = estimate_step_time(MODEL, B200, _plan(B200, activation_offload_layers=40))
    assert b200.offload_s > 0.0  # PCIe Gen5 x16, 50 GB/s each way
    assert b200.step_time_s > estimate_step_time(MODEL, B200, _plan(B200)).step_time_s


def test_exposed_copy_time_is_what_each_direction_takes_beyond_its_pass():
    bw = B200.pcie_bandwidth_gb_per_s * GB
    assert offload_exposed_s(10 * bw, B200, forward_s=4.0, backward_s=8.0) == pytest.approx(6.0 + 2.0)
    assert offload_exposed_s(1 * bw, B200, forward_s=4.0, backward_s=8.0) == 0.0
    assert offload_exposed_s(0.0, B200, forward_s=0.0, backward_s=0.0) == 0.0


@pytest.mark.parametrize(("kw", "words"), [
    (dict(pp=2), "pipeline parallelism"),
    (dict(recompute="selective"), "activation recomputation"),
    (dict(recompute="full"), "activation recomputation"),
    (dict(cuda_graph="transformer_engine"), "CUDA graphs"),
])
def test_megatron_refuses_offload_with_pipeline_recompute_or_layer_graphs(kw, words):
    with pytest.raises(InputError, match=words):
        _plan(activation_offload_layers=20, **kw)


def test_megatron_refuses_offloading_every_layer_and_other_engines_refuse_it():
    with pytest.raises(InputError, match="less than 80"):
        _plan(activation_offload_layers=80)
    _plan(activation_offload_layers=20, cuda_graph="full-iteration")  # a whole-iteration graph is allowed
    with pytest.raises(InputError, match="Megatron"):
        make_plan(MODEL, GB300, engine="fsdp", zero_stage=3, seq_len=8192, global_batch_size=256, recompute="none",
                  activation_offload_layers=20)
    assert engine_for(_plan(activation_offload_layers=20)).support.activation_offload


GB200 = load_cluster(gpu="gb200", num_gpus=64)


def test_te_cross_entropy_keeps_the_16_bit_logits_not_an_fp32_softmax():
    """NVIDIA's GB200 Megatron-FSDP row (40 layers offloaded) runs Megatron-Bridge's loss, Transformer Engine's
    parallel_cross_entropy (MemorySettings.te_cross_entropy): the logits stay bf16 with the gradient in them, so the
    loss keeps 2 bytes per logit where Megatron-LM's fp32 vocab-parallel cross entropy keeps 4; nothing else moves."""
    from autotune.specs.settings import MemorySettings

    plan = _plan(GB200, activation_offload_layers=40, fp8_recipe="te-current")
    fp32, te = (estimate_memory(MODEL, GB200, plan, MemorySettings(te_cross_entropy=v)) for v in (None, True))
    logits = 8192 * 2 * MODEL.vocab_size  # tokens x vocab entries of this GPU (tp 1)
    assert fp32.activation_parts["output_and_loss"] - te.activation_parts["output_and_loss"] == pytest.approx(
        2 * logits)
    assert fp32.activation_parts["layers"] == te.activation_parts["layers"]
    assert "loss_backward" not in te.activation_parts
    assert estimate_memory(MODEL, GB200, plan, MemorySettings(te_cross_entropy=False)).total == pytest.approx(
        fp32.total)  # fp32: Megatron-LM's own loss
    assert fp32.total - te.total > 2 * logits  # the allocator's reserve on those bytes goes too
