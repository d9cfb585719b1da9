"""The batched KV cache alone: prefill grouping, slots cut instead of left as holes, and a
prefill's last logits the same whichever way rows are grouped."""

from __future__ import annotations

import pytest
import torch

from batchspec.engine.torch.kv import Batch, prefill, prefill_groups


@pytest.mark.parametrize(("lengths", "waste", "groups"), [
    ([5, 5, 5], 0.0, [[0, 1, 2]]),
    ([3, 4, 4, 9], 0.0, [[0], [1, 2], [3]]),
    ([3, 4, 4, 9], 0.2, [[0, 1, 2], [3]]),  # 3 pads 1 of 11 tokens; adding 9 would pad 16
    ([10, 11, 12, 40], 1.0, [[0, 1, 2], [3]]),  # 40 would pad 87 of 73 tokens
    ([10, 11, 12, 40], 2.0, [[0, 1, 2, 3]]),
    ([], 0.0, []),
])
def test_prefill_groups_pad_at_most_the_allowed_waste(lengths, waste, groups):
    assert [list(g) for g in prefill_groups(lengths, waste)] == groups


def test_slots_no_row_keeps_are_cut_so_a_single_row_stays_dense(word_models):
    target, _, _ = word_models
    batch = Batch(torch.device("cpu"))
    with torch.inference_mode():
        batch.forward(target, [[1, 2, 3, 4]])
        batch.keep(torch.tensor([4]))
        for kept in (2, 1, 5):  # a verify of 5 tokens keeping some: the rest leave no holes
            batch.forward(target, [[5, 6, 7, 8, 9]])
            batch.keep(torch.tensor([kept]))
            assert batch.dense and batch.slots == int(batch.positions[0]) == batch.cache.layers[0].length
        batch.drop_last(torch.tensor([3]))
        assert batch.dense and batch.slots == int(batch.positions[0]) == 4 + 2 + 1 + 5 - 3


def test_rows_of_unequal_length_keep_holes_and_a_mask(word_models):
    target, _, _ = word_models
    batch = Batch(torch.device("cpu"))
    with torch.inference_mode():
        batch.forward(target, [[1, 2, 3], [4, 5]])
        batch.keep(torch.tensor([3, 2]))
    assert not batch.dense and batch.positions.tolist() == [3, 2] and batch.slots == 3
    assert "attention_mask" in batch._attention_inputs(1)


@pytest.mark.parametrize("waste", [0.0, 10.0])
def test_prefill_last_logits_do_not_depend_on_grouping(word_models, waste):
    target, _, _ = word_models
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10]]
    with torch.inference_mode():
        batch, last = prefill(target, prompts, 0, torch.device("cpu"), waste)
        alone = torch.stack([target(torch.tensor([p])).logits[0, -1] for p in prompts])
    assert batch.positions.tolist() == [3, 5, 2]
    torch.testing.assert_close(last, alone, rtol=1e-5, atol=1e-5)


def test_a_fork_is_the_rows_cut_to_a_shorter_context_and_leaves_its_seed_alone(word_models):
    """Profile probes start from one prefilled row: a fork to 3 rows of its first 4 slots must
    compute what a fresh prefill of those 4 tokens would, and the seed must not change."""
    target, _, _ = word_models
    cpu = torch.device("cpu")
    with torch.inference_mode():
        seed = Batch(cpu)
        seed.forward(target, [[1, 2, 3, 4, 5, 6, 7]])
        seed.keep(torch.tensor([7]))
        forked = seed.fork(torch.zeros(3, dtype=torch.long), 4)
        assert forked.size == 3 and forked.slots == 4 and forked.positions.tolist() == [4, 4, 4] and forked.dense
        got = forked.forward(target, [[9, 10]] * 3)
        fresh = target(torch.tensor([[1, 2, 3, 4, 9, 10]])).logits[0, -2:]
        for row in got:
            torch.testing.assert_close(row, fresh, rtol=1e-5, atol=1e-5)
        assert seed.size == 1 and seed.slots == 7 and seed.positions.tolist() == [7]
        assert seed.cache.layers[0].length == 7 and seed.cache.layers[0].keys.shape[2] == 7
