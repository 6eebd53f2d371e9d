"""`autotune validate` on a Megatron-DeepSpeed argument file or a torchtitan TOML: beyond the file's own format
checks, what the engine refuses of the model and plan the file states (autotune.lint.engine_rule_problems: the
engine's own rules; Megatron-LM files: tests/test_validate_megatron_core.py). The slow test shows DeepSpeed itself
refusing what the rule refuses: its MoE under ZeRO-3, with the ds_config.json autotune writes beside the arguments."""
from __future__ import annotations

import json
import os
import sys

import pytest
from conftest import run_launcher  # a rank's rare native abort at exit: started once more (conftest.NATIVE_ABORT)

from autotune.api import estimate, make_plan
from autotune.bundle.writer import render_bundle
from autotune.cli import main
from autotune.emit.options import EmitOptions
from autotune.lint import lint_file
from autotune.specs.loading import load_cluster
from autotune.specs.presets import load_model_preset

GPUS = 32


def _bundle(tmp_path) -> dict[str, str]:
    model, cluster = load_model_preset("mixtral-8x7b"), load_cluster(gpu="h100-sxm-80gb", num_gpus=GPUS)
    plan = make_plan(model, cluster, engine="megatron-deepspeed", zero_stage=1, seq_len=4096, global_batch_size=64,
                     tp=2, ep=8, sequence_parallel=True, recompute="full")
    files = render_bundle(estimate(model, cluster, plan)).files
    for name in ("megatron_deepspeed_args.sh", "ds_config.json"):
        (tmp_path / name).write_text(files[name])
    return files


def _at_zero3(tmp_path) -> str:
    path = tmp_path / "megatron_deepspeed_args.sh"
    text = path.read_text()
    assert "  --zero-stage 1\n" in text, text
    # ZeRO-2/3 need DeepSpeed's plain engine, not its pipeline one (the format check says so without the flag)
    path.write_text(text.replace("  --zero-stage 1\n", "  --zero-stage 3\n  --no-pipeline-parallel\n"))
    return str(path)


def test_the_file_autotune_writes_passes(tmp_path):
    _bundle(tmp_path)
    assert lint_file(tmp_path / "megatron_deepspeed_args.sh", world_size=GPUS) == []


def test_deepspeed_moe_under_zero3_is_refused(tmp_path, capsys):
    _bundle(tmp_path)
    path = _at_zero3(tmp_path)
    found = lint_file(path, world_size=GPUS)
    assert [(p.source, p.severity) for p in found] == [("Megatron-DeepSpeed", "error")], found
    assert "DeepSpeed-MoE does not run under ZeRO-3" in found[0].message
    assert "Native DeepSpeed MoE is not supported with ZeRO Stage 3" in found[0].message  # DeepSpeed's own words
    assert "engines that run this plan as it is: megatron" in found[0].fix
    assert main(["validate", path, "--world-size", str(GPUS)]) == 1
    assert "runtime/engine.py:2214-2216" in capsys.readouterr().out


@pytest.mark.parametrize("version, name, sep", [("0.2", "torchtitan_job.toml", " = "),
                                                 ("0.3", "torchtitan_plan.py", "=")])
def test_a_torchtitan_pipeline_with_fewer_micro_batches_than_stages_is_refused(tmp_path, version, name, sep):
    """torch.distributed.pipelining's Schedule1F1B raises "Number of microbatches (1) must be greater than or equal
    to the number of stages (2)" (torch 2.13 distributed/pipelining/schedules.py:1020-1023); torchtitan's micro-batch
    count is local_batch_size / pipeline_parallel_microbatch_size. The 0.2 TOML and the 0.3 config module alike."""
    model, cluster = load_model_preset("llama3-8b"), load_cluster(gpu="h100-sxm-80gb", num_gpus=8)
    plan = make_plan(model, cluster, engine="fsdp", pp=2, seq_len=4096, global_batch_size=32)
    path = tmp_path / name
    path.write_text(render_bundle(estimate(model, cluster, plan), EmitOptions(torchtitan_version=version)).files[name])
    assert lint_file(path, world_size=8) == []
    text = path.read_text()
    local, total = f"local_batch_size{sep}8", f"global_batch_size{sep}32"
    assert text.count(local) == 1 and text.count(total) == 1, text
    path.write_text(text.replace(local, f"local_batch_size{sep}1").replace(total, f"global_batch_size{sep}4"))
    found = lint_file(path, world_size=8)
    assert [(p.source, p.severity) for p in found] == [("torchtitan", "error")], found
    assert "Number of microbatches (1) must be greater than or equal to the number of stages (2)" in found[0].message
    assert "the nearest plan that passes every rule" in found[0].fix


PROBE = r'''
import json, sys, torch, deepspeed
from deepspeed.moe.layer import MoE
deepspeed.init_distributed(dist_backend="gloo")

class Net(torch.nn.Module):  # one DeepSpeed-MoE layer, as Megatron-DeepSpeed's MoE(ParallelMLP) builds it
    def __init__(self):
        super().__init__()
        self.moe = MoE(hidden_size=8, expert=torch.nn.Linear(8, 8), num_experts=2, ep_size=1, k=1)
        self.head = torch.nn.Linear(8, 1)
    def forward(self, x):
        h, aux, _ = self.moe(x)
        return self.head(h).sum() + aux

config = json.load(open(sys.argv[1]))  # the bundle's ds_config.json; one rank, one micro-batch
config.update(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1, train_batch_size=1)
config["zero_optimization"]["stage"] = int(sys.argv[2])
config["optimizer"]["params"]["torch_adam"] = True  # no CPU Adam JIT build for one step
model = Net()
engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=config)
loss = engine(torch.randn(1, 4, 8).to(torch.bfloat16))
engine.backward(loss)
engine.step()
print("TRAINED", float(loss), flush=True)
'''


@pytest.mark.slow
def test_deepspeed_itself_refuses_its_moe_under_zero3(tmp_path, free_port):
    files = _bundle(tmp_path)
    assert json.loads(files["ds_config.json"])["zero_optimization"]["stage"] == 1
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    out = {}
    for stage in (1, 3):
        run = run_launcher([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--master-port",
                            str(free_port), str(script), str(tmp_path / "ds_config.json"), str(stage)], timeout=600,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
        out[stage] = (run.returncode, run.stdout + run.stderr)
    assert out[1][0] == 0 and "TRAINED" in out[1][1], out[1][1][-3000:]
    assert out[3][0] != 0 and "Native DeepSpeed MoE is not supported with ZeRO Stage 3" in out[3][1], out[3][1][-3000:]
