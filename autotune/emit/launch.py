"""Launch scripts: torchrun (one node or c10d rendezvous), the deepspeed runner, SLURM.

Every script finds the bundle's own files from any folder (a relative training program, as Megatron-LM's
``pretrain_gpt.py`` without ``--script``, is the one thing its header says to run beside): a program argument
naming one of the bundle's own files
(``plan.json``, ``ds_config.json``) is passed as ``"$SCRIPT_DIR/<name>"``, the script's folder (SLURM
runs a spool copy of the script, so there it is ``$AUTOTUNE_BUNDLE_DIR`` or the submit folder, checked).
The DeepSpeed runner (0.19.8 ``launcher/runner.py``): on one node ``--hostfile`` with ``localhost`` +
``--no_ssh --node_rank 0 --master_addr 127.0.0.1`` (no ssh, and no reliance on ``/job/hostfile`` or on the
accelerator's device count); on several nodes a hostfile from ``--hosts``, else a placeholder the script
refuses to run with until it is filled in (or ``DS_HOSTFILE`` names one). ``-m module`` entries become the
runner's ``--module module``.

The templates in ``templates/`` hold no logic; every value is computed here, and every string a user
supplies (host names, paths, script arguments, environment values) goes through ``shlex.quote``
before it is substituted. Where a launcher re-parses a value with a shell we do not control, the value
is checked instead:

- the deepspeed runner writes ``--master_addr`` and the ``.deepspeed_env`` values unquoted (values with
  odd characters in double quotes) into the command pdsh runs on every node (DeepSpeed 0.19.8
  ``launcher/multinode_runner.py`` ``add_export`` and ``PDSHRunner.get_cmd``), so its host names must be
  plain host names and its environment values free of ``"``, ``$``, backquote and backslash;
- ``#SBATCH`` lines are read by sbatch, not bash, so their values must be plain words.

The rendezvous port is ``MASTER_PORT`` from the environment where set, in every script that names one (the deepspeed
runner's ``--master_port``, torchrun's c10d endpoint, accelerate's ``--main_process_port``); else a free one the
script picks where it runs on the rendezvous host alone (the deepspeed runner, which hands it to the other nodes;
accelerate on one node; an sbatch script, on the allocation's first node), else the emitted default (29500: torchrun
or accelerate run on each of several nodes must agree on it). Each script's header says which. One-node torchrun
runs ``--standalone``, which picks a free port itself.
"""

from __future__ import annotations

import re
import shlex
import string
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence

from autotune.emit.options import EmitOptions, LaunchOptions
from autotune.errors import InputError
from autotune.resources import templates_dir
from autotune.specs.hardware import ClusterSpec
from autotune.specs.notation import plan_notation
from autotune.specs.plan import ParallelPlan

__all__ = ["LAUNCHERS", "render_launch_scripts", "render_accelerate_script", "render_hostfile", "render_deepspeed_env"]

