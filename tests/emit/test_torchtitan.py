"""torchtitan v0.2.2 TOML job configs: every section and key written exists in torchtitan's job_config.py (the
shipped table); each file loads with torchtitan's own ConfigManager and its degrees pass torchtitan's ParallelDims
for the world size; the linter finds unknown sections/keys (nearest key, line) and degree mismatches."""

import tomllib

import pytest

from autotune.api import make_plan
from autotune.cli import main
from autotune.emit.torchtitan import torchtitan_job_config, torchtitan_toml
from autotune.emit.torchtitan_lint import torchtitan_config_problems, torchtitan_key_table
from autotune.errors import InputError
from autotune.specs.loading import load_cluster
from autotune.specs.layout import layer_counts, virtual_layout
from autotune.specs.presets import load_model_preset

try:
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    TORCHTITAN = None
except Exception as err:  # noqa: BLE001 - any import failure is the reason to skip the loader checks
    TORCHTITAN = f"torchtitan 0.2.2 does not import here ({type(err).__name__}: {err})"

# (id, model, GPUs, plan): FSDP2, HSDP, TP, PP 1F1B and interleaved, CP, EP, Float8, DDP, CPU offload.
CASES = [
    ("fsdp2-zero3", "llama3-8b", 8, dict(zero_stage=3, global_batch_size=64)),
    ("hsdp-zero2", "llama3-8b", 16, dict(zero_stage=2, dp_replicate=2, global_batch_size=64)),
    ("fsdp-tp-cp-fp8", "llama3-70b", 64, dict(zero_stage=3, tp=8, cp=2, global_batch_size=32, precision="fp8",
                                              seq_len=8192, recompute="selective")),
    ("fsdp-tp-pp-1f1b", "llama3-70b", 64, dict(zero_stage=3, tp=8, pp=4, global_batch_size=64, recompute="full")),
    ("interleaved", "llama3-70b", 128, dict(zero_stage=3, tp=8, pp=4, vpp=2, global_batch_size=64)),
    # Llama 3 405B's split (126 layers, 16 x 8 virtual stages: the embedding and the output alone), and an uneven
    # one written as module names (32 layers over 4 x 3).
    ("interleaved-405b", "llama3-405b", 128, dict(zero_stage=3, tp=8, pp=16, vpp=8, global_batch_size=16)),
    ("interleaved-names", "llama3-8b", 32, dict(zero_stage=3, tp=2, pp=4, vpp=3, global_batch_size=16)),
    # the output as k layers (loss_slots): pipeline_parallel_last_stage_less_layers = k over pp stages (1F1B), with
    # a layers_per_stage that gives 4 x 3, and as module names where none gives 4 x 2 (35 effective layers)
    ("loss-slots-1f1b", "llama3-8b", 16, dict(zero_stage=3, pp=4, global_batch_size=64, loss_slots=2)),
    ("loss-slots-per-stage", "llama3-8b", 32, dict(zero_stage=3, tp=2, pp=4, vpp=3, global_batch_size=16,
                                                   loss_slots=2)),
    ("loss-slots-names", "llama3-8b", 32, dict(zero_stage=3, tp=2, pp=4, vpp=2, global_batch_size=16,
                                               loss_slots=2)),
    ("ddp", "llama3-8b", 8, dict(zero_stage=0, global_batch_size=16)),
    ("offload", "llama3-8b", 8, dict(zero_stage=3, offload_param="cpu", offload_optimizer="cpu",
                                     global_batch_size=8)),
]


def _emit(tmp_path, model, num_gpus, kw):
    m = load_model_preset(model)
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=num_gpus)
    kw = dict(kw)
    kw.setdefault("seq_len", 4096)
    plan = make_plan(m, cluster, engine="fsdp", **kw)
    path = tmp_path / "torchtitan.toml"
    path.write_text(torchtitan_toml(m, cluster, plan))
    return m, cluster, plan, path


def _paths(node, parts=()):
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _paths(value, parts + (key,))
        else:
            yield parts + (key,)


