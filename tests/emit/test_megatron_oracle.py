"""Megatron-LM itself judges what we write: every emitted ``megatron_args.sh``, over a property test of many plans
(tp / pp / vpp / cp / ep / distributed optimizer / recompute / precision / bf16 gradients, several presets and world sizes), passes
Megatron-LM's own ``parse_args()`` + ``validate_args()`` (``../shared/oracles/megatron-lm/megatron_args_check.py``),
and our linter agrees with Megatron-LM on arguments it rejects.

The oracle lives beside the checkout (``../shared``); where it is absent these tests skip, saying so. One oracle
process serves every example (its imports take ~7 s; each verdict then takes a fraction of a second).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.emit.megatron import megatron_args_problems
from autotune.emit.shell_args import parse_shell_args_with_lines
from autotune.errors import InputError
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset

REPO = Path(__file__).resolve().parents[2]
ORACLE = REPO.parent / "shared" / "oracles" / "megatron-lm" / "megatron_args_check.py"
WORKER = Path(__file__).parent / "fixtures" / "megatron_oracle_worker.py"
pytestmark = pytest.mark.skipif(not ORACLE.is_file(), reason=f"Megatron-LM oracle not found at {ORACLE} "
                                                             "(../shared is beside the checkout in CI only)")
pytestmark = [pytestmark, pytest.mark.slow]  # the Megatron-LM oracle is a process of its own


class Oracle:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(WORKER), str(ORACLE)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=str(REPO))
        self.calls = 0

    def verdict(self, world_size: int, *, argv=None, args_file=None, env=None) -> dict:
        request = {"world_size": world_size} | ({"argv": list(argv)} if argv is not None else
                                                {"args_file": str(args_file)}) | ({"env": env} if env else {})
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the oracle worker died"
        self.calls += 1
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def oracle():
    o = Oracle()
    yield o
    o.close()


# Presets with what varies: GQA + RoPE + SwiGLU (Llama 3), MoE (Mixtral), learned positions + biases (GPT-3),
# tiny ones for odd sizes. Sizes are drawn so that most plans are valid; invalid ones are skipped by make_plan.
PRESETS = ["llama3-8b", "llama3-70b", "mixtral-8x7b", "gpt3-175b", "tiny-llama", "tiny-gpt"]

plans = st.fixed_dictionaries({
    "model": st.sampled_from(PRESETS),
    "tp": st.sampled_from([1, 2, 4]),
    "pp": st.sampled_from([1, 2, 4]),
    "vpp": st.sampled_from([1, 2]),
    "cp": st.sampled_from([1, 2]),
    "ep": st.sampled_from([1, 2, 4]),
    "dp": st.sampled_from([1, 2, 4]),
    "zero_stage": st.sampled_from([0, 1, 2, 3]),  # 2 / 3: Megatron-FSDP (--use-megatron-fsdp)
    "recompute": st.sampled_from(["none", "selective", "full"]),
    "recompute_num_layers": st.sampled_from([None, 1]),
    "precision": st.sampled_from(["bf16", "fp16", "fp8", "fp4"]),  # fp4: NVFP4 (--fp4-format), drawn on B200
    "grad_dtype": st.sampled_from([None, "bf16"]),  # --grad-reduce-in-bf16
    # --fp8-recipe delayed / tensorwise / blockwise / mxfp8 (MXFP8 plans drawn on B200: Blackwell only)
    "fp8_recipe": st.sampled_from([None, "te-delayed", "te-current", "te-blockwise", "te-mxfp8"]),
    "tp_overlap": st.sampled_from([None, "none", "userbuffers"]),  # --tp-comm-overlap
    "recompute_modules": st.sampled_from([None, ("core_attn", "mlp"), ("moe_act",)]),  # --recompute-modules
    "micro_batch_size": st.sampled_from([1, 2]),
    "accumulation": st.sampled_from([1, 4]),
    "seq_len": st.sampled_from([1024, 4096]),
})

CHECKED: list[str] = []


def _emitted_args(tmp_dir: Path, drawn: dict) -> tuple[Path, int] | None:
    model = load_model_preset(drawn["model"])
    # Steer the draw to plans the engine runs (what it refuses is tested in tests/engines): MoE-only ep carved
    # out of dp x cp, vpp only with layers per stage to interleave, seq_len within a learned position table.
    if model.moe is None or (drawn["dp"] * drawn["cp"]) % drawn["ep"]:
        drawn["ep"] = 1
    if drawn["pp"] == 1 or model.num_layers % drawn["pp"] or (model.num_layers // drawn["pp"]) % drawn["vpp"]:
        drawn["vpp"] = 1
    if model.position_embedding == "learned":
        drawn["seq_len"] = min(drawn["seq_len"], model.max_position_embeddings)
    world = drawn["tp"] * drawn["pp"] * drawn["cp"] * drawn["dp"]
    blackwell = drawn["precision"] == "fp4" or (drawn["precision"] == "fp8" and drawn["fp8_recipe"] == "te-mxfp8")
    cluster = load_cluster(gpu="b200" if blackwell else "h100-sxm-80gb", num_gpus=world)
    kw = {k: drawn[k] for k in ("tp", "pp", "vpp", "cp", "ep", "zero_stage", "recompute", "precision",
                                "micro_batch_size", "seq_len")}
    kw["recompute_num_layers"] = drawn["recompute_num_layers"] if drawn["recompute"] == "full" else None
    kw["grad_dtype"] = drawn["grad_dtype"] if drawn["precision"] != "fp16" else None
    kw["fp8_recipe"] = drawn["fp8_recipe"] if drawn["precision"] == "fp8" else None
    kw["tp_overlap"] = drawn["tp_overlap"] if drawn["tp"] > 1 else None
    kw["recompute_modules"] = drawn.get("recompute_modules") if drawn["recompute"] == "selective" else None
    batch = drawn["micro_batch_size"] * drawn["dp"] * drawn["accumulation"] * drawn["pp"]
    try:
        plan = make_plan(model, cluster, global_batch_size=batch, engine="megatron", **kw)
        files = render_bundle(estimate(model, cluster, plan)).files
    except InputError:
        return None  # a plan the engine refuses: nothing is emitted for it
    path = tmp_dir / "megatron_args.sh"
    path.write_text(files["megatron_args.sh"])
    return path, world


@settings(max_examples=30, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(drawn=plans)
@example(drawn={"model": "llama3-8b", "tp": 2, "pp": 2, "vpp": 1, "cp": 1, "ep": 1, "dp": 2, "zero_stage": 1,
                "recompute": "selective", "recompute_num_layers": None, "precision": "fp8", "grad_dtype": None,
                "fp8_recipe": "te-current", "tp_overlap": "userbuffers", "micro_batch_size": 1, "accumulation": 4,
                "seq_len": 4096, "recompute_modules": ("core_attn", "mlp")})  # the run settings at their non-default values
@example(drawn={"model": "llama3-8b", "tp": 2, "pp": 1, "vpp": 1, "cp": 1, "ep": 1, "dp": 4, "zero_stage": 1,
                "recompute": "none", "recompute_num_layers": None, "precision": "fp8", "grad_dtype": None,
                "fp8_recipe": "te-mxfp8", "tp_overlap": None, "micro_batch_size": 1, "accumulation": 2,
                "seq_len": 4096})  # MXFP8 (--fp8-recipe mxfp8) with FP8 parameters, on Blackwell
@example(drawn={"model": "llama3-8b", "tp": 2, "pp": 2, "vpp": 1, "cp": 1, "ep": 1, "dp": 2, "zero_stage": 0,
                "recompute": "selective", "recompute_num_layers": None, "precision": "fp8", "grad_dtype": None,
                "fp8_recipe": "te-blockwise", "tp_overlap": None, "micro_batch_size": 1, "accumulation": 4,
                "seq_len": 4096})  # blockwise FP8 (--fp8-recipe blockwise), on Hopper
@example(drawn={"model": "llama3-8b", "tp": 2, "pp": 2, "vpp": 2, "cp": 1, "ep": 1, "dp": 2, "zero_stage": 1,
                "recompute": "none", "recompute_num_layers": None, "precision": "fp4", "grad_dtype": "bf16",
                "fp8_recipe": None, "tp_overlap": "userbuffers", "micro_batch_size": 1, "accumulation": 4,
                "seq_len": 4096})  # NVFP4 (--fp4-format e2m1 --fp4-recipe nvfp4 --fp4-param-gather), on Blackwell
@example(drawn={"model": "mixtral-8x7b", "tp": 1, "pp": 1, "vpp": 1, "cp": 1, "ep": 2, "dp": 2, "zero_stage": 0,
                "recompute": "selective", "recompute_num_layers": None, "precision": "fp4", "grad_dtype": None,
                "fp8_recipe": None, "tp_overlap": None, "micro_batch_size": 1, "accumulation": 2,
                "seq_len": 1024})  # NVFP4 without the distributed optimizer (no --fp4-param-gather), MoE
@example(drawn={"model": "llama3-70b", "tp": 2, "pp": 1, "vpp": 1, "cp": 1, "ep": 1, "dp": 4, "zero_stage": 3,
                "recompute": "full", "recompute_num_layers": None, "precision": "fp8", "grad_dtype": None,
                "fp8_recipe": "te-current", "tp_overlap": None, "micro_batch_size": 2, "accumulation": 2,
                "seq_len": 4096})  # Megatron-FSDP optim_grads_params with FP8 parameters (NVIDIA's Llama-3 70B rows)
@example(drawn={"model": "mixtral-8x7b", "tp": 1, "pp": 2, "vpp": 1, "cp": 1, "ep": 2, "dp": 2, "zero_stage": 2,
                "recompute": "selective", "recompute_num_layers": None, "precision": "bf16", "grad_dtype": None,
                "fp8_recipe": None, "tp_overlap": None, "micro_batch_size": 1, "accumulation": 4,
                "seq_len": 4096})  # Megatron-FSDP optim_grads with PP and EP
def test_every_emitted_megatron_args_file_passes_megatron_lm(oracle, tmp_path, drawn):
    emitted = _emitted_args(tmp_path, drawn)
    if emitted is None:
        return
    path, world = emitted
    # The variable as the file leaves it: exported, or unset, which CUDA reads as its default of 8 connections (the
    # checker's own default is 1, what TP / CP runs before Blackwell export).
    _, _, exported = parse_shell_args_with_lines(path.read_text())
    verdict = oracle.verdict(world, args_file=path,
                             env={"CUDA_DEVICE_MAX_CONNECTIONS": exported.get("CUDA_DEVICE_MAX_CONNECTIONS", "8")})
    assert verdict["ok"], f"Megatron-LM rejects what we emitted for {drawn}: {verdict}\n{path.read_text()}"
    assert verdict["data_parallel_size"] == drawn["dp"]
    argv, lines, env = parse_shell_args_with_lines(path.read_text())
    ours = [p for p in megatron_args_problems(argv, world, env=env, lines=lines) if p.severity == "error"]
    assert ours == [], f"our linter rejects what Megatron-LM accepts ({drawn}): {[p.render() for p in ours]}"
    CHECKED.append(drawn["model"])


def test_the_property_test_checked_enough_plans():
    """The property test above must have judged real files, not only skipped refused plans."""
    if not CHECKED:
        pytest.skip("run together with test_every_emitted_megatron_args_file_passes_megatron_lm")
    assert len(CHECKED) >= 20 and len(set(CHECKED)) >= 4, CHECKED


BASE = ["--num-layers", "8", "--hidden-size", "256", "--num-attention-heads", "8", "--seq-length", "1024",
        "--max-position-embeddings", "1024", "--micro-batch-size", "1", "--global-batch-size", "8",
        "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--mock-data",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000", "--lr", "1e-4", "--train-iters", "10", "--bf16"]


def _with(**flags) -> list[str]:
    """BASE with flags replaced (value None: removed; True: a switch added)."""
    argv, names = list(BASE), {f"--{k.replace('_', '-')}": v for k, v in flags.items()}
    out, i = [], 0
    while i < len(argv):
        if argv[i] in names:
            i += 1 if i + 1 >= len(argv) or argv[i + 1].startswith("--") else 2
            continue
        out.append(argv[i])
        i += 1
    for name, value in names.items():
        if value is True:
            out.append(name)
        elif value is not None:
            out += [name, str(value)]
    return out


# Arguments Megatron-LM rejects (world size 8 unless said): our linter must reject each as well.
REJECTED = [
    ("tp-pp-do-not-divide-world", 12, _with()),
    ("heads-not-divisible-by-tp", 8, _with(num_attention_heads=6, tensor_model_parallel_size=4,
                                           pipeline_model_parallel_size=1)),
    ("layers-not-divisible-by-pp", 8, _with(num_layers=9)),
    ("fp16-and-bf16", 8, _with(fp16=True)),
    ("fp4-and-fp8", 8, _with(fp4_format="e2m1", fp8_format="hybrid")),
    ("fp4-param-gather-without-fp4", 8, _with(fp4_param_gather=True)),
    ("overlap-param-gather-without-distributed-optimizer", 8, _with(overlap_param_gather=True,
                                                                    overlap_grad_reduce=True)),
    ("global-batch-not-divisible", 8, _with(global_batch_size=3)),
    ("cp-seq-length", 8, _with(context_parallel_size=2, pipeline_model_parallel_size=1, seq_length=1030,
                               max_position_embeddings=1030)),
    ("selective-with-recompute-method", 8, _with(recompute_granularity="selective", recompute_method="uniform")),
    ("tp-comm-overlap-without-sp", 8, _with(tp_comm_overlap=True)),
    ("unknown-flag", 8, _with(num_layerz=8)),
    ("bad-choice", 8, _with(recompute_granularity="most")),
    ("not-an-integer", 8, _with(num_layers="eight")),
    ("save-without-interval", 8, _with(save="ckpt")),
    ("vpp-with-pp-1", 8, _with(pipeline_model_parallel_size=1, num_layers_per_virtual_pipeline_stage=2)),
    ("experts-not-divisible-by-ep", 8, _with(num_experts=6, expert_model_parallel_size=4,
                                             tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                                             moe_router_topk=2)),
]


@pytest.mark.parametrize("argv,world", [pytest.param(a, w, id=i) for i, w, a in REJECTED])
def test_linter_agrees_with_megatron_on_rejected_arguments(oracle, argv, world):
    verdict = oracle.verdict(world, argv=argv)
    assert not verdict["ok"], f"Megatron-LM accepts {argv}: this case does not test a rejection"
    ours = [p for p in megatron_args_problems(argv, world) if p.severity == "error"]
    assert ours, f"Megatron-LM rejects it ({verdict['error']}) but our linter finds no error"


def test_linter_agrees_with_megatron_on_the_accepted_base(oracle):
    assert oracle.verdict(8, argv=BASE)["ok"]
    assert [p for p in megatron_args_problems(BASE, 8) if p.severity == "error"] == []


@pytest.mark.parametrize(("name", "cp", "flags"), [
    ("gpt-oss-20b", 1, ["--position-embedding-type", "yarn", "--rotary-base", "150000", "--rotary-scaling-factor",
                        "32", "--no-yarn-correction-range-round-to-int", "--softmax-type", "learnable",
                        "--window-size", "127,0", "--window-attn-skip-freq", "2"]),
    ("llama3-8b", 8, ["--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes", "4", "2"]),
    # Llama 4's global layers have no RoPE (every 4th); its chunked layers are one chunk at 4096 tokens (Maverick:
    # Scout's llama3 RoPE scaling, high_freq_factor 1, is not Megatron-core's)
    ("llama4-maverick", 1, ["--rotary-base", "500000", "--no-rope-freq", "4"]),
    # DeepSeek-V3's YaRN under MLA (MLATransformerConfig.rope_type), Llama 3.1's RoPE scaling, Nemotron-4's squared
    # ReLU with RoPE on half of each head and (1 + weight) LayerNorms
    ("deepseek-v3", 1, ["--rope-type", "yarn", "--rotary-scaling-factor", "40", "--mscale", "1", "--mscale-all-dim",
                        "1"]),
    ("llama3-405b", 1, ["--use-rope-scaling", "--rope-scaling-factor", "8"]),
    ("nemotron-4-340b", 1, ["--squared-relu"]),
    ("nemotron-4-340b", 1, ["--rotary-percent", "0.5"]),
    ("nemotron-4-340b", 1, ["--normalization", "LayerNorm", "--apply-layernorm-1p"]),
    # GPT-OSS's clamped GLU (quick_gelu, offset 1, clamp 7), Qwen3's per-head Q/K RMSNorm
    ("gpt-oss-20b", 1, ["--quick-geglu", "--activation-func-clamp-value", "7", "--glu-linear-offset", "1"]),
    ("qwen3-8b", 1, ["--normalization", "RMSNorm", "--norm-epsilon", "1e-06", "--qk-layernorm"]),  # Qwen3: eps 1e-6
])
def test_attention_variants_and_cp_exchanges_pass_megatron_lm(oracle, tmp_path, name, cp, flags):
    """YaRN, attention sinks, sliding windows, NoPE layers (autotune.emit.megatron_attention) and the CP exchange
    (--cp-comm-type) as Megatron-LM's own parser and validate_args take them."""
    model = load_model_preset(name)
    world = 8 if cp == 1 else 2 * cp
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=world)
    plan = make_plan(model, cluster, engine="megatron", tp=2, cp=cp, ep=4 if model.moe else 1, zero_stage=1,
                     seq_len=4096, global_batch_size=world, recompute="full",
                     **({"cp_comm_type": "a2a+p2p"} if cp > 1 else {}),
                     # biased experts whole on their ranks: megatron-core asserts etp 1 for them (expert_bias_rules)
                     **({"etp": 1} if model.moe and model.linear_bias else {}))
    path = tmp_path / "megatron_args.sh"
    path.write_text(render_bundle(estimate(model, cluster, plan)).files["megatron_args.sh"])
    argv, _, _ = parse_shell_args_with_lines(path.read_text())
    assert " ".join(flags) in " ".join(argv), argv
    # as argv where the file quotes a ")" (DeepSeek's --moe-layer-freq): the oracle's file reader stops at the first
    verdict = oracle.verdict(world, argv=argv) if model.moe is not None else oracle.verdict(world, args_file=path)
    assert verdict["ok"], f"Megatron-LM rejects what we emitted for {name}: {verdict}\n{path.read_text()}"


