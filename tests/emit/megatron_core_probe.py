"""Runs tests/emit/fixtures/megatron_core_config_probe.py (megatron-core 0.19.2's parse_args, validate_args and
TransformerConfig) over Megatron-LM argument lists in one process: the verdicts of
test_megatron_core_run_settings.py and test_megatron_core_presets.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).parent / "fixtures" / "megatron_core_config_probe.py"


def core_verdicts(root: Path, jobs: list[tuple[int, list[str]]]) -> list[dict]:
    """One verdict per (world size, argv) job, in order; ``root`` an empty folder. Installs the megatron-core 0.19.2
    wheel of the test tooling on first use (or skips, saying why)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from bridge_tooling import bridge_path

    (root / "tree").mkdir()
    (root / "tree" / "megatron").symlink_to(bridge_path() / "megatron")
    (root / "jobs.json").write_text(json.dumps(jobs))
    run = subprocess.run([sys.executable, str(PROBE), str(root / "tree"), str(root / "jobs.json")], capture_output=True,
                         text=True, timeout=900, check=False)
    lines = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
    assert run.returncode == 0 and len(lines) == len(jobs), run.stdout[-2000:] + run.stderr[-4000:]
    return lines