@pytest.mark.parametrize("model,num_gpus,kw", [pytest.param(m, n, kw, id=i) for i, m, n, kw in CASES])
def test_every_key_exists_and_the_file_is_clean(tmp_path, model, num_gpus, kw):
    _, _, plan, path = _emit(tmp_path, model, num_gpus, kw)
    data = tomllib.loads(path.read_text())
    for parts in _paths(data):
        node = torchtitan_key_table()["sections"]
        for part in parts[:-1]:
            node = node[part]["section"]
        assert parts[-1] in node and "section" not in node[parts[-1]], parts
    assert torchtitan_config_problems(path, world_size=num_gpus) == []
    p = data["parallelism"]
    assert p["data_parallel_replicate_degree"] * p["data_parallel_shard_degree"] == plan.dp
    assert p["fsdp_reshard_after_forward"] == ("always" if plan.zero_stage == 3 else "never")


@pytest.mark.skipif(TORCHTITAN is not None, reason=TORCHTITAN or "")
@pytest.mark.parametrize("model,num_gpus,kw", [pytest.param(m, n, kw, id=i) for i, m, n, kw in CASES])
def test_torchtitans_own_config_manager_loads_it(tmp_path, model, num_gpus, kw):
    _, _, plan, path = _emit(tmp_path, model, num_gpus, kw)
    cfg = ConfigManager().parse_args(["--job.config_file", str(path)])
    pa = cfg.parallelism
    dims = ParallelDims(dp_shard=pa.data_parallel_shard_degree, dp_replicate=pa.data_parallel_replicate_degree,
                        cp=pa.context_parallel_degree, tp=pa.tensor_parallel_degree, pp=pa.pipeline_parallel_degree,
                        ep=pa.expert_parallel_degree, etp=pa.expert_tensor_parallel_degree, world_size=num_gpus)
    assert (dims.tp, dims.pp, dims.cp, dims.dp_replicate * dims.dp_shard) == (plan.tp, plan.pp, plan.cp, plan.dp)
    assert cfg.training.seq_len == plan.seq_len and cfg.training.global_batch_size == plan.global_batch_size
    assert cfg.activation_checkpoint.mode == plan.recompute
    if plan.precision == "fp8":
        assert cfg.model.converters == ["quantize.linear.float8"] and cfg.compile.enable
    if plan.pp > 1:
        # torchtitan cuts a rank's local batch into micro-batches: local = micro x accumulation.
        assert cfg.training.local_batch_size == plan.micro_batch_size * plan.grad_accum_steps
        assert cfg.parallelism.pipeline_parallel_schedule == ("Interleaved1F1B" if plan.vpp > 1 else "1F1B")


@pytest.mark.skipif(TORCHTITAN is not None, reason=TORCHTITAN or "")
@pytest.mark.parametrize("case", [c for c in CASES if c[3].get("vpp", 1) > 1 or c[3].get("loss_slots")],
                         ids=lambda c: c[0])
