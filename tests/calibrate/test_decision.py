"""The decision rule on constructed arms: measured speedups (`choose`) and predicted ones
(`choose_predicted`) go through the same rule: the best wins, the shorter draft among equals, and
speculation only above the margin."""

from __future__ import annotations

import pytest

from batchspec.calibrate.decision import choose, choose_predicted, stays, takes_over
from batchspec.engine.base import NO_SPEC, SpecConfig
from batchspec.stats import ArmResult

NGRAM = [SpecConfig("ngram", k) for k in (2, 4, 6)]


def arm(method: str, k: int, tps: float | None, **kw) -> ArmResult:
    return ArmResult(method, k, tokens_per_s=tps, measured=tps is not None, **kw)


def test_speculation_is_chosen_only_above_the_margin():
    spec, reason = choose([arm("none", 0, 100.0), arm("ngram", 4, 104.0)], NGRAM, margin=0.05)
    assert spec is NO_SPEC and "not above the 5% margin" in reason
    spec, reason = choose([arm("none", 0, 100.0), arm("ngram", 4, 106.0)], NGRAM, margin=0.05)
    assert spec.label == "ngram:k=4" and "1.06x" in reason


def test_slower_speculation_is_never_chosen():
    spec, _ = choose([arm("none", 0, 100.0), arm("ngram", 2, 60.0), arm("ngram", 4, 90.0)], NGRAM, 0.0)
    assert spec is NO_SPEC


def test_ties_go_to_the_shorter_draft_and_to_none():
    spec, _ = choose([arm("none", 0, 100.0), arm("ngram", 6, 150.0), arm("ngram", 2, 150.0)], NGRAM, 0.05)
    assert spec.label == "ngram:k=2"
    spec, _ = choose([arm("none", 0, 100.0), arm("ngram", 4, 100.0)], NGRAM, 0.0)
    assert spec is NO_SPEC  # equal to plain is not better than plain


def test_errored_and_predicted_only_arms_never_win():
    results = [
        arm("none", 0, 100.0),
        arm("ngram", 2, 500.0, error="draft model failed to load"),
        ArmResult("ngram", 6, predicted_tokens_per_s=900.0),  # predicted, never measured
        arm("ngram", 4, 120.0),
    ]
    spec, _ = choose(results, NGRAM, 0.05)
    assert spec.label == "ngram:k=4"


def test_no_measured_baseline_means_none():
    spec, reason = choose([arm("ngram", 4, 120.0)], NGRAM, 0.05)
    assert spec is NO_SPEC and "plain decoding could not be measured" in reason


def predicted(k: int, speedup: float | None) -> ArmResult:
    return ArmResult("ngram", k, predicted_speedup=speedup)


@pytest.mark.parametrize("speedups,margin,label", [
    ({4: 1.04}, 0.05, "none"),  # not above the margin
    ({4: 1.06}, 0.05, "ngram:k=4"),
    ({6: 1.5, 2: 1.5}, 0.05, "ngram:k=2"),  # a tie goes to the shorter draft
    ({4: 1.0}, 0.0, "none"),  # equal to plain is not better than plain
    ({2: 0.6, 4: 0.9}, 0.0, "none"),
])
def test_predicted_speedups_follow_the_same_rule_as_measured_ones(speedups, margin, label):
    results = [ArmResult("none", 0)] + [predicted(k, s) for k, s in speedups.items()]
    spec, reason = choose_predicted(results, NGRAM, margin)
    assert spec.label == label
    measured = [arm("none", 0, 100.0)] + [arm("ngram", k, 100.0 * s) for k, s in speedups.items()]
    assert choose(measured, NGRAM, margin)[0].label == label
    assert "predicted" in reason and "measured" not in reason


def test_nothing_predicted_means_none_and_says_so():
    spec, reason = choose_predicted([ArmResult("none", 0), predicted(4, None)], NGRAM, 0.05)
    assert spec is NO_SPEC and reason == "no speculative arm could be predicted"


@pytest.mark.parametrize("speedups,running,label", [
    ({4: 1.19, 6: 1.16}, 6, "ngram:k=6"),  # k=4 is faster, not by the margin: the running arm stays
    ({4: 1.25, 6: 1.16}, 6, "ngram:k=4"),  # faster by more than the margin: it takes over
    ({4: 1.06, 6: 1.04}, 6, "ngram:k=4"),  # the running arm no longer pays: the rule's choice stands
    ({4: 1.19, 6: 1.16}, None, "ngram:k=4"),  # nothing running (the sample decoded plainly)
    ({2: 1.10, 6: 1.05}, 2, "ngram:k=2"),  # the rule chose the running arm itself
])
def test_an_arm_the_sample_ran_under_gives_way_only_to_one_faster_by_the_margin(speedups, running, label):
    """A key's later shard decodes its sample under the key's last arm. Another arm replaces it
    only where predicted faster by the margin, the drift watch's rule for a running arm
    (`takes_over`), and only while the running arm still pays; else the rule's choice stands."""
    results = [ArmResult("none", 0)] + [predicted(k, s) for k, s in speedups.items()]
    chosen, _ = choose_predicted(results, NGRAM, 0.05)
    ran = SpecConfig("ngram", running) if running else NO_SPEC
    kept = stays(results, ran, chosen, 0.05)
    assert (kept[0].label if kept else chosen.label) == label
    assert takes_over(1.25, 1.16, 0.05) and not takes_over(1.19, 1.16, 0.05) and not takes_over(1.21, 1.16, 0.05)
