"""What calibration keeps for the life of one worker (one engine), across its shards: the cost
profile, the keys it has confirmed, its predictions' recent errors, each key's last setting and
last rows, and what re-timing and drift checks have cost it. batchspec.calibrate.counterfactual
decides with it, calibrate.inflight and calibrate.drift read and update it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from batchspec.calibrate.pricing import Anchor, KeyHistory
from batchspec.calibrate.profiling import PROFILE_SHARE, retime_curve
from batchspec.predict.cost import CostProfile

HISTORY_KEYS = 64  # shard keys whose last rows (and errors) a worker keeps (WorkerCalibration.remember)
ERRORS_KEPT = 4  # a key's last confirmations whose prediction errors bound its next (WorkerCalibration.prediction_error)


@dataclass
class WorkerCalibration:
    """What calibration keeps for the life of one worker (one engine): its cost profile, the shard
    keys it has confirmed a decision for, and how far its predictions were from confirmations."""

    profile: CostProfile = field(default_factory=CostProfile)
    confirmed_keys: set = field(default_factory=set)
    # Per shard key: |predicted / measured speedup - 1| of its last ERRORS_KEPT confirmations.
    errors: dict = field(default_factory=dict)
    recent: list = field(default_factory=list)  # the worker's last ERRORS_KEPT errors, any key's
    # Per shard key: the setting its last shard on this worker ended under (calibrate.inflight
    # decodes the key's next sample under it: greedy speculation commits plain decoding's tokens).
    settled: dict = field(default_factory=dict)
    # The last sample decoded plainly: its anchor prices plain decoding for a sample decoded under
    # an arm (an anchor taken from an arm's wide steps carries the profile's error on their width
    # into plain decoding's price, and with it into the confirmation's measured speedup).
    anchor: Anchor | None = None
    # Per shard key: its last shard's last finished rows on this worker and their counterfactual
    # (calibrate.inflight predicts the key's next sample beside them).
    history: dict = field(default_factory=dict)
    decoded_s: float = 0.0  # decode seconds of the shards this worker ran (calibrate.inflight adds each)
    retimed_s: float = 0.0  # seconds spent re-timing width curves (profiling.retime_curve) ...
    retime_s: dict = field(default_factory=dict)  # ... and per batch size, the last re-time's
    checks: int = 0  # drift checks in flight on this worker (calibrate.inflight: `checked`) ...
    checks_s: float = 0.0  # ... and the seconds they took

    def checked(self, seconds: float) -> None:
        self.checks, self.checks_s = self.checks + 1, self.checks_s + seconds

    def check_s(self) -> float | None:
        """What a drift check costs on this worker, the mean of its checks; None before the first."""
        return self.checks_s / self.checks if self.checks else None

    def retime_budget(self) -> float:
        """Seconds a width curve's re-time may take now: profiling.PROFILE_SHARE of the decode time
        this worker's shards ran, less what re-timing took so far."""
        return PROFILE_SHARE * self.decoded_s - self.retimed_s

    def retime(self, engine, shape: tuple, temperature: float, shard_s: float) -> tuple[float, int]:
        """profiling.retime_curve on this worker's profile for a shard of `shape`, within the
        worker's budget and PROFILE_SHARE of the shard's own plain decode seconds (`shard_s`), its
        cost expected to be the last re-time's at that batch size; what it took is kept."""
        batch = shape[0]
        spent, points = retime_curve(engine, self.profile, shape, temperature,
                                     min(self.retime_budget(), PROFILE_SHARE * shard_s), self.retime_s.get(batch))
        if points:
            self.retimed_s += spent
            self.retime_s[batch] = spent
        return spent, points

    def remember(self, key: str, history: KeyHistory) -> None:
        """Keep `history` as `key`'s, the HISTORY_KEYS keys seen last kept (a job keyed by
        thousands of values holds no more than that many windows of rows)."""
        _latest(self.history, key, history)

    def record_error(self, key: str | None, error: float) -> None:
        """A confirmation of `key` measured its prediction `error` off."""
        _latest(self.errors, key, [*self.errors.get(key, ())[-(ERRORS_KEPT - 1):], error])
        self.recent = [*self.recent[-(ERRORS_KEPT - 1):], error]

    def prediction_error(self, key: str | None, default: float) -> float:
        """The error a prediction for `key` is allowed: the largest of its own last ERRORS_KEPT
        confirmations' on this worker and of the worker's last ERRORS_KEPT, any key's (none yet:
        `default`). Two sources, both measured recently: how far a key's sample stands from its
        shard (its own), and how far the machine has drifted from the moment the profile was
        timed (anyone's: on this CPU the cost model's mean error moved from -25% to +10% between
        runs). The largest error the worker had ever measured, used before, kept one key's noisy
        confirmation (41-71% at batch 1) making every later shard confirm for the life of the
        worker; the key's own alone (tried, stop 33) let a batch-1 run whose cost model was 30%
        pessimistic skip confirming extract and prose, predicted at 0.93-0.94x plain where an arm
        measured 1.04-1.08x."""
        mine = [*self.errors.get(key, ()), *self.recent]
        return max(mine) if mine else default


def _latest(kept: dict, key, value) -> None:
    """`kept[key] = value`, the HISTORY_KEYS keys set last kept (dicts keep insertion order)."""
    kept.pop(key, None)
    kept[key] = value
    while len(kept) > HISTORY_KEYS:
        kept.pop(next(iter(kept)))