def test_activation_offload_passes_megatron_lm(oracle, tmp_path):
    """Activation CPU offload (--cpu-offloading-num-layers, which turns cpu_offloading on: arguments.py:1950-1951 at
    d98e8a6) as Megatron-LM's own parser and validate_args take it, on NVIDIA's Llama-3 70B Megatron-FSDP plan."""
    model = load_model_preset("llama3-70b")
    cluster = load_cluster(gpu="gb300", num_gpus=64)
    plan = make_plan(model, cluster, engine="megatron", zero_stage=3, seq_len=8192, micro_batch_size=2,
                     global_batch_size=256, precision="fp8", grad_dtype="bf16", recompute="none",
                     activation_offload_layers=20)
    path = tmp_path / "megatron_args.sh"
    path.write_text(render_bundle(estimate(model, cluster, plan)).files["megatron_args.sh"])
    argv, lines, env = parse_shell_args_with_lines(path.read_text())
    assert "--cpu-offloading-num-layers 20" in " ".join(argv), argv
    verdict = oracle.verdict(64, args_file=path, env={"CUDA_DEVICE_MAX_CONNECTIONS": env.get(
        "CUDA_DEVICE_MAX_CONNECTIONS", "8")})
    assert verdict["ok"], f"Megatron-LM rejects the offload plan's arguments: {verdict}\n{path.read_text()}"
    assert [p for p in megatron_args_problems(argv, 64, env=env, lines=lines) if p.severity == "error"] == []


