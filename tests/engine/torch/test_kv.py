"""The batched KV cache alone: prefill grouping, slots cut instead of left as holes, and a
prefill's last logits the same whichever way rows are grouped."""

from __future__ import annotations

import functools

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


def test_prefill_asks_for_last_logits_in_forms_every_transformers_5_takes(word_models):
    """logits_to_keep as an int or a 1D tensor of positions only: transformers before 5.25 reads a
    2D tensor as positions for every row ([B, B, 1, V] logits), which broke the first GPU prefill of
    rows of unequal length (H200, transformers 5.17, 2026-12-04)."""
    target, _, _ = word_models
    seen = []
    forward = target.forward

    @functools.wraps(forward)  # the signature stays: prefill asks it whether logits_to_keep is taken
    def recording(*args, **kwargs):
        seen.append(kwargs.get("logits_to_keep"))
        return forward(*args, **kwargs)

    target.forward = recording
    try:
        with torch.inference_mode():
            prefill(target, [[1, 2, 3], [4, 5, 6, 7], [9, 10, 11]], 0, torch.device("cpu"), 10.0)  # one group
            prefill(target, [[1, 2], [3, 4]], 0, torch.device("cpu"), 0.0)
    finally:
        del target.forward
    assert seen[0].tolist() == [2, 3] and seen[1] == 1


def _one_row(model, tokens: list[int]) -> Batch:
    """A batch of one row prefilled with `tokens`, all kept: the seed a profile's probes fork."""
    seed = Batch(torch.device("cpu"))
    seed.forward(model, [tokens])
    seed.keep(torch.tensor([len(tokens)]))
    return seed


def test_a_fork_is_the_rows_cut_to_a_shorter_context_and_leaves_its_seed_alone(word_models):
    """Profile probes start from one prefilled row: a fork to 3 rows of its first 4 slots must
    compute what a fresh prefill of those 4 tokens would, and the seed must not change."""
    target, _, _ = word_models
    with torch.inference_mode():
        seed = _one_row(target, [1, 2, 3, 4, 5, 6, 7])
        forked = seed.fork(torch.zeros(3, dtype=torch.long), 4)
        assert forked.size == 3 and forked.slots == 4 and forked.positions.tolist() == [4, 4, 4] and forked.dense
        got = forked.forward(target, [[9, 10]] * 3)
        fresh = target(torch.tensor([[1, 2, 3, 4, 9, 10]])).logits[0, -2:]
        for row in got:
            torch.testing.assert_close(row, fresh, rtol=1e-5, atol=1e-5)
        assert seed.size == 1 and seed.slots == 7 and seed.positions.tolist() == [7]
        assert seed.cache.layers[0].length == 7 and seed.cache.layers[0].keys.shape[2] == 7


def test_a_fork_with_room_appends_into_its_buffers_and_computes_what_one_without_does(word_models):
    """A profile probe forks with room for its widest forward, as a decoding batch's cache has
    room between doublings: the forward must not regrow the buffers, and must compute the same."""
    target, _, _ = word_models
    with torch.inference_mode():
        seed = _one_row(target, [1, 2, 3, 4, 5, 6, 7])
        tight, roomy = seed.fork(torch.zeros(2, dtype=torch.long), 5), seed.fork(torch.zeros(2, dtype=torch.long), 5, room=3)
        buffer = roomy.cache.layers[0].k_buf.data_ptr()
        assert roomy.cache.layers[0].k_buf.shape[2] == 8 and tight.cache.layers[0].k_buf.shape[2] == 5  # room, no more
        assert all(bool((buf[:, :, 5:] == 0).all()) for l in roomy.cache.layers for buf in (l.k_buf, l.v_buf))  # zeros
        torch.testing.assert_close(roomy.cache.layers[0].keys, tight.cache.layers[0].keys)
        torch.testing.assert_close(roomy.forward(target, [[9, 10, 11]] * 2), tight.forward(target, [[9, 10, 11]] * 2))
        assert roomy.cache.layers[0].k_buf.data_ptr() == buffer
        assert tight.cache.layers[0].k_buf.shape[2] > 5  # regrown: the copy a probe without room would time


