"""The later files of the real-world corpus (tests/fixtures/realworld, sources in its SOURCES.md), which
test_realworld_corpus.py checks with the rest: file -> (the job's flags, warnings the engine itself prints)."""

GOOD_MORE = {
    # Megatron warns about --sequence-parallel at tp 1 too; its args array re-assigned with "${PRETRAIN_ARGS[@]}" and
    # run inside `sbatch <<EOF ... bash -x -c "${TRAINING_CMD}"`: about 80 "given 3 times" warnings before
    "megatron_fsdp_sbatch_mfsdp_deepseek_v3.sh": (["--world-size", "8"], ["--sequence-parallel"]),
    # its settings come from the environment and conf/arguments.sh (not here): "not checked" warnings; Model
    # Optimizer's flags on pretrain_hybrid.py (the branch read) parse where nvidia-modelopt is installed, as on
    # pretrain_gpt.py (3 "unexpected argument" and 2 "unrecognized argument" errors before)
    "megatron_modelopt_train.sh": (["--world-size", "8"], [
        "${MODEL_ARGS}", "${MLM_RESUME_ARGS}", "${MLM_EXTRA_ARGS}", "--modelopt-enabled", "--export-te-mcore-model",
        "--tensor-model-parallel-size", "--expert-tensor-parallel-size", "--expert-model-parallel-size",
        "--pipeline-model-parallel-size", "--context-parallel-size"]),
    # `if [ "$1" = "-d" ]` read its debug branch (an unknown test): a `debugpy-run` line no launch, the launcher's
    # --nproc_per_node / --nnodes linted as Megatron's (4 errors); examples/mimo/train.py adds the 2 flags warned of
    "megatron_mimo_run_mock_train.sh": ([], ["--dataset-provider", "--model-provider"]),
    "bridge_llama32_1b_finetune.yaml": (["--world-size", "8"], []),
    # run_recipe.py's overrides from `$(echo "$CLI_OVERRIDES" | tr ...)`, which the shell fills at launch: a "not
    # checked" warning (an error before: "Expected override in KEY=VALUE form")
    "bridge_gpt_oss_slurm_peft.sh": (["--world-size", "8"],
                                     ['$(echo "$CLI_OVERRIDES" | tr \'\\n\' \' \' | sed \'s/  \\+/ /g\')']),
    # a run_conversion.py line (in a function) before its run_recipe.py line was read as the job: "--micro-batch-size
    # is required" and 6 "no flag of Megatron-core's parser" warnings
    "bridge_gemma4_slurm_pretrain.sh": (["--world-size", "8"], []),
    # its run_recipe.py line inside a single-quoted script: "${OPTIONAL_OVERRIDES[@]}" and ${BLEND_PATHS} left to
    # the shell that runs it (run_recipe.py's "Expected override in KEY=VALUE form" before, then "does not read")
    "bridge_nemotron_3_ultra_slurm_pretrain.sh": (["--world-size", "8"], [
        "${OPTIONAL_OVERRIDES[@]}", "dataset.blend=[[${BLEND_PATHS}],null]"]),
}

BAD_MORE: dict = {}