LAUNCHERS = ("torchrun", "deepspeed", "slurm")

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names the launch scripts may export (--nccl-env, emit.launch.nccl_env, LaunchOptions.nccl_env, and what autotune
# writes itself: CUDA_DEVICE_MAX_CONNECTIONS, NCCL_*, TORCH_NCCL_*): the communication libraries (NCCL, gloo,
# libfabric for EFA, UCX, NVSHMEM), CUDA, PyTorch (TORCH_NCCL_*, PYTORCH_CUDA_ALLOC_CONF), Transformer Engine and
# OpenMP. Anything else (PATH, LD_PRELOAD, PYTHONPATH, HOME) would break or hijack every rank.
_ENV_PREFIXES = ("NCCL_", "TORCH_", "PYTORCH_", "CUDA_", "NVTE_", "GLOO_", "OMP_", "FI_", "UCX_", "NVSHMEM_")
_PLAIN_HOST = re.compile(r"^[A-Za-z0-9_.:\[\]-]+$")  # names, IPv4, [IPv6]
_SBATCH_WORD = re.compile(r"^[A-Za-z0-9_.:,+@%/-]+$")
_DS_ENV_UNSAFE = re.compile(r'["$`\\\n\r\x00]')


def _q(value: str) -> str:
    return shlex.quote(str(value))


def _comment(text: str) -> str:
    """Text safe inside a ``#`` comment line: control characters become spaces."""
    return re.sub(r"[\x00-\x1f\x7f]", " ", text)


def _check_hosts(hosts: Sequence[str], master_addr: str | None, num_nodes: int) -> list[str]:
    problems = []
    for label, host in [*(("host", h) for h in hosts), *((("master_addr", master_addr),) if master_addr is not None
                                                           else ())]:
        if not host or not host.strip():
            problems.append(f"{label} is empty: give a host name")
        elif any(c in host for c in "\x00\n\r"):
            problems.append(f"{label} {host!r} contains a NUL or line break: give a plain host name")
    if hosts and len(hosts) != num_nodes:
        problems.append(f"{len(hosts)} host name(s) given for a cluster of {num_nodes} node(s): give one per node")
    # One node per host: DeepSpeed 0.19.8 launcher/runner.py _parse_hostfile raises "Hostfile contains multiple
    # entries for <host>", and two torchrun nodes on one host would both claim its GPUs. Host names ignore case.
    counts = Counter(h.strip().lower() for h in hosts if h and h.strip())
    repeated = [h for h, n in counts.items() if n > 1]
    if repeated:
        problems.append(f"host {', '.join(repr(h) for h in repeated[:5])} given more than once: give each node's "
                        f"own host name, {num_nodes} different hosts (DeepSpeed's runner refuses a repeated host)")
    return problems


def _check_env(env: Mapping[str, str]) -> list[str]:
    problems = []
    for key, value in env.items():
        if not _ENV_NAME.match(key):
            problems.append(f"environment variable name {key!r} is not a shell identifier")
        elif not key.startswith(_ENV_PREFIXES):
            problems.append(f"environment variable {key}: the launch scripts export only communication and runtime "
                            f"settings, names starting with {', '.join(p + '*' for p in _ENV_PREFIXES)} (PATH, "
                            f"LD_*, PYTHON*, HOME and the like would break or hijack every rank): drop {key}, or "
                            f"set it in the job's environment yourself")
        if "\x00" in str(value):
            problems.append(f"environment variable {key} contains a NUL byte")
    return problems


def _format_args(args: Sequence[str], bundle_files: Collection[str] = ()) -> str:
    """Quoted arguments, one flag and its values per continued line (empty string for none); an argument
    naming a bundle file becomes ``"$SCRIPT_DIR"/'<name>'``."""
    lines: list[list[str]] = []
    for arg in args:
        if arg.startswith("-") or not lines:
            lines.append([])
        lines[-1].append(f'"$SCRIPT_DIR"/{_q(arg)}' if arg in bundle_files else _q(arg))
    return "".join(" \\\n    " + " ".join(line) for line in lines)


def _exports(env: Mapping[str, str]) -> str:
    if not env:
        return "# (no environment variables)"
    return "\n".join(f"export {key}={_q(value)}" for key, value in env.items())


def where_to_run(entry_argv: Sequence[str]) -> str:
    """Where a launch script may be started: anywhere when its program is a module (``-m ...``) or an absolute
    path; from the folder that holds a relative program (``pretrain_gpt.py`` of a Megatron-LM checkout)."""
    program = entry_argv[0] if entry_argv else ""
    if program == "-m" or program.startswith("/"):
        return "from any folder"
    return f"from the folder that holds {program}: a relative path, so cd there first or emit with --script /abs/path"


def _template(name: str) -> string.Template:
    return string.Template((templates_dir() / name).read_text(encoding="utf-8"))


def render_hostfile(hosts: Sequence[str], slots: int) -> str:
    """A DeepSpeed hostfile: ``host slots=N`` per line (runner.py matches ``^(\\S+)\\s+slots=(\\d+)``)."""
    return "".join(f"{host} slots={slots}\n" for host in hosts)


def render_deepspeed_env(env: Mapping[str, str]) -> str:
    """``.deepspeed_env``: ``KEY=VALUE`` lines the deepspeed runner exports on every node."""
    return "".join(f"{key}={value}\n" for key, value in env.items())


def _deepspeed_problems(hosts: Sequence[str], master_addr: str | None, env: Mapping[str, str]) -> list[str]:
    problems = []
    for host in [*hosts, *([master_addr] if master_addr else [])]:
        if host and not _PLAIN_HOST.match(host):
            problems.append(f"host {host!r}: the deepspeed runner passes host names unquoted to a remote shell "
                            f"(pdsh); use letters, digits, '.', '-', '_' or an IP address (or the torchrun/SLURM "
                            f"scripts, which quote it)")
    for key, value in env.items():
        if _DS_ENV_UNSAFE.search(str(value)):
            problems.append(f"environment value of {key}: the deepspeed runner exports .deepspeed_env values in "
                            f"double quotes on the remote shell, so '\"', '$', '`', '\\\\' and line breaks "
                            f"cannot be passed safely; use the torchrun/SLURM scripts for this value")
    return problems


def _slurm_problems(lo: LaunchOptions) -> list[str]:
    problems = []
    for label, value in (("job_name", lo.job_name), ("slurm_time", lo.slurm_time),
                         ("slurm_partition", lo.slurm_partition), ("slurm_account", lo.slurm_account)):
        if value is not None and not _SBATCH_WORD.match(value):
            problems.append(f"{label} {value!r}: #SBATCH values must be plain words (letters, digits, . _ - : , + @ /)")
    return problems


def render_launch_scripts(cluster: ClusterSpec, plan: ParallelPlan, options: EmitOptions | None = None, *,
                          program_args: Sequence[str], env: Mapping[str, str], entry: str | Sequence[str],
                          launchers: Iterable[str] = LAUNCHERS, bundle_files: Collection[str] = (),
                          summary: str | None = None) -> dict[str, str]:
    """File name -> content of the launch scripts for ``launchers`` (torchrun, deepspeed, slurm).

    ``entry`` is the training program (``pretrain_gpt.py``, the user's ``train.py``, or ``-m autotune.train``);
    ``program_args`` its arguments, followed by ``options.launch.script_args``; ``env`` is exported by
    every script (and written to ``.deepspeed_env`` for the deepspeed runner's remote ranks); ``summary`` is
    the plan's line in the header (default: its notation without the engine's sharding tag).
    InputError names every unusable value.
    """
    options = options or EmitOptions()
    lo = options.launch
    launchers = tuple(launchers)
    unknown = [name for name in launchers if name not in LAUNCHERS]
    hosts = tuple(lo.hosts)
    problems = [f"unknown launcher {name!r} (known: {', '.join(LAUNCHERS)})" for name in unknown]
    problems += _check_hosts(hosts, lo.master_addr, cluster.num_nodes)
    problems += _check_env(env)
    args = [*program_args, *lo.script_args]
    entry_argv = [entry] if isinstance(entry, str) else list(entry)
    if any("\x00" in a for a in [*entry_argv, *args]):
        problems.append("a program argument contains a NUL byte, which no process argument can hold")
    if not entry_argv or not all(entry_argv):
        problems.append("the training program is empty: give the training script (pretrain_gpt.py, train.py)")
    if "deepspeed" in launchers:
        problems += _deepspeed_problems(hosts, lo.master_addr, env)
    if "slurm" in launchers:
        problems += _slurm_problems(lo)
    if problems:
        raise InputError(problems, subject="launch settings")

    common = {
        "where": where_to_run(entry_argv),
        "header": _comment(f"autotune: {summary or plan_notation(plan)} (engine {plan.engine}) on "
                           f"{cluster.num_nodes} x {cluster.gpus_per_node} {cluster.gpu.name}"),
        "exports": _exports(env),
        "entry": " ".join(_q(a) for a in entry_argv),
        "program_args": _format_args(args, bundle_files),
        "slurm_dir_check": _slurm_dir_check(bundle_files),
        "nnodes": str(cluster.num_nodes),
        "nproc_per_node": str(cluster.gpus_per_node),
        "port": _port(lo),
        "port_note": _port_note(lo),
    }
    files: dict[str, str] = {}
    if "torchrun" in launchers:
        if cluster.num_nodes == 1:
            files["launch_torchrun.sh"] = _template("torchrun_single.sh.tmpl").substitute(
                common, port_note=_port_note(lo, standalone=True))
        else:
            host = lo.master_addr or (hosts[0] if hosts else None)
            # No host known: the user exports MASTER_ADDR (the first node) before running the script.
            endpoint = (_q(f"{host}:") + f'"{_port(lo)}"' if host else
                        f'"${{MASTER_ADDR:?export MASTER_ADDR=<first node>}}:{_port(lo)}"')
            files["launch_torchrun.sh"] = _template("torchrun_multi.sh.tmpl").substitute(
                common, rdzv_endpoint=endpoint, rdzv_id=_q(lo.job_name))
    if "deepspeed" in launchers:
        files.update(_deepspeed_script(cluster, lo, hosts, entry_argv, env, common))
    if "slurm" in launchers:
        optional = [f"#SBATCH --{flag}={value}" for flag, value in
                    (("partition", lo.slurm_partition), ("account", lo.slurm_account)) if value]
        files["launch_slurm.sbatch"] = _template("slurm.sbatch.tmpl").substitute(  # run on the first node
            common, port=_port(lo, pick=True), port_note=_port_note(lo, pick=True), job_name=lo.job_name, time_limit=lo.slurm_time, sbatch_optional="\n".join(optional))
    return files


_FREE_PORT = """$(python -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')"""
"""A port no process holds, asked of the kernel (bind to port 0) where the script runs."""


def _port(lo: LaunchOptions, *, pick: bool = False) -> str:
    """The rendezvous port as the scripts read it (inside double quotes): ``MASTER_PORT`` from the environment,
    else, where the script runs on the rendezvous host alone (``pick``: the deepspeed runner, accelerate on one
    node, an sbatch script on the allocation's first node), a free one it picks, else the emitted one (torchrun on
    each of several nodes must agree on it without talking)."""
    return f"${{MASTER_PORT:-{_FREE_PORT if pick else lo.master_port}}}"


def _port_note(lo: LaunchOptions, *, standalone: bool = False, pick: bool = False) -> str:
    """The header line that says which port a script uses and how to change it."""
    if standalone:
        return "Port: torchrun --standalone picks a free one itself."
    if pick:
        return "Port: $MASTER_PORT if set in the environment, else a free one this script picks."
    return (f"Port: $MASTER_PORT if set in the environment, else {lo.master_port} "
            f"(export MASTER_PORT=<a free port> first when {lo.master_port} is taken).")


def _slurm_dir_check(bundle_files: Collection[str]) -> str:
    """Shell lines that stop a SLURM job whose bundle folder is not where SCRIPT_DIR points."""
    if not bundle_files:
        return ""
    probe = sorted(bundle_files)[0]
    return (f'[ -f "$SCRIPT_DIR"/{_q(probe)} ] || {{ echo "error: $SCRIPT_DIR has no {_comment(probe)}: submit '
            f'from the bundle folder or export AUTOTUNE_BUNDLE_DIR=<the bundle folder>" >&2; exit 2; }}')


PLACEHOLDER_HOST = "REPLACE-WITH-NODE"


def _deepspeed_script(cluster: ClusterSpec, lo: LaunchOptions, hosts: Sequence[str], entry_argv: list[str],
                      env: Mapping[str, str], common: dict[str, str]) -> dict[str, str]:
    """launch_deepspeed.sh, its hostfile and .deepspeed_env."""
    files: dict[str, str] = {}
    slots = cluster.gpus_per_node
    check = ""
    if cluster.num_nodes == 1:
        # runner.py: --no_ssh needs --node_rank and --master_addr; the hostfile names this machine only.
        files["hostfile"] = render_hostfile(("localhost",), slots)
        ds_args = ["--hostfile", '"$SCRIPT_DIR/hostfile"', "--no_ssh", "--node_rank", "0",
                   "--master_addr", _q(lo.master_addr or "127.0.0.1")]
    else:
        if hosts:
            files["hostfile"] = render_hostfile(hosts, slots)
        else:  # a placeholder the script refuses until it is filled in (or DS_HOSTFILE names a real one)
            files["hostfile"] = render_hostfile([f"{PLACEHOLDER_HOST}-{i + 1}" for i in range(cluster.num_nodes)],
                                                slots)
        check = (f'HOSTFILE="${{DS_HOSTFILE:-$SCRIPT_DIR/hostfile}}"\n'
                 f'if [ ! -f "$HOSTFILE" ] || grep -q {PLACEHOLDER_HOST} "$HOSTFILE"; then\n'
                 f'    echo "error: $HOSTFILE must list the {cluster.num_nodes} nodes, one \'HOST slots={slots}\' '
                 f'line each: edit it, export DS_HOSTFILE=<your hostfile>, or emit again with --hosts" >&2\n'
                 f'    exit 2\nfi')
        ds_args = ["--hostfile", '"$HOSTFILE"']
        if lo.master_addr or hosts:
            ds_args += ["--master_addr", _q(lo.master_addr or hosts[0])]
    ds_args += ["--num_nodes", str(cluster.num_nodes), "--num_gpus", str(slots), "--master_port",
                f'"{_port(lo, pick=True)}"']  # the runner hands it to the other nodes
    # --no_local_rank: Megatron-LM's parser knows --local-rank, not the runner's --local_rank=N;
    # ranks read LOCAL_RANK from the environment as under torchrun.
    ds_args.append("--no_local_rank")
    entry = list(entry_argv)
    if entry[0] == "-m":  # the runner's flag for a module entry (runner.py --module; launch.py runs python -m)
        entry[0] = "--module"
    files["launch_deepspeed.sh"] = _template("deepspeed_launcher.sh.tmpl").substitute(
        common, port_note=_port_note(lo, pick=True), launcher_args=" ".join(ds_args), hostfile_check=check or "# one node: no ssh, no hostfile search",
        entry=" ".join(_q(a) for a in entry))
    files[".deepspeed_env"] = render_deepspeed_env(env)
    return files


def render_accelerate_script(cluster: ClusterSpec, plan: ParallelPlan, options: EmitOptions | None = None, *,
                             config_file: str, ds_config_file: str, program_args: Sequence[str],
                             env: Mapping[str, str], entry: Sequence[str], bundle_files: Collection[str] = (),
                             summary: str | None = None) -> str:
    """launch_accelerate.sh: ``accelerate launch --config_file <config_file> ...`` of the entry (``-m module``
    stays ``-m``: accelerate's launcher has it). Several nodes: run it on each with MACHINE_RANK exported."""
    options = options or EmitOptions()
    lo = options.launch
    problems = _check_env(env) + _check_hosts(tuple(lo.hosts), lo.master_addr, cluster.num_nodes)
    if not entry or not all(entry):
        problems.append("the training program is empty: give the training script (train.py)")
    if problems:
        raise InputError(problems, subject="launch settings")
    machine = (f" \\\n    --num_machines {cluster.num_nodes} --num_processes {cluster.num_gpus}"
               f' --main_process_port "{_port(lo, pick=cluster.num_nodes == 1)}"')
    if cluster.num_nodes > 1:
        machine += ' --machine_rank "${MACHINE_RANK:?export MACHINE_RANK=<this node index, 0 on the first>}"'
        host = lo.master_addr or (lo.hosts[0] if lo.hosts else None)
        machine += (f" --main_process_ip {_q(host)}" if host else
                    ' --main_process_ip "${MASTER_ADDR:?export MASTER_ADDR=<first node>}"')
    usage = ("bash launch_accelerate.sh" if cluster.num_nodes == 1 else
             f"MACHINE_RANK=<0..{cluster.num_nodes - 1}> bash launch_accelerate.sh on each node")
    return _template("accelerate_launch.sh.tmpl").substitute(
        header=_comment(f"autotune: {summary or plan_notation(plan)} (engine {plan.engine}) on {cluster.num_nodes} x "
                        f"{cluster.gpus_per_node} {cluster.gpu.name}"),
        usage=usage, where=where_to_run(list(entry)), port_note=_port_note(lo, pick=cluster.num_nodes == 1),
        exports=_exports(env),
        config_file=_q(config_file),
        ds_config_file=_q(ds_config_file),
        machine_args=machine, entry=" ".join(_q(a) for a in entry),
        program_args=_format_args([*program_args, *lo.script_args], bundle_files))
