"""Tests for the frozen-prefix cache: lazy filling, keys, LRU budget, invalidation, copies."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

from privaterec.models.plm_cache import FrozenPrefixCache, length_groups, parameter_digest


class Recorder:
    """``compute`` for the cache: value of key row r = r as floats + 0.5; logs each call."""

    def __init__(self, keys: torch.Tensor) -> None:
        self.keys = keys
        self.calls: list[list[int]] = []

    def __call__(self, index: torch.Tensor) -> list[torch.Tensor]:
        assert not torch.is_grad_enabled()
        self.calls.append(index.tolist())
        return list(self.keys[index].float() + 0.5)


def test_computes_each_distinct_missing_row_once_and_returns_per_row() -> None:
    cache = FrozenPrefixCache()
    keys = torch.tensor([[3, 4], [5, -1], [3, 4], [7, 7]])
    rec = Recorder(keys)
    out = cache.get_or_compute(keys, rec)
    assert rec.calls == [[0, 1, 3]]  # first position of each distinct key
    assert [v.tolist() for v in out] == [[3.5, 4.5], [5.5, -0.5], [3.5, 4.5], [7.5, 7.5]]
    assert (cache.misses, cache.hits, len(cache)) == (3, 1, 3)
    # a second batch: known rows are hits, only the new row is computed
    keys2 = torch.tensor([[7, 7], [1, 2], [3, 4]])
    rec2 = Recorder(keys2)
    out2 = cache.get_or_compute(keys2, rec2)
    assert rec2.calls == [[1]]
    assert [v.tolist() for v in out2] == [[7.5, 7.5], [1.5, 2.5], [3.5, 4.5]]
    assert (cache.misses, cache.hits, len(cache)) == (4, 3, 4)
    assert cache.nbytes == 4 * 2 * 4


def test_row_length_is_part_of_the_key() -> None:
    cache = FrozenPrefixCache()
    cache.get_or_compute(torch.tensor([[1, 2]]), Recorder(torch.tensor([[1, 2]])))
    longer = torch.tensor([[1, 2, 0]])
    rec = Recorder(longer)
    (value,) = cache.get_or_compute(longer, rec)
    assert rec.calls == [[0]] and value.tolist() == [1.5, 2.5, 0.5]


def test_lru_eviction_within_the_byte_budget() -> None:
    cache = FrozenPrefixCache(max_bytes=2 * 8)  # two values of 2 float32
    rows = [torch.tensor([[i, i]]) for i in range(4)]
    for i in (0, 1):
        cache.get_or_compute(rows[i], Recorder(rows[i]))
    cache.get_or_compute(rows[0], Recorder(rows[0]))  # 0 becomes the most recent
    cache.get_or_compute(rows[2], Recorder(rows[2]))  # evicts 1, the least recent
    assert len(cache) == 2 and cache.nbytes == 16
    for i, expect_compute in ((0, False), (2, False), (1, True)):
        rec = Recorder(rows[i])
        (value,) = cache.get_or_compute(rows[i], rec)
        assert bool(rec.calls) == expect_compute, i
        assert value.tolist() == [i + 0.5, i + 0.5]
    big = torch.tensor([[1, 2, 3, 4, 5]])  # larger than the budget: returned, not stored
    (value,) = cache.get_or_compute(big, Recorder(big))
    assert value.tolist() == [1.5, 2.5, 3.5, 4.5, 5.5] and cache.nbytes <= 16


def test_validate_clears_only_when_frozen_values_change() -> None:
    cache = FrozenPrefixCache()
    layer = nn.Linear(3, 2)
    keys = torch.tensor([[1], [2]])
    cache.validate(layer.parameters())
    cache.get_or_compute(keys, Recorder(keys))
    # same values through a new object or an in-place identical write: entries kept
    cache.validate(copy.deepcopy(layer).parameters())
    with torch.no_grad():
        layer.weight.copy_(layer.weight.clone())
    cache.validate(layer.parameters())
    assert len(cache) == 2
    # any in-place change of a value: entries dropped
    with torch.no_grad():
        layer.bias[0] += 1e-3
    cache.validate(layer.parameters())
    assert len(cache) == 0


def test_parameter_digest_sees_values_dtype_and_shape() -> None:
    a = torch.arange(6.0)
    assert parameter_digest([a]) == parameter_digest([a.clone()])
    one_ulp = a.clone()
    one_ulp[5] = torch.nextafter(a[5], torch.tensor(10.0))
    assert parameter_digest([a]) != parameter_digest([one_ulp])
    assert parameter_digest([a]) != parameter_digest([a.double()])
    assert parameter_digest([a]) != parameter_digest([a.reshape(2, 3)])


def test_deepcopy_shares_and_pickle_drops_the_entries() -> None:
    cache = FrozenPrefixCache(max_bytes=1000)
    keys = torch.tensor([[1], [2]])
    cache.get_or_compute(keys, Recorder(keys))
    assert copy.deepcopy(cache) is cache
    restored = pickle.loads(pickle.dumps(cache))
    assert len(restored) == 0 and restored.max_bytes == 1000


def test_values_filled_in_inference_mode_are_normal_tensors() -> None:
    cache = FrozenPrefixCache()
    keys = torch.tensor([[1, 2]])
    with torch.inference_mode():
        cache.get_or_compute(keys, Recorder(keys))
    (value,) = cache.get_or_compute(keys, Recorder(keys))
    assert not value.is_inference()
    w = torch.ones(2, requires_grad=True)
    (grad,) = torch.autograd.grad((value * w).sum(), w)
    assert grad.tolist() == [1.5, 2.5]


def test_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        FrozenPrefixCache(max_bytes=-1)
    cache = FrozenPrefixCache()
    with pytest.raises(ValueError, match="compute returned 1 values for 2 keys"):
        cache.get_or_compute(torch.tensor([[1], [2]]), lambda index: [torch.zeros(1)])


def _padded_size(groups: list[list[int]], lengths: list[int]) -> int:
    return sum(len(g) * max(lengths[i] for i in g) for g in groups)


@pytest.mark.parametrize("lengths,max_groups", [
    ([3, 5, 5, 18, 18, 9, 3], 2), ([7, 7, 7], 3), ([4, 9, 2, 2, 11, 6, 6, 9, 3], 3),
    ([10, 1], 1), ([5, 6, 7, 8], 4)])
def test_length_groups_cover_items_and_minimise_padding(lengths: list[int],
                                                        max_groups: int) -> None:
    from itertools import combinations

    groups = length_groups(lengths, max_groups)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert 1 <= len(groups) <= max_groups
    # brute force over every split of the sorted distinct lengths into <= max_groups ranges
    values = sorted(set(lengths))
    best = min(
        sum(sum(1 for x in lengths if lo < x <= hi) * hi
            for lo, hi in zip((0, *cuts), (*cuts, values[-1])))
        for g in range(min(max_groups, len(values)))
        for cuts in combinations(values[:-1], g))
    assert _padded_size(groups, lengths) == best


def test_length_groups_examples_and_errors() -> None:
    assert length_groups([3, 5, 5, 18, 18, 9, 3], 2) == [[0, 6, 1, 2], [5, 3, 4]]
    assert length_groups([], 3) == []
    with pytest.raises(ValueError, match="max_groups"):
        length_groups([1], 0)
