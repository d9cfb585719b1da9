"""What a worker carries from one shard to the next (`WorkerState`)."""

from __future__ import annotations

from batchspec.calibrate import WorkerState
from batchspec.calibrate.worker import VERIFY_TOKENS
from batchspec.engine.base import NO_SPEC, SpecConfig

K4, K8 = SpecConfig("ngram", 4), SpecConfig("ngram", 8)


def test_a_new_key_starts_under_the_arm_the_workers_other_keys_chose_not_the_last_ones():
    worker = WorkerState()
    worker.remember("a", K4, [{}] * 40)
    worker.remember("b", K4, [{}] * 40)
    worker.remember("c", K8, [{}] * 16)  # the last shard, of a key unlike most
    arm, why, own = worker.start("new", None, [K4, K8])
    assert arm == K4 and "other keys chose" in why and not own  # another key's arm: provisional
    assert worker.start("c", None, [K4, K8])[::2] == (K8, True)  # a key's own last arm first
    assert worker.start("new", K8, [K4, K8])[::2] == (K8, True)  # then the driver's, the key's own too
    assert worker.start("new", None, [K8])[0] == K8  # only an arm still among the candidates


def test_a_start_is_the_keys_own_only_from_its_last_shard_or_the_drivers_prior():
    """`Start.own` (what the controller's `provisional` negates) is the source of the arm, not its
    reason's text: a driver's prior whose reason reads like another's is still the key's own, and a
    first shard's default and the live engine of another key are not."""
    assert not WorkerState().start("a", None, [K4, K8]).own  # a first shard's default
    assert WorkerState().start("a", K4, [K4, K8], prior_why="the arm the worker's other keys chose").own
    worker = WorkerState()
    worker.remember("b", K8, [])
    assert not worker.start("a", None, [K4, K8], builds=True).own  # another key's live engine
    # the other keys' arm, though the prior's reason (had there been a prior) reads the same
    assert not worker.start("a", None, [K4, K8], prior_why="the arm the worker's other keys chose").own
    assert not WorkerState().start("a", None, [K4, K8], builds=True, rows=8).own  # a first build


def test_the_other_keys_vote_by_method_first_then_draft_length():
    """Keys that drafted, split across draft lengths, outvote plain decoding's where together they
    ran more rows (by label alone plain decoding's 30 rows beat each length's 20); within the method
    the draft length with the most rows."""
    worker = WorkerState()
    worker.remember("a", NO_SPEC, [{}] * 30)
    worker.remember("b", K4, [{}] * 20)
    worker.remember("c", K8, [{}] * 18)
    worker.remember("d", K4, [{}] * 5)
    assert worker.start("new", None, [K4, K8])[0] == K4
    worker.remember("e", NO_SPEC, [{}] * 40)  # now plain decoding's 70 rows outvote n-gram's 43
    assert worker.start("new", None, [K4, K8])[0] == NO_SPEC


def test_where_arms_are_builds_a_new_key_starts_under_the_live_engine():
    worker = WorkerState()
    worker.remember("a", K4, [{}] * 40)
    worker.remember("c", K8, [{}] * 16)
    assert worker.start("new", None, [K4, K8], builds=True)[0] == K8


def test_a_workers_first_build_is_the_longest_ngram_draft_whose_verify_stays_memory_bound():
    """Where arms are builds the first engine is what a short job runs throughout: the longest n-gram
    draft whose verify at the rows of a step is at most VERIFY_TOKENS tokens, else plain decoding
    (past the tokens where a forward turns compute-bound a verify costs its width)."""
    arms = [SpecConfig("ngram", k) for k in (2, 4, 6, 8)]
    first = {rows: WorkerState().start("a", None, arms, builds=True, rows=rows) for rows in (1, 8, 32, 40, 128)}
    assert {rows: start.arm.label for rows, start in first.items()} == {
        1: "ngram:k=8", 8: "ngram:k=8", 32: "ngram:k=6", 40: "ngram:k=4", 128: "none"}
    assert "first build" in first[128][1] and f"{VERIFY_TOKENS} tokens" in first[128][1]
    assert WorkerState().start("a", None, arms, rows=128)[0].label == "none"  # no build: plain decoding first
    assert WorkerState().start("a", K8, arms, builds=True, rows=8)[0] == K8  # the driver's prior before it
    # a prior whose verify is past VERIFY_TOKENS at the batch (a prior run never ran it: priced as
    # its nearest step) does not pick the first engine
    assert WorkerState().start("a", K8, arms, builds=True, rows=32)[0].label == "ngram:k=6"
    assert WorkerState().start("a", NO_SPEC, arms, builds=True, rows=128)[0] == NO_SPEC