def test_torchtitan_builds_the_plans_virtual_stages(tmp_path, case):
    # The stages torchtitan 0.2.2's pipeline_llm would build from the loaded config (its stage count and its own
    # split function, pipeline_parallel.py:71-121) are the plan's: virtual_layout(L, pp, vpp, the engine's scheme:
    # "any", or "any+lossK..." with loss_slots K).
    from torchtitan_source import split_sources, torchtitan_split_function

    from autotune.engines import engine_for

    m, _, plan, path = _emit(tmp_path, *case[1:])
    scheme = engine_for(plan).layer_split_of(plan, m.num_layers)
    pa = ConfigManager().parse_args(["--job.config_file", str(path)]).parallelism
    names = pa.module_fqns_per_model_part
    if names is None:
        weights = pa.pipeline_parallel_first_stage_less_layers, pa.pipeline_parallel_last_stage_less_layers
        per = pa.pipeline_parallel_layers_per_stage  # none: 1F1B's one stage a rank (pipeline_parallel.py:110-115)
        stages = plan.pp if per is None else -(-(m.num_layers + sum(weights)) // per)
        names = torchtitan_split_function(split_sources()[0])(stages, m.num_layers, *weights)
    counts = tuple(sum(n.startswith("layers.") for n in part) for part in names)
    assert counts == virtual_layout(m.num_layers, plan.pp, plan.vpp, scheme)
    # every pipeline rank holds the layers the cost model gives its stage
    assert [sum(counts[s::plan.pp]) for s in range(plan.pp)] == list(layer_counts(m.num_layers, plan.pp, scheme))
    assert names[0][0] == "tok_embeddings" and names[-1][-2:] == ["norm", "output"]
    assert sum(names, []) == ["tok_embeddings", *(f"layers.{i}" for i in range(m.num_layers)), "norm", "output"]
    if m.num_layers == 126:
        assert names[0] == ["tok_embeddings"] and names[-1] == ["norm", "output"]  # Llama 3 paper Sec. 3.3.2


@pytest.mark.skipif(TORCHTITAN is not None, reason=TORCHTITAN or "")
def test_torchtitan_refuses_what_the_linter_reports(tmp_path):
    _, _, _, path = _emit(tmp_path, *CASES[0][1:])
    path.write_text(path.read_text().replace("[parallelism]", "[parallelism]\ntensor_paralel_degree = 2"))
    with pytest.raises(ValueError, match="Invalid field names"):
        ConfigManager().parse_args(["--job.config_file", str(path)])
    assert {p.path for p in torchtitan_config_problems(path, world_size=8)} == {"$.parallelism.tensor_paralel_degree"}


def test_unknown_section_and_key_with_nearest_and_line(tmp_path):
    _, _, _, path = _emit(tmp_path, *CASES[0][1:])
    text = path.read_text().replace("[activation_checkpoint]", "[activation_checkpointing]")
    text = text.replace("seq_len = 4096", "seqlen = 4096")
    path.write_text(text)
    lines = text.splitlines()
    found = {p.path: p for p in torchtitan_config_problems(path, world_size=8)}
    section, key = found["$.activation_checkpointing"], found["$.training.seqlen"]
    assert "'activation_checkpoint'" in section.fix and lines[section.line - 1] == "[activation_checkpointing]"
    assert "'seq_len'" in key.fix and lines[key.line - 1] == "seqlen = 4096"


def test_degrees_against_the_world_size(tmp_path, capsys):
    _, _, _, path = _emit(tmp_path, *CASES[3][1:])  # tp 8 x pp 4 x dp 2 = 64
    assert main(["validate", str(path)]) == 0  # the world size the file states
    assert "assuming 64" in capsys.readouterr().err
    found = {(p.path, p.severity) for p in torchtitan_config_problems(path, world_size=128)}
    assert found == {("$.parallelism", "error")}
    path.write_text(path.read_text().replace('pipeline_parallel_schedule = "1F1B"',
                                             'pipeline_parallel_schedule = "1f1b"'))
    problems = {p.path: p for p in torchtitan_config_problems(path, world_size=64)}
    assert "'1F1B'" in problems["$.parallelism.pipeline_parallel_schedule"].fix


def test_plans_torchtitan_cannot_express():
    m = load_model_preset("llama3-8b")
    cluster = load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    plan = make_plan(m, cluster, engine="fsdp", zero_stage=3, global_batch_size=8, precision="fp16")
    with pytest.raises(InputError, match="bfloat16"):
        torchtitan_job_config(m, cluster, plan)
    tiny = load_model_preset("tiny-llama")
    plan = make_plan(tiny, cluster, engine="fsdp", zero_stage=3, global_batch_size=8, seq_len=128)
    with pytest.raises(InputError, match="flavor"):
        torchtitan_job_config(tiny, cluster, plan)
    assert torchtitan_job_config(tiny, cluster, plan, model_name="llama3", flavor="debugmodel")["model"]["flavor"] \
        == "debugmodel"
