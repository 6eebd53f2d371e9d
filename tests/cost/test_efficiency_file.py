"""A saved calibration is an ordinary file: readable by the group and others as the umask allows, like any file
the user writes (mkstemp's 0600 made it private; issue 21), and written atomically."""

from __future__ import annotations

import os
import stat

from autotune.cost.efficiency import DEFAULT_EFFICIENCY, load_efficiency, save_efficiency


def test_a_saved_calibration_has_the_umask_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "cal.json"
        save_efficiency(DEFAULT_EFFICIENCY, str(path))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert load_efficiency(str(path)) == DEFAULT_EFFICIENCY
    assert [p.name for p in tmp_path.iterdir()] == ["cal.json"]  # no temporary file left