def test_a_repeated_batch_has_the_asked_slots_filled_with_the_rows_own_and_decodes_from_there(word_models):
    """A profile's seed row is a short prefill repeated to the widest context: the shape of a
    prefilled row of that length, with the short row's keys and values over and over."""
    target, _, _ = word_models
    with torch.inference_mode():
        seed = _one_row(target, [1, 2, 3])
        long = seed.repeated(8)
        assert long.size == 1 and long.slots == 8 and long.positions.tolist() == [8] and long.dense
        keys = long.cache.layers[0].keys
        assert keys.shape[2] == 8 and all(torch.equal(keys[:, :, i], seed.cache.layers[0].keys[:, :, i % 3]) for i in range(8))
        assert seed.slots == 3  # the seed is left as it was
        forked = long.fork(torch.zeros(4, dtype=torch.long), 6, room=2)
        assert forked.forward(target, [[4, 5]] * 4).shape[:2] == (4, 2) and forked.slots == 8


@pytest.mark.parametrize(("finished", "keep"), [
    ([False, False, True, False, False, True, False, False], [0, 1, 6, 3, 4, 7]),
    ([True, False, False], [2, 1]),
    ([False, False, True], [0, 1]),
    ([True, True], []),
    ([False], [0]),
])
def test_finished_rows_are_replaced_from_the_end_so_the_rest_stay_in_place(finished, keep):
    from batchspec.engine.torch.kv import moves_in_place, survivors

    assert survivors(finished) == keep
    to, frm = moves_in_place(keep)
    assert len(to) == sum(finished[: len(keep)])  # one row copied per place a finished row left below the new end
    assert moves_in_place([1, 0]) is None and moves_in_place([0, 0]) is None  # a swap, a duplicate: gathered


def _rows_alone(target, rows):
    return [target(torch.tensor([r])).logits[0, -1] for r in rows]


def test_rows_leave_and_join_by_moving_only_themselves_and_compute_what_they_would_alone(word_models):
    """Continuous batching on the cache: rows 1 and 3 of 5 finish (row 4 takes place 1, row 3's
    place is past the end), two new rows join into the free rows, one longer than the batch. The
    buffers are not reallocated, and every row's next logits equal its own sequence run alone."""
    target, _, _ = word_models
    cpu = torch.device("cpu")
    prompts = [[1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11, 12], [13, 14, 15, 16]]
    with torch.inference_mode():
        batch, _ = prefill(target, prompts, 0, cpu, 10.0)
        batch.forward(target, [[20]] * 5)
        batch.keep(torch.ones(5, dtype=torch.long))
        seqs = [p + [20] for p in prompts]
        layer = batch.cache.layers[0]
        buffer = layer.k_buf.data_ptr()
        batch.select([0, 4, 2])
        assert layer.k_buf.data_ptr() == buffer and layer.rows == 3
        seqs = [seqs[0], seqs[4], seqs[2]]
        joining = [[30, 31], [40, 41, 42, 43, 44, 45, 46]]
        fresh, _ = prefill(target, joining, 0, cpu, 0.0)
        batch.extend(fresh)
        seqs += joining
        assert layer.rows == 5 and layer.k_buf.data_ptr() == buffer and not batch.dense  # joined into free rows
        got = batch.forward(target, [[50]] * 5)[:, -1]
        torch.testing.assert_close(got, torch.stack(_rows_alone(target, [s + [50] for s in seqs])), rtol=1e-5, atol=1e-5)
        batch.keep(torch.ones(5, dtype=torch.long))
        batch.select([3, 1])  # place 0 taken by row 3 from past the new end; row 1 stays
        assert layer.rows == 2 and layer.k_buf.data_ptr() == buffer
        batch.select([1, 0])  # a swap: gathered, into buffers of the same capacity
        assert layer.rows == 2 and layer.k_buf.shape[0] >= 5
        got = batch.forward(target, [[60]] * 2)[:, -1]
        want = [seqs[1] + [50, 60], seqs[3] + [50, 60]]
        torch.testing.assert_close(got, torch.stack(_rows_alone(target, want)), rtol=1e-5, atol=1e-5)
