"""What a worker carries from one shard to the next (`WorkerState`)."""

from __future__ import annotations

from batchspec.calibrate import WorkerState
from batchspec.engine.base import SpecConfig

K4, K8 = SpecConfig("ngram", 4), SpecConfig("ngram", 8)


def test_a_new_key_starts_under_the_arm_the_workers_other_keys_chose_not_the_last_ones():
    worker = WorkerState()
    worker.remember("a", K4, [{}] * 40)
    worker.remember("b", K4, [{}] * 40)
    worker.remember("c", K8, [{}] * 16)  # the last shard, of a key unlike most
    arm, why = worker.start("new", None, [K4, K8])
    assert arm == K4 and "other keys chose" in why
    assert worker.start("c", None, [K4, K8])[0] == K8  # a key's own last arm first
    assert worker.start("new", K8, [K4, K8])[0] == K8  # then the driver's
    assert worker.start("new", None, [K8])[0] == K8  # only an arm still among the candidates


def test_where_arms_are_builds_a_new_key_starts_under_the_live_engine():
    worker = WorkerState()
    worker.remember("a", K4, [{}] * 40)
    worker.remember("c", K8, [{}] * 16)
    assert worker.start("new", None, [K4, K8], builds=True)[0] == K8
