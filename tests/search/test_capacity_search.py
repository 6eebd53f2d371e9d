"""--min-gpus searches the GPU count from below: the answer is the first feasible count (as a binary search over
every count finds it), and it costs a few searches of small clusters, not one of 65,536 GPUs."""

from types import SimpleNamespace

import pytest

from autotune.search import capacity
from autotune.specs.loading import load_cluster

CLUSTER = load_cluster(gpu="h100-sxm-80gb", num_gpus=8, gpus_per_node=None, cluster_path=None)
COUNTS = capacity._gpu_counts(8, 512)


def fake_search(threshold, asked):
    def feasible(model, cluster, seq_len, global_batch, constraints):
        asked.append(cluster.num_gpus)
        return SimpleNamespace(num_feasible=int(threshold is not None and cluster.num_gpus >= threshold),
                               num_gpus=cluster.num_gpus)
    return feasible


@pytest.mark.parametrize("threshold", [*COUNTS, None])
def test_smallest_is_the_first_feasible_count(monkeypatch, threshold):
    asked: list[int] = []
    monkeypatch.setattr(capacity, "_feasible", fake_search(threshold, asked))
    n, result = capacity._smallest(None, CLUSTER, 4096, None, None, 512)
    assert n == threshold
    if threshold is None:
        assert result is None and asked[-1] == COUNTS[-1]
    else:
        assert result.num_gpus == threshold  # the search at the answer, as a full search there returns it
        assert max(asked) <= 2 * threshold + 8  # never a search far above the answer
    assert len(asked) <= 2 * len(COUNTS).bit_length() + 1


def test_max_model_searches_each_size_once(monkeypatch):
    asked: list[int] = []

    def feasible(model, cluster, seq_len, global_batch, constraints):
        asked.append(model.hidden_size)
        return SimpleNamespace(num_feasible=int(model.hidden_size <= 8192), candidates=())

    monkeypatch.setattr(capacity, "_feasible", feasible)
    capacity.max_model(CLUSTER, seq_len=4096, max_hidden=16384)
    assert len(asked) == len(set(asked))
