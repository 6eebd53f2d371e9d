"""Launch scripts: valid bash, every user string quoted (run them against stand-in launchers that only
record their arguments), host names checked where a launcher re-parses them with a shell."""

import os
import shutil
import stat
import subprocess
import uuid

import pytest
from deepspeed.launcher.runner import _parse_hostfile

from autotune.emit.launch import render_accelerate_script, render_launch_scripts
from autotune.emit.options import EmitOptions, LaunchOptions
from autotune.errors import InputError
from autotune.specs.loading import load_cluster
from autotune.specs.plan import ParallelPlan

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="bash is needed to check the scripts")

SCRIPTS = ("launch_torchrun.sh", "launch_deepspeed.sh", "launch_slurm.sbatch")
DEFAULT_PORT = LaunchOptions().master_port  # 29500: the scripts' port when MASTER_PORT is unset


def cluster(num_gpus):
    return load_cluster(gpu="h100-sxm-80gb", num_gpus=num_gpus)


PLAN = ParallelPlan(tp=8, dp=2, global_batch_size=2, engine="megatron")
ARGS = ["--num-layers", "32", "--moe-layer-freq", "([0]*3+[1]*29)", "--bf16"]


def render(num_gpus=16, launchers=("torchrun", "deepspeed", "slurm"), env=None, args=ARGS,
           entry="pretrain_gpt.py", bundle_files=(), **launch):
    return render_launch_scripts(cluster(num_gpus), PLAN, EmitOptions(launch=LaunchOptions(**launch)),
                                 program_args=args, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if env is None else env,
                                 entry=entry, launchers=launchers, bundle_files=bundle_files)


def bash_syntax_ok(text, tmp_path):
    path = tmp_path / f"script-{uuid.uuid4().hex}.sh"
    path.write_text(text)
    result = subprocess.run([BASH, "-n", str(path)], capture_output=True, text=True)
    return result.returncode == 0, result.stderr


@pytest.mark.parametrize("num_gpus,launch", [
    (8, {}),
    (16, {}),
    (16, {"hosts": ("node1", "node2")}),
    (32, {"master_addr": "10.0.0.1", "slurm_partition": "gpu", "slurm_account": "proj-42"}),
])
def test_every_script_passes_bash_n_and_starts_right(num_gpus, launch, tmp_path):
    files = render(num_gpus, **launch)
    for name in SCRIPTS:
        text = files[name]
        ok, err = bash_syntax_ok(text, tmp_path)
        assert ok, f"{name}: {err}\n{text}"
        assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
        assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text
    torchrun = files["launch_torchrun.sh"]
    if num_gpus == 8:
        assert "--standalone --nnodes 1 --nproc-per-node 8" in torchrun
    else:
        assert "--rdzv-backend c10d" in torchrun and f"--nnodes {num_gpus // 8}" in torchrun
    slurm = files["launch_slurm.sbatch"]
    assert "#SBATCH --ntasks-per-node=1" in slurm and "#SBATCH --gpus-per-node=8" in slurm
    assert ("#SBATCH --partition=gpu" in slurm) == ("slurm_partition" in launch)
    assert ("#SBATCH --account=proj-42" in slurm) == ("slurm_account" in launch)
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1' in slurm
    # sbatch reads #SBATCH lines only before the first command.
    assert slurm.index("set -euo pipefail") > slurm.rindex("#SBATCH")


def test_hostfile_and_deepspeed_env_are_what_deepspeed_reads():
    files = render(16, hosts=("node1", "node2"), env={"NCCL_SOCKET_IFNAME": "^docker0,lo", "NCCL_IB_HCA": "mlx5"})
    assert dict(_parse_hostfile(files["hostfile"].splitlines())) == {"node1": 8, "node2": 8}
    assert files[".deepspeed_env"] == "NCCL_SOCKET_IFNAME=^docker0,lo\nNCCL_IB_HCA=mlx5\n"
    assert 'HOSTFILE="${DS_HOSTFILE:-$SCRIPT_DIR/hostfile}"' in files["launch_deepspeed.sh"]
    assert "--no_local_rank" in files["launch_deepspeed.sh"] and "--no_ssh" not in files["launch_deepspeed.sh"]
    single = render(8)
    assert dict(_parse_hostfile(single["hostfile"].splitlines())) == {"localhost": 8}


