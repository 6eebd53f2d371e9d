"""Megatron-core's MoE layer on the host: what its router and token dispatcher issue per layer, measured in its own
code, against the launches the cost model charges for them (autotune/cost/launch.py ``layer_kernels``).

    python bench/megatron_moe_host.py [--megatron FOLDER]

Megatron-core 0.19.2's ``MoELayer`` (TopKRouter, the all-to-all dispatcher, SequentialMLP experts; the local layer
spec, no Transformer Engine) runs forward and backward on this machine's CPU, one rank, with tensors so small that
the arithmetic is negligible: what is left is the host's work, Python and the PyTorch dispatcher, op by op, as on a
GPU host. It is timed per part and expressed in ``torch.nn.Linear`` forwards timed the same way here: the unit the
model's launch time is (``autotune.engines.facts.EAGER_OP_S``: one Linear forward's CPU time on an H100 host). The
routed experts are timed alone and taken out (their host time is ``autotune.cost.expert_host``'s, for the grouped
GEMMs Transformer Engine runs).

Megatron-core comes from the test tooling's cache (tests/emit/bridge_tooling.py installs it on first use:
~/.cache/autotune-test-tools/megatron-bridge-0.6, or AUTOTUNE_TEST_TOOLS); ``--megatron`` names another folder.
CUDA streams, events and ``device="cuda"`` tensors are stood in for by CPU ones: the dispatcher's device-to-host
syncs then cost nothing, which is what is left out here.

What it says (2026-12-05, softmax top-6 of 8 experts, aux loss, an idle host): the router and the dispatcher's
pre-processing issue ~48 Linear forwards forward and ~25 backward, the rest of the block beside the experts ~36 and
~22 (131 in all), against the 7 + 8 and 7 + 7 launches the model counts. Charging them (tried in
autotune/cost/launch.py, the unfused permutations counted as Transformer Engine's one fused call each: 37 + 20 and
24 + 32) made NVIDIA's Blackwell rows worse, not better (bench/accuracy_nvidia_recipes.py: the token-dropping
Qwen3-235B GB200 row +5% -> -32%, Qwen3-235B's p90 20% -> 26%), and the dropless small-batch rows it was meant for
moved 6 points of their +40%: the host-bound MoE rows' gap is not the router's or the dispatcher's Python. Timings
taken while other jobs load the CPU are not comparable (the unit and the parts drift apart); the operator counts
printed beside them (PyTorch's dispatcher, 2026-12-07: 50 kernels and 99 views beside the experts, forward +
backward) do not drift.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import warnings
from pathlib import Path

PARTS = ("route", "preprocess", "dispatch", "routed_experts_compute", "combine", "postprocess")
"""MoELayer's methods, in the order its forward calls them (megatron/core/transformer/moe/moe_layer.py, 0.19.2)."""


def megatron_folder(given: str | None) -> Path:
    if given:
        return Path(given)
    cache = Path(os.environ.get("AUTOTUNE_TEST_TOOLS", Path.home() / ".cache" / "autotune-test-tools"))
    return cache / "megatron-bridge-0.6"


def _cpu_stand_ins(torch) -> None:
    """CUDA calls Megatron-core makes at construction and in the dispatcher, answered on the CPU."""

    class Stream:
        def __init__(self, *args, **kwargs): pass
        def wait_stream(self, *args): pass
        def wait_event(self, *args): pass
        def record_event(self, *args, **kwargs): return Stream()
        def record(self, *args, **kwargs): pass
        def synchronize(self): pass
        def query(self): return True

    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.Stream = torch.cuda.Event = Stream
    torch.cuda.current_stream = lambda *a, **k: Stream()
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()
    torch.cuda.synchronize = lambda *a, **k: None
    torch.Tensor.cuda = lambda self, *a, **k: self

    from torch.overrides import TorchFunctionMode

    def cpu(device):
        cuda = (isinstance(device, str) and device.startswith("cuda")) or isinstance(device, int) or (
            isinstance(device, torch.device) and device.type == "cuda")
        return "cpu" if cuda else device

    class CudaOnCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if "device" in kwargs:
                kwargs["device"] = cpu(kwargs["device"])
            return func(*args, **kwargs)

    CudaOnCpu().__enter__()


