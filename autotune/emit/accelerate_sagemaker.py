"""accelerate configs for Amazon SageMaker (``compute_environment: AMAZON_SAGEMAKER``): accelerate 1.16.0's loader
builds a ``SageMakerConfig`` from them, with its own keys and distributed types (commands/config/config_args.py:
load_config_from_file, SageMakerConfig), and ``accelerate launch`` hands the job to SageMaker: ``num_machines``
instances of ``ec2_instance_type``, every GPU of each in the job under DATA_PARALLEL (smdistributed data
parallelism), one process an instance otherwise (utils/launch.py:676-678 sets no distribution for NO and
MODEL_PARALLEL).
"""

from __future__ import annotations

__all__ = ["SAGEMAKER_INSTANCES", "is_sagemaker", "sagemaker_problems", "sagemaker_world_size"]

SAGEMAKER_INSTANCES: dict[str, tuple[int, str | None]] = {
    "ml.p3.2xlarge": (1, None), "ml.p3.8xlarge": (4, None), "ml.p3.16xlarge": (8, None),
    "ml.p3dn.24xlarge": (8, "v100-32gb"),
    "ml.p4d.24xlarge": (8, "a100-40gb"), "ml.p4de.24xlarge": (8, "a100-80gb"),
    "ml.p5.48xlarge": (8, "h100-sxm-80gb"), "ml.p5e.48xlarge": (8, "h200"), "ml.p5en.48xlarge": (8, "h200"),
    "ml.p6-b200.48xlarge": (8, "b200"),
    "ml.g5.xlarge": (1, None), "ml.g5.2xlarge": (1, None), "ml.g5.4xlarge": (1, None), "ml.g5.8xlarge": (1, None),
    "ml.g5.16xlarge": (1, None), "ml.g5.12xlarge": (4, None), "ml.g5.24xlarge": (4, None),
    "ml.g5.48xlarge": (8, None),
    "ml.g6e.xlarge": (1, "l40s"), "ml.g6e.2xlarge": (1, "l40s"), "ml.g6e.4xlarge": (1, "l40s"),
    "ml.g6e.8xlarge": (1, "l40s"), "ml.g6e.16xlarge": (1, "l40s"), "ml.g6e.12xlarge": (4, "l40s"),
    "ml.g6e.24xlarge": (4, "l40s"), "ml.g6e.48xlarge": (8, "l40s"),
}
"""SageMaker training instance -> (GPUs, autotune GPU preset or None where there is none): AWS's accelerated
computing instance table (docs.aws.amazon.com/ec2/latest/instancetypes/ac.html; SageMaker's ml. types are these):
P3 V100 16 GB (P3dn 32 GB), P4d A100 40 GB, P4de A100 80 GB, P5 H100 80 GB, P5e / P5en H200, P6-B200 B200,
G5 A10G, G6e L40S."""


def is_sagemaker(data: dict) -> bool:
    return str(data.get("compute_environment")) == "AMAZON_SAGEMAKER"


def _kind(data: dict) -> str:
    kind = data.get("distributed_type")
    return "NO" if kind is False else str(kind)


def sagemaker_world_size(data: dict) -> tuple[int | None, str | None]:
    """(the ranks the job runs, the instance's GPU preset): num_machines x the instance's GPUs under DATA_PARALLEL,
    one process an instance otherwise; None where the instance type is not in :data:`SAGEMAKER_INSTANCES`."""
    gpus, preset = SAGEMAKER_INSTANCES.get(str(data.get("ec2_instance_type")), (None, None))
    machines = data.get("num_machines", 1)
    machines = machines if isinstance(machines, int) and not isinstance(machines, bool) and machines >= 1 else 1
    if _kind(data) != "DATA_PARALLEL":
        return 1, preset
    return (machines * gpus if gpus else None), preset


