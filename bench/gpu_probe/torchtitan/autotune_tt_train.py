"""Entry point: `python -m autotune_tt_train <torchtitan.train args>`: applies the torch<2.13
back-fills in autotune_tt_compat, then runs torchtitan.train unchanged."""
import runpy
import sys

import autotune_tt_compat  # noqa: F401  (patches torch before torchtitan is imported)

sys.argv[0] = "torchtitan.train"
runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
