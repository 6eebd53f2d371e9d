"""A full-iteration CUDA graph (``--cuda-graph full-iteration``, Megatron's FullCudaGraphWrapper): the whole
forward-backward replayed by one launch, so no layer waits for the host; no per-layer static buffers, only each
micro-batch's input batch; the rules Megatron sets for it; its Megatron-LM flags per core release and its Bridge
fields, read back to the same plan; engines without it refuse it with the way out; the NVIDIA bench's full-iteration
rows ask for it.
"""

from __future__ import annotations

import pytest

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.cost.launch import STATIC_BATCH_BYTES_PER_TOKEN, launch_exposed_s
from autotune.errors import InputError
from autotune.job_files import read_job
from autotune.rules import plan_problems
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan
from autotune.specs.presets import load_model_preset

GPU = "h100-sxm-80gb"
LLAMA = load_model_preset("llama3-8b")
QWEN = load_model_preset("qwen3-30b-a3b")
C64 = load_cluster(gpu=GPU, num_gpus=64)
C16 = load_cluster(gpu=GPU, num_gpus=16)


def _llama_tp8(seq_len: int, **kw) -> ParallelPlan:
    return make_plan(LLAMA, C64, engine="megatron", global_batch_size=64, tp=8, sequence_parallel=True, zero_stage=1,
                     seq_len=seq_len, **({"recompute": "none"} | kw))


def test_the_whole_iteration_graph_leaves_no_launch_wait_where_layer_graphs_leave_some():
    # seq 256 over tp 8: the host's launches outlast the GPU work; graphs of the attention leave the MLP's kernels
    eager, full = (estimate(LLAMA, C64, _llama_tp8(256, **kw)) for kw in ({}, {"cuda_graph": "full-iteration"}))
    assert full.time.compute_s < eager.time.compute_s
    # a layer whose GPU work takes no time: its layer graphs' own launches wait, the whole iteration's do not
    local = _llama_tp8(256, cuda_graph="local")
    assert min(launch_exposed_s(LLAMA, local, False, 0.0, 0.0, 5e-6)) > 0
    assert launch_exposed_s(LLAMA, full.plan, False, 0.0, 0.0, 5e-6) == (0.0, 0.0)


def test_the_whole_iteration_graph_takes_the_routed_experts_host_time_too():
    def run(cg):
        plan = make_plan(QWEN, C16, engine="megatron", global_batch_size=64, tp=1, ep=8, zero_stage=1, seq_len=1024,
                         recompute="none", cuda_graph=cg,
                         moe_dispatcher="flex-hybridep")  # the dispatcher a whole-iteration graph captures
        return estimate(QWEN, C16, plan)
    local, full = run("local"), run("full-iteration")
    assert full.time.compute_s < local.time.compute_s


def test_memory_keeps_the_input_batches_not_per_layer_buffers():
    local, full = (estimate(LLAMA, C64, _llama_tp8(4096, cuda_graph=cg)) for cg in ("local", "full-iteration"))
    plan = full.plan
    assert full.memory.buffer_parts["cuda_graphs"] == pytest.approx(
        STATIC_BATCH_BYTES_PER_TOKEN * plan.micro_batch_size * plan.seq_len * plan.num_microbatches)
    assert full.memory.buffer_parts["cuda_graphs"] < local.memory.buffer_parts["cuda_graphs"] / 100
    assert full.memory.total < local.memory.total


def test_full_recompute_runs_only_under_the_whole_iteration_graph():
    def problems(cg):
        plan = ParallelPlan(engine="megatron", tp=2, dp=8, sequence_parallel=True, zero_stage=1, global_batch_size=64,
                            grad_accum_steps=8, seq_len=4096, recompute="full", cuda_graph=cg)
        return [text for rule, text in plan_problems(LLAMA, C16, plan) if rule == "megatron:cuda_graph"]
    assert problems("full-iteration") == []
    assert any("full iteration CUDA graph" in text and "full-iteration" in text for text in problems("local"))


def test_a_scope_with_the_whole_iteration_graph_is_refused():
    with pytest.raises(InputError, match="cuda_graph_scope.*whole iteration"):
        ParallelPlan(cuda_graph="full-iteration", cuda_graph_scope=("attn",))


def test_engines_without_it_refuse_it_saying_drop_the_flag():
    plan = ParallelPlan(engine="fsdp", dp=16, zero_stage=3, global_batch_size=64, grad_accum_steps=4,
                        seq_len=4096, cuda_graph="full-iteration")
    problems = plan_problems(LLAMA, C16, plan)
    assert any("cuda_graph" in rule and "drop --cuda-graph" in text for rule, text in problems), problems


@pytest.mark.parametrize(("release", "spelled"), [
    ("0.16", ["--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration"]),
    ("0.17", ["--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration"]),
    ("0.18", ["--cuda-graph-impl", "full_iteration"]),
    ("0.19", ["--cuda-graph-impl", "full_iteration"])])
def test_megatron_args_per_release_and_back(tmp_path, release, spelled):
    from autotune.emit.megatron import megatron_args
    from autotune.emit.megatron_flags import megatron_flag_table
    from autotune.emit.options import EmitOptions

    plan = _llama_tp8(4096, cuda_graph="full-iteration")
    argv = megatron_args(LLAMA, C64, plan, EmitOptions(megatron_version=release))
    at = argv.index("--cuda-graph-impl")
    assert argv[at: at + len(spelled)] == spelled and "--no-check-for-nan-in-loss-and-grad" in argv
    table = megatron_flag_table(release)
    assert spelled[1] in table["--cuda-graph-impl"].choices  # the release's parser takes the value
    path = tmp_path / "megatron_args.sh"
    path.write_text("MEGATRON_ARGS=(\n  " + " ".join(argv) + "\n)\n")
    back = read_job([str(path)], gpu=GPU, num_gpus=64, model="llama3-8b").plan
    assert (back.cuda_graph, back.cuda_graph_scope) == ("full-iteration", None)


def test_bridge_fields_and_back(tmp_path):
    est = estimate(LLAMA, C64, _llama_tp8(4096, cuda_graph="full-iteration"))
    files = render_bundle(est).files
    args = files["bridge_overrides.args"]
    assert "model.cuda_graph_impl=full_iteration" in args and "model.cuda_graph_modules=[]" in args
    assert "rerun_state_machine.check_for_nan_in_loss=false" in args
    for names in (("megatron_args.sh", "launch_torchrun.sh"), ("bridge_overrides.yaml",), ("bridge_overrides.args",)):
        for name in names:
            (tmp_path / name).write_text(files[name])
        job = read_job([str(tmp_path / n) for n in names], gpu=GPU, num_gpus=64, model="llama3-8b")
        assert job.plan.cuda_graph == "full-iteration", names
        again = estimate(job.model, job.cluster, job.plan, job.settings)
        assert again.memory.total == pytest.approx(est.memory.total, rel=1e-9), names
