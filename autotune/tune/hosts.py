"""Which hosts of a DeepSpeed hostfile are this machine, and whether the others answer ssh (the DeepSpeed
launcher's pdsh/ssh runner needs password-less ssh to every remote host)."""

from __future__ import annotations

import contextlib
import ipaddress
import shutil
import socket
import subprocess

__all__ = ["SSH_TIMEOUT_S", "is_local", "local_addresses", "resolve", "ssh_problem"]

SSH_TIMEOUT_S = 3


def local_addresses() -> set[str]:
    import psutil

    out = {"127.0.0.1", "::1"}
    with contextlib.suppress(Exception):
        for addrs in psutil.net_if_addrs().values():
            out.update(a.address.split("%")[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6))
    return out


def resolve(host: str) -> set[str] | None:
    """The addresses ``host`` resolves to (None: it does not resolve)."""
    try:
        return {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (socket.gaierror, UnicodeError, OSError):
        return None


def is_local(addresses: set[str]) -> bool:
    local = local_addresses()
    for a in addresses:
        with contextlib.suppress(ValueError):
            if ipaddress.ip_address(a).is_loopback or a in local:
                return True
    return False


def ssh_problem(host: str) -> str:
    """Why ``ssh -o BatchMode=yes HOST true`` fails ('' when it works)."""
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_TIMEOUT_S}", host, "true"]
    if shutil.which("ssh") is None:
        return "ssh is not installed"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SSH_TIMEOUT_S + 7,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"no answer within {SSH_TIMEOUT_S + 7} s"
    if proc.returncode == 0:
        return ""
    last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
    return last
