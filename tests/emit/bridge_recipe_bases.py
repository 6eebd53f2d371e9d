"""The base values of Megatron-Bridge 0.6.2's library recipes (autotune/data/bridge_recipe_bases.json), read from
the recipes megatron-bridge itself builds: each recipe function of ``megatron_bridge_recipes.RECIPES`` is called (as
run_recipe.py does before it applies a file's overrides) and the fields ``autotune.job_bridge`` reads are taken from
its ConfigContainer, dumped as Bridge dumps a config (``create_omegaconf_dict_config``, what its override merge works
on). Tooling, stand-ins and hub as tests/emit/test_megatron_bridge_applied.py.

    python tests/emit/bridge_recipe_bases.py           # prints what differs from the shipped file
    python tests/emit/bridge_recipe_bases.py --write   # rewrites it
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bridge_probe, bridge_hub, bridge_tooling
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: tooling
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: autotune

PROBE = r"""
import importlib, json, sys, typing
import typing_extensions
typing.override = typing_extensions.override  # megatron-core 0.19.2 megatron/training/models/gpt.py (Python 3.12)
import autotune_standins  # noqa: F401
from omegaconf import OmegaConf
from megatron.bridge.training.utils.omegaconf_utils import create_omegaconf_dict_config
import megatron.bridge

def plain(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return str(value)

keys = json.loads(sys.argv[2])
out = {"version": megatron.bridge.__version__, "recipes": {}}
for module, name in json.loads(sys.argv[1]):
    cfg = getattr(importlib.import_module(module), name)()
    tree = OmegaConf.to_container(create_omegaconf_dict_config(cfg)[0], resolve=True)
    base = {}
    for section, wanted in keys.items():
        value = tree.get(section)
        if isinstance(value, dict):
            base[section] = {k: plain(value[k]) for k in wanted if k in value}
        elif value is not None:  # a registered precision name ("bf16_mixed")
            base[section] = plain(value)
    out["recipes"][name] = base
print("PROBE-RESULT " + json.dumps(out))
"""


def bridge_bases() -> dict:
    """{recipe function: {section: {key: value}}} as megatron-bridge builds each recipe."""
    from bridge_probe import run_bridge_probe

    from autotune.emit.megatron_bridge_recipes import GENERIC, RECIPES
    from autotune.emit.bridge_recipe_bases import BASE_KEYS
    with tempfile.TemporaryDirectory() as root:
        data = run_bridge_probe(Path(root), PROBE, json.dumps([[r.module, r.name] for r in (*RECIPES.values(), GENERIC)]),
                                json.dumps(BASE_KEYS))
    assert data["version"] == "0.6.2", data["version"]
    return data["recipes"]


def main(argv: list[str]) -> int:
    from autotune.emit.bridge_recipe_bases import BASES_FILE, load_bases
    built = bridge_bases()
    if "--write" in argv:
        BASES_FILE.write_text(json.dumps({"source": "megatron-bridge 0.6.2 (the recipe functions of "
                                                    "autotune/emit/megatron_bridge_recipes.py RECIPES and GENERIC, built by "
                                                    "tests/emit/bridge_recipe_bases.py)", "recipes": built},
                                         indent=1, sort_keys=True) + "\n")
        print(f"wrote {BASES_FILE} ({len(built)} recipes)")
        return 0
    shipped = load_bases()
    differ = sorted(name for name in built.keys() | shipped.keys() if built.get(name) != shipped.get(name))
    print("\n".join(differ) or "the shipped bases are megatron-bridge's")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