def test_one_node_deepspeed_runs_without_ssh_from_any_folder(tmp_path):
    # runner.py: --no_ssh needs --node_rank and --master_addr; the hostfile names localhost only.
    files = render(8, launchers=("deepspeed", "torchrun"), entry=("-m", "autotune.train"),
                   args=["--plan", "plan.json", "--deepspeed-config", "ds_config.json", "--steps", "5"],
                   bundle_files={"plan.json", "ds_config.json"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    argv, _ = run_with_fakes(tmp_path, "launch_deepspeed.sh", files["launch_deepspeed.sh"], cwd=elsewhere)
    port = argv[12]  # a free one the script picked (29500 may be taken on a shared machine)
    assert port.isdigit() and 1024 <= int(port) <= 65535
    assert argv == ["--hostfile", f"{tmp_path}/hostfile", "--no_ssh", "--node_rank", "0", "--master_addr",
                    "127.0.0.1", "--num_nodes", "1", "--num_gpus", "8", "--master_port", port, "--no_local_rank",
                    "--module", "autotune.train", "--plan", f"{tmp_path}/plan.json",
                    "--deepspeed-config", f"{tmp_path}/ds_config.json", "--steps", "5"]
    argv, _ = run_with_fakes(tmp_path, "launch_torchrun.sh", files["launch_torchrun.sh"], cwd=elsewhere)
    assert argv[-8:] == ["-m", "autotune.train", "--plan", f"{tmp_path}/plan.json",
                         "--deepspeed-config", f"{tmp_path}/ds_config.json", "--steps", "5"]


def test_slurm_script_finds_its_bundle_folder(tmp_path):
    files = render(16, launchers=("slurm",), entry=("-m", "autotune.train"), args=["--plan", "plan.json"],
                   bundle_files={"plan.json"})
    slurm_env = {"SLURM_NNODES": "2", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node-[a-b]",
                 "SLURM_SUBMIT_DIR": str(tmp_path)}
    script = tmp_path / "launch_slurm.sbatch"
    script.write_text(files["launch_slurm.sbatch"])
    result = subprocess.run([BASH, str(script)], env={"PATH": os.environ["PATH"], **slurm_env}, capture_output=True,
                            text=True)
    assert result.returncode == 2 and "AUTOTUNE_BUNDLE_DIR" in result.stderr  # no plan.json there yet
    (tmp_path / "plan.json").write_text("{}")
    argv, _ = run_with_fakes(tmp_path, "launch_slurm.sbatch", files["launch_slurm.sbatch"], slurm_env)
    assert argv[-3:] == ["autotune.train", "--plan", f"{tmp_path}/plan.json"]


# ---- quoting: run the scripts against stand-in launchers -----------------------------------------
RECORDER = """#!/bin/sh
for a in "$@"; do printf '%s\\0' "$a"; done > "$ARGV_OUT"
env -0 > "$ENV_OUT"
"""
FAKES = {
    "torchrun": RECORDER,
    "deepspeed": RECORDER,
    "accelerate": RECORDER,
    # srun: drop its own options, run the command.
    "srun": '#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n',
    "scontrol": "#!/bin/sh\necho node-a\necho node-b\n",
}


def run_with_fakes(tmp_path, name, text, extra_env=None, cwd=None):
    """Run the script with stand-ins for the launchers; return (argv they got, their environment)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for fake, body in FAKES.items():
        (bin_dir / fake).write_text(body)
        (bin_dir / fake).chmod(stat.S_IRWXU)
    script = tmp_path / name
    script.write_text(text)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(home), "ARGV_OUT": str(tmp_path / "argv"),
           "ENV_OUT": str(tmp_path / "env"), **(extra_env or {})}
    result = subprocess.run([BASH, str(script)], env=env, capture_output=True, text=True, cwd=cwd or tmp_path,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    argv = (tmp_path / "argv").read_bytes().split(b"\0")[:-1]
    environ = dict(item.split(b"=", 1) for item in (tmp_path / "env").read_bytes().split(b"\0") if b"=" in item)
    return [a.decode() for a in argv], {k.decode(): v.decode() for k, v in environ.items()}


@pytest.fixture
def pwned():
    path = f"/tmp/pwned-{uuid.uuid4().hex}"
    yield path
    assert not os.path.exists(path), "a hostile string was executed"
    if os.path.exists(path):
        os.remove(path)


def hostile_strings(pwned):
    return ["node1; rm -rf ~", f"$(touch {pwned})", "a'b\"c", f"`touch {pwned}`", f"x\\y\n$(touch {pwned})",
            f"--flag=$(touch {pwned}) && touch {pwned}", "*", "~", "$HOME", "${PATH}"]


def test_hostile_hosts_paths_and_args_stay_data(tmp_path, pwned):
    hostile = hostile_strings(pwned)
    entry = f"/opt/train dir/$(touch {pwned})/a'b\"c.py"
    args = ["--save", hostile[0], "--data-path", *hostile[1:]]
    env = {"NCCL_HOSTILE_A": hostile[1], "NCCL_HOSTILE_B": "a'b\"c; rm -rf ~", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    files = render(16, launchers=("torchrun", "slurm"), env=env, args=args, entry=entry,
                   hosts=("node1; rm -rf ~", f"$(touch {pwned})"), job_name="run-1")
    for name, text in files.items():
        ok, err = bash_syntax_ok(text, tmp_path)
        assert ok, f"{name}: {err}"

    argv, environ = run_with_fakes(tmp_path, "launch_torchrun.sh", files["launch_torchrun.sh"])
    assert argv == ["--nnodes", "2", "--nproc-per-node", "8", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", f"node1; rm -rf ~:{DEFAULT_PORT}", "--rdzv-id", "run-1", entry, *args]
    assert environ["NCCL_HOSTILE_A"] == env["NCCL_HOSTILE_A"] and environ["NCCL_HOSTILE_B"] == env["NCCL_HOSTILE_B"]

    slurm_env = {"SLURM_NNODES": "2", "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node-[a-b]"}
    argv, environ = run_with_fakes(tmp_path, "launch_slurm.sbatch", files["launch_slurm.sbatch"],
                                   {**slurm_env, "MASTER_PORT": str(DEFAULT_PORT)})
    assert argv == ["--nnodes", "2", "--nproc-per-node", "8", "--rdzv-backend", "c10d", "--rdzv-id", "4242",
                    "--rdzv-endpoint", f"node-a:{DEFAULT_PORT}", entry, *args]
    assert environ["NCCL_HOSTILE_B"] == env["NCCL_HOSTILE_B"]


def test_hostile_master_addr_is_quoted(tmp_path, pwned):
    files = render(16, launchers=("torchrun",), master_addr=f"a'b\"c $(touch {pwned})")
    argv, _ = run_with_fakes(tmp_path, "launch_torchrun.sh", files["launch_torchrun.sh"])
    assert argv[argv.index("--rdzv-endpoint") + 1] == f"a'b\"c $(touch {pwned}):{DEFAULT_PORT}"


def test_deepspeed_script_quotes_paths_and_args(tmp_path, pwned):
    hostile = hostile_strings(pwned)
    entry = f"/opt/train dir/$(touch {pwned}).py"
    files = render(16, launchers=("deepspeed",), args=hostile, entry=entry, hosts=("node1", "node2"),
                   env={"NCCL_SOCKET_IFNAME": "^lo", "NCCL_DEBUG": "INFO"})
    (tmp_path / "hostfile").write_text(files["hostfile"])
    argv, environ = run_with_fakes(tmp_path, "launch_deepspeed.sh", files["launch_deepspeed.sh"],
                                   {"MASTER_PORT": str(DEFAULT_PORT)})
    assert argv == ["--hostfile", f"{tmp_path}/hostfile", "--master_addr", "node1", "--num_nodes", "2",
                    "--num_gpus", "8", "--master_port", str(DEFAULT_PORT), "--no_local_rank", entry, *hostile]
    assert environ["DS_ENV_FILE"] == f"{tmp_path}/.deepspeed_env" and environ["NCCL_SOCKET_IFNAME"] == "^lo"


def test_deepspeed_runner_refuses_what_its_remote_shell_would_run(pwned):
    # The runner writes --master_addr and .deepspeed_env values unquoted into pdsh's remote command.
    with pytest.raises(InputError, match="unquoted to a remote shell"):
        render(16, hosts=("node1; rm -rf ~", "node2"))
    with pytest.raises(InputError, match="unquoted to a remote shell"):
        render(16, master_addr=f"$(touch {pwned})")
    with pytest.raises(InputError, match="cannot be passed safely"):
        render(16, env={"NCCL_DEBUG": f"$(touch {pwned})"})


@pytest.mark.parametrize("bad", ["", "  ", "node\x001", "node1\nrm -rf ~", "node1\r"])
def test_empty_nul_and_newline_host_names_are_rejected(bad):
    with pytest.raises(InputError, match="host"):
        render(16, launchers=("torchrun",), hosts=(bad, "node2"))
    with pytest.raises(InputError, match="master_addr"):
        render(16, launchers=("torchrun",), master_addr=bad)


def test_other_input_errors_name_every_problem():
    with pytest.raises(InputError) as err:
        render(16, launchers=("torchrun", "slurm", "mpirun"), hosts=("node1",), env={"BAD-NAME": "1"},
               slurm_partition="gpu\n#SBATCH --account=theirs")
    text = str(err.value)
    for part in ("unknown launcher 'mpirun'", "1 host name(s) given for a cluster of 2", "BAD-NAME",
                 "slurm_partition"):
        assert part in text


def test_multi_node_without_hosts_asks_for_master_addr_and_a_hostfile(tmp_path):
    files = render(16, launchers=("torchrun", "deepspeed"))
    # The placeholder hostfile parses, but the script refuses it until it names the nodes.
    assert list(_parse_hostfile(files["hostfile"].splitlines())) == ["REPLACE-WITH-NODE-1", "REPLACE-WITH-NODE-2"]
    (tmp_path / "hostfile").write_text(files["hostfile"])
    script = tmp_path / "launch_deepspeed.sh"
    script.write_text(files["launch_deepspeed.sh"])
    result = subprocess.run([BASH, str(script)], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True)
    assert result.returncode == 2 and "must list the 2 nodes" in result.stderr and "--hosts" in result.stderr
    mine = tmp_path / "my_hostfile"
    mine.write_text("n1 slots=8\nn2 slots=8\n")
    argv, _ = run_with_fakes(tmp_path, "launch_deepspeed.sh", files["launch_deepspeed.sh"], {"DS_HOSTFILE": str(mine)})
    assert argv[:2] == ["--hostfile", str(mine)]
    argv, _ = run_with_fakes(tmp_path, "launch_torchrun.sh", files["launch_torchrun.sh"], {"MASTER_ADDR": "10.1.1.1"})
    assert argv[argv.index("--rdzv-endpoint") + 1] == f"10.1.1.1:{DEFAULT_PORT}"
    script = tmp_path / "no_master.sh"
    script.write_text(files["launch_torchrun.sh"])
    result = subprocess.run([BASH, str(script)], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True)
    assert result.returncode != 0 and "MASTER_ADDR" in result.stderr


def _port_of(argv):
    for flag in ("--master_port", "--main_process_port"):
        if flag in argv:
            return argv[argv.index(flag) + 1]
    return argv[argv.index("--rdzv-endpoint") + 1].rsplit(":", 1)[1]


@pytest.mark.parametrize("num_gpus", [8, 16])
def test_every_script_takes_master_port_from_the_environment(num_gpus, tmp_path, free_port):
    # Two jobs (or two test runs) on one machine must not both need 29500: MASTER_PORT overrides the default;
    # unset, a script run on the rendezvous host alone picks a free one (the deepspeed runner, an sbatch script,
    # accelerate on one node), torchrun or accelerate run on each of several nodes the default; the header says so.
    files = render(num_gpus, hosts=("node1", "node2") if num_gpus == 16 else ())
    files["launch_accelerate.sh"] = render_accelerate_script(
        cluster(num_gpus), PLAN, EmitOptions(launch=LaunchOptions(master_addr="10.0.0.1")), config_file="a.yaml",
        ds_config_file="ds.json", program_args=[], env={}, entry=["train.py"])
    slurm_env = {"SLURM_NNODES": "2", "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "node-[a-b]"}
    scripts = ["launch_deepspeed.sh", "launch_slurm.sbatch", "launch_accelerate.sh"]
    scripts += ["launch_torchrun.sh"] if num_gpus == 16 else []
    for name in scripts:
        (tmp_path / "hostfile").write_text(files["hostfile"])
        extra = {**slurm_env, "MACHINE_RANK": "0"}
        argv, _ = run_with_fakes(tmp_path, name, files[name], {**extra, "MASTER_PORT": str(free_port)})
        assert _port_of(argv) == str(free_port), name
        argv, _ = run_with_fakes(tmp_path, name, files[name], extra)
        picks = name in ("launch_deepspeed.sh", "launch_slurm.sbatch") or (name == "launch_accelerate.sh"
                                                                           and num_gpus == 8)
        if picks:
            assert _port_of(argv).isdigit() and _port_of(argv) != "0", name
            assert "# Port: $MASTER_PORT if set in the environment, else a free one this script picks" in \
                files[name], name
        else:
            assert _port_of(argv) == str(DEFAULT_PORT), name
            assert f"# Port: $MASTER_PORT if set in the environment, else {DEFAULT_PORT}" in files[name], name
    if num_gpus == 8:  # one node: torchrun --standalone finds a free port itself
        assert "--standalone" in files["launch_torchrun.sh"] and "--rdzv-endpoint" not in files["launch_torchrun.sh"]
        assert "# Port: torchrun --standalone picks a free one itself." in files["launch_torchrun.sh"]


def test_a_relative_program_says_where_to_run_the_script():
    relative = render(entry="pretrain_gpt.py", launchers=("torchrun", "deepspeed"))
    for name in ("launch_torchrun.sh", "launch_deepspeed.sh"):
        header = "".join(relative[name].splitlines(keepends=True)[:4])
        assert "from the folder that holds pretrain_gpt.py" in header and "from any folder" not in header
    anywhere = render(entry=["-m", "autotune.train"], launchers=("torchrun",))
    assert "from any folder" in anywhere["launch_torchrun.sh"]
    assert "from any folder" in render(entry="/opt/Megatron-LM/pretrain_gpt.py", launchers=("torchrun",))[
        "launch_torchrun.sh"]
