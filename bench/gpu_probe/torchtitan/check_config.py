"""Preflight (no GPU needed): parse the bundle's config with run_tt.sh's exact flags through
torchtitan's ConfigManager, then build the tokenizer and pull one batch from the dataloader,
offline. Invoked by `TT_CHECK=1 run_tt.sh BUNDLE STEPS LOGFILE`; prints JSON, exit 0 if OK."""
import json, sys
import autotune_tt_compat  # noqa: F401  (torch<2.13 back-fills, before torchtitan)
from torchtitan.config import ConfigManager

cfg = ConfigManager().parse_args(sys.argv[1:])
out = {
    "model_spec": type(cfg.model_spec.model).__qualname__,
    "hf_assets_path": cfg.hf_assets_path,
    "dataset": [cfg.dataloader.dataset, cfg.dataloader.dataset_path],
    "checkpoint.enable": cfg.checkpoint.enable,
    "metrics": [cfg.metrics.log_freq, cfg.metrics.enable_tensorboard, cfg.metrics.enable_wandb],
    "profiler": cfg.profiler.enable_profiling,
    "validator": cfg.validator.enable,
    "training": {k: getattr(cfg.training, k) for k in ("steps", "seq_len", "local_batch_size", "global_batch_size")},
    "ac": type(cfg.activation_checkpoint).__qualname__,
    "cuda_graphs": not cfg.training.disable_cuda_graphs,
    "spmd_backend": cfg.parallelism.spmd_backend,
    "parallelism": {k: getattr(cfg.parallelism, k) for k in ("data_parallel_shard_degree", "tensor_parallel_degree", "pipeline_parallel_degree")},
    "loss_vocab": cfg.loss.loss_fn.global_vocab_size,
}
tok = cfg.tokenizer.build(tokenizer_path=cfg.hf_assets_path)
out["tokenizer_vocab"] = tok.get_vocab_size()
ids = tok.encode("hello offline world", add_bos=True, add_eos=True)
out["sample_ids_max"] = max(ids)
assert tok.get_vocab_size() <= cfg.loss.loss_fn.global_vocab_size
dl = cfg.dataloader.build(dp_world_size=1, dp_rank=0, tokenizer=tok,
                          seq_len=min(cfg.training.seq_len, 512), local_batch_size=1)
batch = next(iter(dl))
inputs, labels = batch
out["batch"] = {"labels": list(labels.shape), "input_keys": sorted(inputs) if isinstance(inputs, dict) else str(type(inputs))}
print(json.dumps(out, indent=1, default=str))
