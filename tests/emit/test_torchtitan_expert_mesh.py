"""torchtitan v0.2.2's expert mesh (ParallelDims, distributed/parallel_dims.py:58-59 and 136-158): the linter flags
an ep x etp torchtitan refuses, at its key, with the source line and a degree that fits, and passes the ones
torchtitan builds (checked against the installed torchtitan's own ConfigManager and ParallelDims.build_mesh on a fake
process group); the TOML reader (estimate / plan --from) reads expert_tensor_parallel_degree back (absent: 1, the
job_config.py default) and refuses, exit 2, what torchtitan or the FSDP engine cannot run, naming the way out."""

from __future__ import annotations

import re
import tomllib

import pytest
from test_job_files import run  # the CLI helper: main(argv), no traceback, (code, out, err)
from test_torchtitan import TORCHTITAN  # the v0.2.2 loader's skip reason (None: it imports)
from test_torchtitan_qwen3_gptoss import FILES, GPU, _emit

from autotune.cli import main
from autotune.emit.torchtitan_lint import torchtitan_config_problems
from autotune.job_files import read_job

# qwen3-30b-a3b on 16 GPUs, tp 2 (dp_shard 8): (ep, etp) -> the key at fault and what the message says, or None
MESH = {
    (4, 2): None,
    (8, 2): None,
    (4, 1): None,   # etp 1: EP takes the tp ranks too, 16 of them
    (16, 1): None,
    (16, 2): ("expert_parallel_degree", ["parallel_dims.py:136-138", "set expert_parallel_degree to 8",
                                         "expert_tensor_parallel_degree to 1"]),
    (3, 1): ("expert_parallel_degree", ["parallel_dims.py:154-158", "set expert_parallel_degree to 2 or 4"]),
    (4, 4): ("expert_tensor_parallel_degree", ["ETP=TP or ETP=1", "parallel_dims.py:58-59",
                                               "set expert_tensor_parallel_degree to 2 (= tp) or 1"]),
}


@pytest.fixture(scope="module")
def emitted(tmp_path_factory):
    """The torchtitan 0.2 bundle of qwen3-30b-a3b on 16 GPUs, tp 2 x ep 4, etp 2 given, and its plan."""
    out, plan, _ = _emit(tmp_path_factory.mktemp("etp"), "0.2", "qwen3-30b-a3b", 16,
                         ["--zero", "3", "--tp", "2", "--ep", "4", "--etp", "2"])
    return out / FILES["0.2"], plan


def _variant(tmp_path, emitted, ep: int, etp: int | None):
    """The emitted TOML with ep and etp replaced (etp None: the key left out)."""
    text = emitted[0].read_text()
    text = re.sub(r"(?m)^expert_parallel_degree = \d+$", f"expert_parallel_degree = {ep}", text)
    etp_line = "" if etp is None else f"expert_tensor_parallel_degree = {etp}"
    text = re.sub(r"(?m)^expert_tensor_parallel_degree = \d+$", etp_line, text)
    path = tmp_path / f"ep{ep}-etp{etp}.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("ep,etp", sorted(MESH), ids=lambda v: str(v))
def test_the_linter_checks_ep_x_etp_against_the_mesh(tmp_path, emitted, ep, etp):
    path = _variant(tmp_path, emitted, ep, etp)
    problems = torchtitan_config_problems(path, world_size=16)
    if MESH[ep, etp] is None:
        assert problems == []
        return
    key, needles = MESH[ep, etp]
    [problem] = problems
    assert problem.path == f"$.parallelism.{key}" and problem.severity == "error"
    lines = path.read_text().splitlines()
    assert lines[problem.line - 1].startswith(f"{key} =")  # the line of the key at fault
    for needle in needles:
        assert needle in f"{problem.message} {problem.fix}", (needle, problem)
    assert main(["validate", str(path), "--world-size", "16"]) == 1


@pytest.mark.skipif(TORCHTITAN is not None, reason=TORCHTITAN or "")
def test_the_linter_agrees_with_torchtitans_own_parallel_dims(tmp_path, emitted):
    """Each variant loaded with the installed torchtitan's ConfigManager, its ParallelDims built on a fake process
    group of 16 ranks: torchtitan refuses exactly the ones the linter flags."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=16)
    try:
        for ep, etp in MESH:
            path = _variant(tmp_path, emitted, ep, etp)
            flagged = torchtitan_config_problems(path, world_size=16)
            pa = ConfigManager().parse_args(["--job.config_file", str(path)]).parallelism
            try:
                ParallelDims(dp_shard=pa.data_parallel_shard_degree, dp_replicate=pa.data_parallel_replicate_degree,
                             cp=pa.context_parallel_degree, tp=pa.tensor_parallel_degree,
                             pp=pa.pipeline_parallel_degree, ep=pa.expert_parallel_degree,
                             etp=pa.expert_tensor_parallel_degree, world_size=16).build_mesh()
                refused = None
            except (AssertionError, ValueError, RuntimeError) as err:
                refused = err
            assert (refused is not None) == bool(flagged), ((ep, etp), refused, flagged)
            assert (refused is not None) == (MESH[ep, etp] is not None), ((ep, etp), refused)
    finally:
        dist.destroy_process_group()


def test_an_emitted_etp_reads_back_to_the_same_etp(emitted, capsys):
    path, plan = emitted
    assert plan.etp == 2 and tomllib.loads(path.read_text())["parallelism"]["expert_tensor_parallel_degree"] == 2
    job = read_job([str(path)], gpu=GPU)
    # etp = tp, which the FSDP engine has anyway: the plan read back leaves it unset, as without --etp
    assert job.plan.expert_tp == plan.expert_tp == 2 and job.plan == plan.with_(etp=None)
    if TORCHTITAN is None:
        from torchtitan.config import ConfigManager

        pa = ConfigManager().parse_args(["--job.config_file", str(path)]).parallelism
        assert pa.expert_tensor_parallel_degree == job.plan.expert_tp
    assert main(["validate", str(path), "--world-size", "16"]) == 0, capsys.readouterr()
    code, out, err = run(["estimate", "--from", path, "--gpu", GPU, "--json"], capsys)
    assert code == 0 and '"ep": 4' in out and '"tp": 2' in out, err


@pytest.mark.parametrize("etp,needles", [
    (1, ["expert_tensor_parallel_degree 1 with tensor_parallel_degree 2 and expert_parallel_degree 4",
         "set expert_tensor_parallel_degree = 2 in [parallelism]"]),
    (None, ["expert_tensor_parallel_degree 1 (absent: torchtitan 0.2.2's default, job_config.py:464)",
            "set expert_tensor_parallel_degree = 2 in [parallelism]"]),
    (4, ["expert_tensor_parallel_degree: etp 4 with ep 4 and tp 2", "parallel_dims.py:58-59",
         "set expert_tensor_parallel_degree to 2 (= tp)"])], ids=["etp1", "absent", "etp4"])
@pytest.mark.parametrize("command", ["estimate", "plan"])
def test_an_etp_the_fsdp_engine_cannot_run_exits_2(tmp_path, emitted, capsys, etp, needles, command):
    path = _variant(tmp_path, emitted, 4, etp)
    code, out, err = run([command, "--from", path, "--gpu", GPU], capsys)
    assert code == 2 and out == "", (code, out)
    for needle in needles:
        assert needle in err, (needle, err)
