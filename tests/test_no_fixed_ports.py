"""No test depends on a fixed port being free, or on an op build finishing inside its own timeout.

On a shared CI machine 29500 (torchrun's, DeepSpeed's and accelerate's default) is often taken:
tests/engines/test_deepspeed_bundles.py failed with EADDRINUSE there. So:
- no test file gives a literal port to a process it starts (argv, MASTER_PORT / PET_MASTER_PORT, a
  ``*port=`` keyword, a ``host:port`` endpoint); comparing an emitted script's default against 29500 is fine;
- every test file that starts a launcher which needs a rendezvous port passes a free one (or runs torchrun
  ``--standalone``, which picks its own);
- the DeepSpeed probe and bundle tests build DeepSpeed's ops in the session fixture first.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
FILES = sorted(p for p in TESTS.rglob("*.py") if p.name != Path(__file__).name)
# What starts a launcher that listens on a rendezvous port (not --standalone torchrun).
STARTS_LAUNCHER = re.compile(r'run_script\(|run_deepspeed_probe\(|"accelerate\.commands\.launch"|'
                             r'"torch\.distributed\.run",\s*(?!"--standalone")"|'
                             r'\["bash", str\([^\]]*"launch_(?:deepspeed|accelerate)\.sh"')
PASSES_FREE_PORT = re.compile(r"master_port|free_port|main_process_port", re.IGNORECASE)
# Files outside this change's reach that still start a launcher on the default port: fix, then remove here.
KNOWN: dict[str, str] = {}


def _port_literal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and not isinstance(node.value, bool):
        text = str(node.value)
        m = re.fullmatch(r"(?:[^\s:]+:)?(\d{4,5})", text)
        if m and 1024 <= int(m.group(1)) <= 65535:
            return text
    return None


def fixed_ports(source: str) -> list[str]:
    """Lines that hand a literal port to a process: ``"--master_port", "29500"``, ``MASTER_PORT="29500"``,
    ``env["MASTER_PORT"] = 29500``, ``master_port=29500``, ``"host:29500"`` outside comparisons."""
    tree = ast.parse(source)
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    found = []
    for node in ast.walk(tree):
        literal = _port_literal(node)
        if literal is None:
            continue
        chain, up = [], parents.get(node)
        while up is not None:
            chain.append(up)
            up = parents.get(up)
        if any(isinstance(a, ast.Assert | ast.Compare) for a in chain):
            continue  # checking a default, not starting anything with it
        parent = chain[0] if chain else None
        portish = ":" in literal or literal == "29500"
        if isinstance(parent, ast.List | ast.Tuple):
            i = parent.elts.index(node)
            before = parent.elts[i - 1] if i else None
            portish |= isinstance(before, ast.Constant) and "port" in str(before.value).lower()
        if isinstance(parent, ast.keyword):
            portish |= "port" in (parent.arg or "").lower()
        if isinstance(parent, ast.Dict):
            key = parent.keys[parent.values.index(node)] if node in parent.values else None
            portish |= isinstance(key, ast.Constant) and "port" in str(key.value).lower()
        if isinstance(parent, ast.Assign):
            portish |= "port" in ast.unparse(parent.targets[0]).lower()
        if portish:
            found.append(f"line {node.lineno}: {literal}")
    return found


def test_the_scan_finds_fixed_ports():
    bad = '''subprocess.run(["deepspeed", "--master_port", "29500", "train.py"])
env = dict(os.environ, MASTER_PORT="29501")
env["MASTER_PORT"] = 12355
run(master_port=29400, rdzv_endpoint="localhost:29400")
'''
    assert len(fixed_ports(bad)) == 5
    ok = '''assert argv == ["--master_port", "29500"]
port = pick_free_port()
assert endpoint == f"node-a:{port}"
subprocess.run(["sleep", "2000"], timeout=3000)
'''
    assert fixed_ports(ok) == []


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(TESTS)))
def test_no_test_hands_a_fixed_port_to_a_process(path):
    assert fixed_ports(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("path", [
    pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=KNOWN[str(p.relative_to(TESTS))]))
    if str(p.relative_to(TESTS)) in KNOWN else p
    for p in FILES if STARTS_LAUNCHER.search(p.read_text(encoding="utf-8"))], ids=lambda p: str(p.relative_to(TESTS)))
def test_tests_that_start_a_launcher_pass_a_free_port(path):
    assert PASSES_FREE_PORT.search(path.read_text(encoding="utf-8")), \
        f"{path.name} starts a launcher with no free port: pass MASTER_PORT=pick_free_port() (tests/conftest.py)"


def test_probes_and_bundle_runs_build_deepspeed_ops_first():
    for name in ("cost/test_ledger_vs_deepspeed.py", "engines/test_deepspeed_bundles.py", "engines/test_hf_bundles.py"):
        assert "deepspeed_ops" in (TESTS / name).read_text(encoding="utf-8"), name
    conftest = (TESTS / "conftest.py").read_text(encoding="utf-8")
    assert '@pytest.fixture(scope="session")\ndef deepspeed_ops' in conftest and "ensure_ops(" in conftest