def sagemaker_problems(data: dict, table: dict, world_size: int, bad, near) -> None:
    """The problems of a SageMaker config (``bad(parts, message, fix, severity)`` records one; ``near(key, known)``
    the closest known key): SageMakerConfig's keys, its required fields, its distributed types, its size."""
    known = table["sagemaker_top"]
    for key in data:
        if key in ("dynamo_backend", "fp16"):  # converted by the loader (config_args.py:113-119), as for a cluster
            continue
        if key not in known:
            hint = near(key, known)
            fix = (f"did you mean {hint!r}?" if hint else "remove it") if key != "num_processes" else \
                "remove it: SageMaker runs num_machines instances of ec2_instance_type, every GPU of each"
            bad((str(key),), f"unknown key {key!r}: accelerate {table['version']} refuses the file "
                "(SageMakerConfig)", fix)
    for key in ("ec2_instance_type", "iam_role_name"):
        if not data.get(key):
            bad((key,), f"no {key}: SageMakerConfig requires it (accelerate's loader raises)",
                f"add {key}: ..." + (" (an ml. training instance type, e.g. ml.p5.48xlarge)"
                                     if key == "ec2_instance_type" else " (the SageMaker execution role)"))
    kind = data.get("distributed_type")
    choices = known["distributed_type"]["choices"]
    if kind is None:
        bad(("distributed_type",), "no distributed_type: accelerate's loader raises 'A `distributed_type` must be "
            "specified in the config file.'", f"add distributed_type: one of {', '.join(choices)}")
    elif kind == "NO":
        # process_config adds num_processes 1 for the string NO (config_args.py:111-112), which is no
        # SageMakerConfig field: the loader then refuses the file for that key; YAML's bare NO (false) passes.
        bad(("distributed_type",), "distributed_type is the string \"NO\": accelerate's loader adds num_processes "
            "for it, which SageMakerConfig refuses ('had unknown keys ([\\'num_processes\\'])')",
            "write it bare: distributed_type: NO (YAML reads false; accelerate then launches one process an "
            "instance, as its own SageMaker test config does)")
    elif kind is not False and str(kind) not in choices:
        bad(("distributed_type",), f"distributed_type is {kind!r}, not one of {', '.join(choices)} (SageMaker's "
            "distributed types)", f"use one of {', '.join(choices)}")
    elif kind == "MODEL_PARALLEL":
        bad(("distributed_type",), "MODEL_PARALLEL: accelerate 1.16 gives SageMaker no distribution for it "
            "(utils/launch.py:676-678): the script runs one process an instance, no model parallelism",
            "use DATA_PARALLEL, or configure smdistributed model parallelism in additional_args", "warning")
    mp = data.get("mixed_precision")
    if mp is not None and str(mp) not in known["mixed_precision"]["choices"]:
        bad(("mixed_precision",), f"mixed_precision is {mp!r}, not one of "
            f"{', '.join(known['mixed_precision']['choices'])}", "use one of them")
    machines = data.get("num_machines")
    if machines is not None and not (isinstance(machines, int) and not isinstance(machines, bool) and machines >= 1):
        bad(("num_machines",), f"num_machines must be a positive integer, got {machines!r}", "write num_machines: N")
        return
    instance = data.get("ec2_instance_type")
    world, _ = sagemaker_world_size(data)
    if instance and str(instance) not in SAGEMAKER_INSTANCES:
        bad(("ec2_instance_type",), f"{instance!r} is not a GPU training instance autotune knows: its GPU count "
            "(the job's world size) is not checked", "give the job's world size with --world-size (autotune knows the "
            "ml.p3, p3dn, p4d, p4de, p5, p5e, p5en, p6-b200, g5 and g6e types)", "warning")
    elif world is not None and world != world_size:
        bad(("num_machines",), f"{data.get('num_machines', 1)} x {instance} runs {world} rank(s) "
            f"({_kind(data)}), the job has {world_size}", "make num_machines x the instance's GPUs the world size")