@pytest.mark.parametrize(("name", "flags", "absent"), [
    # DeepSeek-V3: sigmoid scores with the aux-loss-free expert bias, 8 groups of which 4, weights x 2.5
    # (256 experts: routed in fp32, as Megatron-core's >= 32-expert warning and Bridge's DeepSeek-V3 bridge ask)
    ("deepseek-v3", ["--moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-num-groups 8 "
                     "--moe-router-group-topk 4 --moe-router-topk-scaling-factor 2.5", "--moe-router-dtype fp32"], []),
    # Llama 4: a sigmoid top-1 router without a bias
    ("llama4-maverick", ["--moe-router-score-function sigmoid", "--moe-router-dtype fp32"],
     ["--moe-router-enable-expert-bias"]),
    # Mixtral's 8 experts: the router in the model's dtype, Megatron-core's default
    ("mixtral-8x7b", ["--moe-aux-loss-coeff 0.02"], ["--moe-router-dtype", "--moe-router-score-function"]),
    # GPT-OSS: a softmax router whose bias is its linear layer's (no --disable-bias-linear), not an expert bias;
    # its load-balancing loss at the checkpoint's weight (router_aux_loss_coef 0.9)
    ("gpt-oss-20b", ["--moe-aux-loss-coeff 0.9"], ["--moe-router-score-function", "--moe-router-enable-expert-bias",
                                                   "--disable-bias-linear"]),
    # Kimi-K2: DeepSeek's router with a per-sequence balancing loss (seq_aux, aux_loss_alpha 0.001)
    ("kimi-k2", ["--moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 0.001"], []),
])
def test_the_router_as_the_model_computes_it_passes_megatron_lm(oracle, tmp_path, name, flags, absent):
    """The router's score function, expert bias, group-limited routing and scaling (MoESpec.router_*, read from
    config.json's scoring_func / n_group / topk_group / routed_scaling_factor) as Megatron-LM's parser takes them."""
    model = load_model_preset(name)
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=16)
    plan = make_plan(model, cluster, engine="megatron", pp=4, ep=4, zero_stage=1, seq_len=4096,
                     global_batch_size=64, recompute="full")
    path = tmp_path / "megatron_args.sh"
    path.write_text(render_bundle(estimate(model, cluster, plan)).files["megatron_args.sh"])
    argv = parse_shell_args_with_lines(path.read_text())[0]
    text = " ".join(argv)
    for want in flags:
        assert want in text, text
    for flag in absent:
        assert flag not in text, text
    # as argv: the oracle's own file reader stops at the first ")", inside DeepSeek's quoted --moe-layer-freq
    verdict = oracle.verdict(16, argv=argv)
    assert verdict["ok"], f"Megatron-LM rejects the router flags of {name}: {verdict}\n{path.read_text()}"