def build_layer(torch, experts: int, topk: int, shared: int):
    """One Megatron-core transformer layer with an MoE block, on one gloo rank."""
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state
    parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=1)
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
    get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig
    config = TransformerConfig(
        num_layers=1, hidden_size=64, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=128,
        use_cpu_initialization=True, bf16=False, params_dtype=torch.float32, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, normalization="RMSNorm", add_bias_linear=False,
        num_moe_experts=experts, moe_router_topk=topk, moe_ffn_hidden_size=32,
        moe_shared_expert_intermediate_size=shared or None, moe_token_dispatcher_type="alltoall",
        moe_grouped_gemm=False, moe_aux_loss_coeff=1e-3, moe_router_load_balancing_type="aux_loss")
    return build_module(get_gpt_layer_local_spec(num_experts=experts, moe_grouped_gemm=False), config=config,
                        layer_number=1)


def charged_launches(experts: int, topk: int) -> dict[str, tuple[int, int]]:
    """(forward, backward) launches the cost model charges an MoE layer's router + pre-processing and the rest
    beside the routed experts (autotune.cost.launch.layer_kernels' parts; backward two GEMMs per forward GEMM and
    one kernel per other kernel, as ``layer_launches`` counts them), for a bf16 tp-1 plan without CUDA graphs."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from autotune.cost.launch import layer_kernels
    from autotune.specs.model import ModelSpec, MoESpec
    from autotune.specs.plan import ParallelPlan
    model = ModelSpec(name="probe", num_layers=1, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                      ffn_hidden_size=128, vocab_size=128,
                      moe=MoESpec(num_experts=experts, top_k=topk, expert_ffn_hidden_size=32))
    plan = ParallelPlan(engine="megatron", dp=1, global_batch_size=1, grad_accum_steps=1, seq_len=16)
    parts = layer_kernels(model, plan, True)
    passes = {name: (g + o, 2 * g + o) for name, (g, o) in parts.items()}
    return {"router_preprocess": tuple(map(sum, zip(passes["moe_router"], passes["moe_preprocess"]))),
            "rest": passes["moe_rest"]}


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ROUNDS = 7


def measure(torch, moe, repeats: int) -> dict[str, float]:
    """Microseconds per layer call: each part's forward, the backward, the experts alone (forward + backward), the
    router and pre-processing alone (forward + backward), and one nn.Linear forward."""
    spent: dict[str, float] = {}

    def timed(obj, name: str, label: str):
        inner = getattr(obj, name)

        def call(*args, **kwargs):
            start = time.perf_counter()
            out = inner(*args, **kwargs)
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - start
            return out
        setattr(obj, name, call)

    for part in PARTS:
        timed(moe, part, part)
    experts_forward = moe.experts.forward
    seen = {}

    def keep(*args, **kwargs):
        seen["args"] = args
        start = time.perf_counter()
        out = experts_forward(*args, **kwargs)
        spent["experts_forward"] = spent.get("experts_forward", 0.0) + time.perf_counter() - start
        return out
    moe.experts.forward = keep
    hidden = torch.randn(16, 1, 64, requires_grad=True)

    def layer():
        out, _ = moe(hidden)
        start = time.perf_counter()
        out.sum().backward()
        spent["backward"] = spent.get("backward", 0.0) + time.perf_counter() - start

    def router_and_preprocess():
        probs, routing_map = moe.route(hidden)
        tokens, probs = moe.preprocess(hidden, probs, routing_map)
        (tokens.sum() + probs.sum()).backward()

    def experts():  # on the input the layer's last call dispatched to them
        tokens, per_expert, probs = seen["args"][:3]
        out, _ = experts_forward(tokens.detach().requires_grad_(), per_expert, probs.detach())
        out.sum().backward()

    linear, x = torch.nn.Linear(64, 64), torch.randn(16, 64, requires_grad=True)
    timed_parts = (("layer", layer), ("router_preprocess", router_and_preprocess), ("experts", experts),
                   ("linear", lambda: linear(x)))
    for _, fn in timed_parts:
        for _ in range(5):
            fn()
    best: dict[str, tuple[float, dict]] = {}
    # The parts interleaved, round after round, so that a load on a shared host falls on each alike (the layer less
    # the experts went negative when they were timed minutes apart); of each, the fastest round: load only adds time.
    for _ in range(ROUNDS):
        for name, fn in timed_parts:
            n = repeats * (50 if name == "linear" else 1)
            spent.clear()
            start = time.perf_counter()
            for _ in range(n):
                fn()
            took = (time.perf_counter() - start) / n
            if name not in best or took < best[name][0]:
                best[name] = (took, {k: v / n for k, v in spent.items()})
    out = {name: took * 1e6 for name, (took, _) in best.items()}
    out.update({k: v * 1e6 for k, v in best["layer"][1].items()})
    parts = best["router_preprocess"][1]
    out["router_preprocess_fwd"] = (parts.get("route", 0) + parts.get("preprocess", 0)) * 1e6
    return out


def count_ops(torch, moe) -> dict[str, int]:
    """PyTorch operators the MoE block issues per call, forward + backward (aten ops but views, each one kernel launch
    or more on a GPU; and the views), and those of the routed experts alone on the same input: counted by the dispatcher, so unlike the
    timings they do not drift with the host's load."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = self.views = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.views += func.is_view  # a view launches nothing, though the host dispatches it
            self.ops += not func.is_view
            return func(*args, **(kwargs or {}))

    hidden = torch.randn(16, 1, 64, requires_grad=True)
    seen = {}
    experts_forward = moe.experts.forward

    def keep(*args, **kwargs):
        seen["args"] = args
        return experts_forward(*args, **kwargs)
    moe.experts.forward = keep
    counts = {}
    with Count() as layer:
        out, _ = moe(hidden)
        out.sum().backward()
    counts["layer"], counts["layer_views"] = layer.ops, layer.views
    moe.experts.forward = experts_forward
    tokens, per_expert, probs = seen["args"][:3]
    tokens, probs = tokens.detach().requires_grad_(), probs.detach()
    with Count() as experts:
        out, _ = experts_forward(tokens, per_expert, probs)
        out.sum().backward()
    counts["experts"], counts["experts_views"] = experts.ops, experts.views
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--megatron", help="folder holding megatron-core 0.19.2 (default: the test tooling's cache)")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=60)
    args = ap.parse_args(argv)
    folder = megatron_folder(args.megatron)
    if not (folder / "megatron" / "core").is_dir():
        print(f"no megatron-core under {folder}: run `python -m pytest tests/emit/test_megatron_bridge_applied.py` "
              "once (it installs it there) or give --megatron FOLDER", file=sys.stderr)
        return 2
    sys.path.insert(0, str(folder))
    warnings.filterwarnings("ignore")
    import torch
    _cpu_stand_ins(torch)
    moe = build_layer(torch, args.experts, args.topk, 0).mlp
    ops = count_ops(torch, moe)
    t = measure(torch, moe, args.repeats)
    unit = t["linear"]
    non_expert = t["layer"] - t["experts"]
    rp_fwd, rp_bwd = t["router_preprocess_fwd"], t["router_preprocess"] - t["router_preprocess_fwd"]
    rest_fwd = sum(t.get(p, 0.0) for p in PARTS) - rp_fwd - t["experts_forward"]
    rest_bwd = non_expert - rp_fwd - rp_bwd - rest_fwd
    print(f"Megatron-core MoELayer on this CPU, {args.experts} experts, top-{args.topk}; unit: one nn.Linear forward "
          f"here, {unit:.1f} us (the model's launch time is one on an H100 host, 13.48 us)")
    print(f"{'part':<54}{'us':>8}{'Linear forwards':>17}")
    for name, value in (("router + dispatcher pre-processing, forward", rp_fwd),
                        ("router + dispatcher pre-processing, backward", rp_bwd),
                        ("the rest beside the experts, forward", rest_fwd),
                        ("the rest beside the experts, backward", rest_bwd),
                        ("the layer's MoE block, forward + backward", t["layer"]),
                        ("the routed experts alone, forward + backward", t["experts"]),
                        ("the MoE block beside the experts, forward + backward", non_expert)):
        print(f"{name:<54}{value:>8.0f}{value / unit:>17.0f}")
    print(f"{'operators, forward + backward':<54}{'kernels':>8}{'+ views':>17}")
    for name, key in (("the MoE block beside the experts", "layer"), ("the routed experts", "experts")):
        real = ops[key] - (ops["experts"] if key == "layer" else 0)
        views = ops[key + "_views"] - (ops["experts_views"] if key == "layer" else 0)
        print(f"{name:<54}{real:>8d}{views:>17d}")
    charged = charged_launches(args.experts, args.topk)
    print(f"the model charges (autotune/cost/launch.py layer_kernels, bf16, tp 1): router + pre-processing "
          f"{charged['router_preprocess'][0]} launches forward, {charged['router_preprocess'][1]} backward; the rest "
          f"{charged['rest'][0]} and {charged['rest'][1]}; {sum(map(sum, charged.values()))} in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
