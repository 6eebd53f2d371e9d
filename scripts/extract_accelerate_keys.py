#!/usr/bin/env python3
"""Write ``autotune/emit/accelerate_keys.json``: the keys an accelerate config YAML may hold, from the
installed accelerate's own code.

Top level: the fields of ``accelerate.commands.config.config_args.ClusterConfig`` (``from_yaml_file`` raises
on any other key). Nested blocks (``deepspeed_config``, ``fsdp_config``, ``parallelism_config``, ``fp8_config``):
``accelerate launch`` copies each of their keys onto its own options (``commands/launch.py``
``_validate_launch_command``), so the keys it knows are the options of the matching group of
``launch_command_parser()``; any other key is dropped without a word.

    python scripts/extract_accelerate_keys.py --out autotune/emit/accelerate_keys.json
"""

import argparse
import dataclasses
import json
import sys

_GROUPS = {"deepspeed_config": "DeepSpeed Arguments", "fsdp_config": "FSDP Arguments",
           "parallelism_config": "ParallelismConfig Arguments", "fp8_config": "FP8 Arguments"}


def _options(group) -> dict:
    out = {}
    for action in group._group_actions:
        name = action.dest
        kind = action.type.__name__ if isinstance(action.type, type) else ("bool" if action.nargs == 0 else "str")
        out[name] = {"type": kind, "choices": None if action.choices is None else [str(c) for c in action.choices]}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    opts = p.parse_args()
    import accelerate
    from accelerate.commands.config.config_args import ClusterConfig, SageMakerConfig
    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils import DistributedType, PrecisionType

    parser = launch_command_parser()
    groups = {g.title: g for g in parser._action_groups}
    top = {f.name: {"type": str(f.type)} for f in dataclasses.fields(ClusterConfig)}
    top["distributed_type"]["choices"] = [t.value for t in DistributedType]
    top["mixed_precision"]["choices"] = [t.value for t in PrecisionType]
    blocks = {block: _options(groups[title]) for block, title in _GROUPS.items()}
    # compute_environment AMAZON_SAGEMAKER: load_config_from_file builds a SageMakerConfig instead, with its own fields
    # and distributed types (commands/config/config_args.py)
    from accelerate.utils import SageMakerDistributedType

    sagemaker = {f.name: {"type": str(f.type)} for f in dataclasses.fields(SageMakerConfig)}
    sagemaker["distributed_type"]["choices"] = [t.value for t in SageMakerDistributedType]
    sagemaker["mixed_precision"]["choices"] = top["mixed_precision"]["choices"]
    # Values accelerate checks against its constants (accelerate/utils/constants.py).
    from accelerate.utils import constants as c

    for block, key, values in (("fsdp_config", "fsdp_auto_wrap_policy", c.FSDP_AUTO_WRAP_POLICY),
                               ("fsdp_config", "fsdp_state_dict_type", c.FSDP2_STATE_DICT_TYPE),
                               ("fsdp_config", "fsdp_sharding_strategy", c.FSDP_SHARDING_STRATEGY),
                               ("fsdp_config", "fsdp_backward_prefetch", c.FSDP_BACKWARD_PREFETCH),
                               ("deepspeed_config", "deepspeed_multinode_launcher", c.DEEPSPEED_MULTINODE_LAUNCHERS)):
        blocks[block][key]["choices"] = list(values)
    # Values read back case-sensitively or normalised, whatever launch's option says: launch exports each fp8_config
    # value unchanged (utils/launch.py setup_fp8_env, ACCELERATE_FP8_<KEY>); Accelerator.fp8_backend reads the backend
    # back as FP8BackendType(value) (accelerator.py, the fp8_backend property), whose values are upper case ("te",
    # launch's own choice, raises in Accelerator.__init__); TERecipeKwargs upper-cases the format and lower-cases the
    # amax algorithm before checking them (utils/dataclasses.py, TERecipeKwargs.__post_init__).
    from accelerate.utils.dataclasses import FP8BackendType

    blocks["fp8_config"]["fp8_backend"]["choices"] = [t.value for t in FP8BackendType]
    blocks["fp8_config"]["fp8_format"]["case"] = "upper"
    blocks["fp8_config"]["fp8_amax_compute_algo"]["case"] = "lower"
    data = {"source": f"accelerate {accelerate.__version__}: ClusterConfig and SageMakerConfig fields "
                      f"(commands/config/config_args.py) and launch_command_parser() option groups (commands/launch.py)",
            "version": accelerate.__version__, "top": top, "sagemaker_top": sagemaker,
            "blocks": blocks}
    with open(opts.out, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=1, sort_keys=True)
        out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
