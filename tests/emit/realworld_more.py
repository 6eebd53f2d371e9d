"""The later files of the real-world corpus (tests/fixtures/realworld, sources in its SOURCES.md), which
test_realworld_corpus.py checks with the rest: file -> (the job's flags, warnings the engine itself prints)."""

GOOD_MORE = {
    # Megatron warns about --sequence-parallel at tp 1 too; its args array re-assigned with "${PRETRAIN_ARGS[@]}" and
    # run inside `sbatch <<EOF ... bash -x -c "${TRAINING_CMD}"`: about 80 "given 3 times" warnings before
    "megatron_fsdp_sbatch_mfsdp_deepseek_v3.sh": (["--world-size", "8"], ["--sequence-parallel"]),
}

BAD_MORE: dict = {}
