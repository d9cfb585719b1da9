"""What a worker learns over its life, one owner for all of it: the step-cost table (every step
it runs prices the next decisions) and, per shard key, the arm its last shard ended under (where
the key's next shard starts) and the tallies of its last window of rows (what the key's next
shard judges on until its own rows replace them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from batchspec.engine.base import NO_SPEC, SpecConfig
from batchspec.predict.costs import CostTable

KEYS_KEPT = 256  # shard keys whose last arm a worker keeps (the oldest forgotten first)
LAST_SHARD = "the key's last shard"  # why a shard starts under the driver's prior, unless it says otherwise
KEY_LAST = "the key's last shard on this worker"  # why a shard starts under its key's last arm here
VERIFY_TOKENS = 236  # a first engine's verify at most this many tokens a step: where a GPU forward turns compute-bound


class Start(NamedTuple):
    """Where a shard starts: the arm, why, and whether the arm is the key's own (its last shard's
    on this worker, or the driver's prior for the key) or another key's, a default included, which
    the controller's course holds as `provisional` (docs/calibration.md, concept 7)."""

    arm: SpecConfig
    why: str
    own: bool


@dataclass
class WorkerState:
    costs: CostTable = field(default_factory=CostTable)
    last: dict[str, SpecConfig] = field(default_factory=dict)
    history: dict[str, list] = field(default_factory=dict)  # key -> its last window of rows' tallies
    measure_builds: int = 0  # engine builds measurements caused (capped by max_builds_per_worker)
    profile_s: float = 0.0  # the worker's cost profiles' seconds (once per batch size): the worker's, no shard's

    def start(self, key: str | None, prior: SpecConfig | None, arms: list[SpecConfig],
              builds: bool = False, prior_why: str = LAST_SHARD, rows: int = 1) -> Start:
        """The arm a shard of `key` starts under, and why: the key's last on this worker, else the
        driver's `prior` (another worker's last shard of the key, or what a prior run predicted
        best for it: `prior_why` says which), else the arm the worker's other keys chose (`chosen`:
        the arm their last shards ended under, each weighted by the rows it judged on; where arms
        are builds, the live engine's, the arm the worker's last shard ended under), else plain
        decoding. Only an arm still among `arms`.

        Where a switch costs a build (`builds`) the driver's prior applies only to a worker with no
        engine yet (a live one is not rebuilt before the rule has priced the build) and only where
        its verify is within VERIFY_TOKENS (a prior run prices a wider draft it never ran as its
        nearest step, which past that is cheap by the verify's width), and a worker's
        first shard without one starts under the longest n-gram draft whose verify at the `rows` it
        runs at a step (the batch, or the shard's rows where fewer) is at most VERIFY_TOKENS tokens,
        else plain decoding: the worker builds one engine either way, and an n-gram engine's greedy
        tokens are plain decoding's, so its run prices plain decoding and every shorter n-gram draft
        too; but past the tokens where a forward turns compute-bound a verify costs its width, and
        at a large batch no draft repays it (where a build costs minutes, the first engine is what
        a short job runs throughout)."""
        labels = {a.label for a in arms}
        own = {a.label: a for a in arms}  # a remembered arm as this shard has it (a key's own EAGLE-3 head under one label)
        latest = self.last[next(reversed(self.last))] if self.last else None
        order = [(self.last.get(str(key)), KEY_LAST, True)]
        if not builds or (latest is None and (prior is None or rows * (prior.draft_len + 1) <= VERIFY_TOKENS)):
            order.append((prior, prior_why, True))
        if not builds:
            order.append((self.chosen(labels), "the arm the worker's other keys chose", False))
        order.append((latest, "the worker's last shard, of another key", False))
        for arm, why, key_own in order:
            if arm is not None and (arm.method == "none" or arm.label in labels):
                return Start(arm if arm.method == "none" else own[arm.label], why, key_own)
        ngram = [a for a in arms if a.method == "ngram"]
        fits = [a for a in ngram if rows * (a.draft_len + 1) <= VERIFY_TOKENS]
        if builds and fits:
            return Start(max(fits, key=lambda a: a.draft_len), "the worker's first build: the longest n-gram draft "
                         f"that verifies at most {VERIFY_TOKENS} tokens at {rows} rows", False)
        if builds and ngram:
            return Start(NO_SPEC, f"the worker's first build: every n-gram draft verifies over {VERIFY_TOKENS} tokens at {rows} rows",
                         False)
        return Start(NO_SPEC, "the worker's first shard", False)

    def chosen(self, labels: set[str]) -> SpecConfig | None:
        """The arm most of the worker's keys' rows ended under, of plain decoding and `labels`:
        each key's last shard weighted by the rows it judged on, the method first (n-gram keys
        split across draft lengths still outvote plain decoding's, where together they are more),
        then the draft length within it; the latest among equals."""
        weight: dict[str, float] = {}
        by_label: dict[str, SpecConfig] = {}
        for n, (key, arm) in enumerate(self.last.items()):  # oldest first: a later key wins a tie
            if arm.method == "none" or arm.label in labels:
                weight[arm.label] = weight.get(arm.label, 0.0) + max(1, len(self.history.get(key, ()))) + n * 1e-9
                by_label[arm.label] = arm
        if not weight:
            return None
        method: dict[str, float] = {}
        for label, w in weight.items():
            method[by_label[label].method] = method.get(by_label[label].method, 0.0) + w
        best = max(method, key=method.get)
        return by_label[max((label for label in weight if by_label[label].method == best), key=weight.get)]

    def remember(self, key: str | None, arm: SpecConfig, window: list) -> None:
        for kept, value in ((self.last, arm), (self.history, list(window))):
            kept.pop(str(key), None)
            kept[str(key)] = value
            while len(kept) > KEYS_KEPT:
                kept.pop(next(iter(kept)))
