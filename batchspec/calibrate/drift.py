"""Drift checks on the chunks a shard generates (shard.py calls them after each chunk), from the
chunk's own counterfactual acceptance priced as calibration prices a sample
(batchspec.calibrate.counterfactual):

- `switch_on` under "none": the rows just generated plainly; an arm that would have beaten plain
  decoding on them by the margin takes over.
- `while_speculating`: the rows the running arm generated are plain decoding's too (greedy
  speculation is lossless), so every arm's counterfactual on them is exact; a predicted loss sends
  the shard back to plain decoding, a faster draft length takes over.
"""

from __future__ import annotations

from typing import Sequence

from batchspec.calibrate.counterfactual import Anchor, WorkerCalibration, plain_rows, predict_arms
from batchspec.calibrate.decision import best, choose_predicted, predicted_speedups
from batchspec.engine.base import NO_SPEC, GenerateResult, Request, SpecConfig
from batchspec.stats import ArmResult


def _predict_chunk(engine, rows_done: Sequence[Request], result: GenerateResult, arms: Sequence[SpecConfig],
                   worker: WorkerCalibration, batch_size: int, greedy_only: bool = False) -> list[ArmResult] | None:
    """Drift checks: every arm in `arms` predicted on the chunk of rows `result` just generated,
    anchored on that run; None without rows, without a profile, or (`greedy_only`) with sampled rows."""
    rows = plain_rows(engine, rows_done, result)
    if not rows or not worker.profile.points or greedy_only and not all(r.greedy for r in rows):
        return None
    return predict_arms(engine, rows, arms, Anchor.of(result, rows, worker.profile, batch_size), worker.profile, batch_size)


def switch_on(engine, rows_done: Sequence[Request], result: GenerateResult, arms: Sequence[SpecConfig],
              worker: WorkerCalibration, batch_size: int, margin: float) -> tuple[SpecConfig | None, ArmResult | None]:
    """Drift under "none": the counterfactual of the rows just generated plainly. Returns the best
    arm and its prediction if its predicted speedup over them beats plain decoding by the margin,
    else (None, None). Free for n-gram lookup; one teacher-forced forward per draft model."""
    results = _predict_chunk(engine, rows_done, result, arms, worker, batch_size)
    if results is None:
        return None, None
    spec, _ = choose_predicted(results, arms, margin)
    if spec is NO_SPEC:
        return None, None
    return spec, next(a for a in results if a.label == spec.label)


def while_speculating(engine, rows_done: Sequence[Request], result: GenerateResult, spec: SpecConfig,
                      arms: Sequence[SpecConfig], worker: WorkerCalibration, batch_size: int,
                      margin: float) -> tuple[SpecConfig, ArmResult | None] | None:
    """Drift while speculating, from the rows `spec` just generated: greedy speculation is
    lossless, so their outputs are plain decoding's and every arm's counterfactual on them is
    exact, a chunk's worth of evidence where calibration had a sample's. Returns the setting for
    what follows and its prediction: plain decoding (or the best arm, if one pays by the margin)
    when `spec` is predicted to lose to plain decoding; another arm when it is predicted faster
    than `spec` by the margin (a draft length the sample misjudged); else `spec`. None when the
    counterfactual cannot tell (sampled rows, no profile)."""
    arms = list(arms) if any(a.label == spec.label for a in arms) else [*arms, spec]
    results = _predict_chunk(engine, rows_done, result, arms, worker, batch_size, greedy_only=True)
    if results is None:
        return None
    by_label = {a.label: a for a in results}
    running = by_label[spec.label].predicted_speedup
    if running is None:
        return None
    if running < 1.0:
        chosen, _ = choose_predicted(results, arms, margin)
        return chosen, by_label.get(chosen.label)
    top = best(predicted_speedups(results))
    if top is not None and top[0].label != spec.label and top[1] > running * (1 + margin):
        return next(a for a in arms if a.label == top[0].label), top[0]
    return spec, by_label[spec.label]
