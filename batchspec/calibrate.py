"""Per-shard calibration: measure on the shard's own prompts whether speculation pays, then choose.

The rule (DESIGN.md, from the seed documents): speculate only when

    (draft time + verify time + coordination time) / committed tokens  <  baseline time per token

by a margin (default 5%). Goodput is committed output tokens per second of decode time, measured
at the shard's production batch size, so batching effects are in the measurement, not guessed.

How it stays cheap and sound:
1. A sample of the shard's rows (evenly spaced, the same for every arm), generation capped at a
   few tokens per row.
2. Round one measures "none" and one draft length per method (the middle candidate), interleaved
   in rounds with a rotating order, so machine noise hits every arm alike.
3. From each measured arm, fit the per-token acceptance a (mean accepted length
   (1 - a^(k+1)) / (1 - a), Leviathan et al.) and the per-step draft and verify costs, predict
   goodput at every candidate draft length, then measure the predicted best to confirm.
4. Choose the best *measured* arm; "none" unless it wins by the margin. Every arm, measured or
   predicted, is recorded.
5. A budget caps calibration at a fraction of the shard's expected time; when it runs out the
   remaining arms are skipped and the decision says it was capped.

Decisions are plain data (`Decision`), reused for small shards of the same key by `generate.py`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

from batchspec.engine.base import NO_SPEC, Completion, Engine, GenerateResult, Request, SpecConfig


@dataclass(frozen=True)
class CalibrationSettings:
    sample_size: int = 0  # rows measured per arm; 0 = twice the batch size, within [8, 64]
    max_tokens: int = 32  # generation cap per row while calibrating
    rounds: int = 2  # interleaving rounds; the sample is split across them
    margin: float = 0.05  # speculation must beat "none" by this fraction
    max_fraction: float = 0.10  # calibration budget, as a fraction of the shard's expected time
    min_rows: int = 16  # smaller shards reuse the last decision of their shard key
    confirm: bool = True  # measure the predicted best draft length
    drift_ratio: float = 0.5  # fall back to "none" when acceptance drops below this x calibrated
    drift_chunk: int = 0  # rows per drift check; 0 = four times the batch size

    def sample_rows(self, batch_size: int) -> int:
        return self.sample_size or min(64, max(8, 2 * batch_size))


@dataclass
class ArmResult:
    """One calibration arm: its settings and what was measured (or predicted) for it."""

    method: str
    draft_len: int
    tokens_per_s: float | None = None  # measured goodput (committed tokens / decode s)
    predicted_tokens_per_s: float | None = None
    acceptance_rate: float | None = None
    mean_accepted_len: float | None = None
    output_tokens: int = 0
    decode_tokens: int = 0  # committed by decode steps (the first token of a row comes from prefill)
    rows: int = 0
    target_steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    prefill_s: float = 0.0
    measured: bool = False
    error: str | None = None

    @property
    def label(self) -> str:
        return "none" if self.method == "none" else f"{self.method}:k={self.draft_len}"

    def to_struct(self) -> dict:
        return {"label": self.label, **asdict(self)}

    def add(self, result: GenerateResult) -> None:
        t = result.timing
        self.output_tokens += result.output_tokens
        self.decode_tokens += result.decode_tokens
        self.rows += sum(c.finish_reason != "error" for c in result.completions)
        self.draft_tokens += result.draft_tokens
        self.accepted_tokens += result.accepted_tokens
        self.target_steps += result.target_steps
        self.draft_s += t.draft_s
        self.verify_s += t.verify_s
        self.other_s += t.other_s
        self.prefill_s += t.prefill_s
        decode = self.draft_s + self.verify_s + self.other_s
        self.tokens_per_s = self.decode_tokens / decode if decode > 0 and self.decode_tokens else None
        self.acceptance_rate = self.accepted_tokens / self.draft_tokens if self.draft_tokens else None
        self.mean_accepted_len = 1 + self.accepted_tokens / self.target_steps if self.target_steps else None
        self.measured = True


@dataclass
class Decision:
    """What a shard runs with, and the evidence."""

    chosen: SpecConfig
    arms: list[ArmResult] = field(default_factory=list)
    baseline_tokens_per_s: float | None = None
    calibration_s: float = 0.0
    capped: bool = False
    source: str = "calibrated"  # calibrated | reused | fixed | too_small
    reason: str = ""
    shard_id: str | None = None  # the shard that was calibrated
    # Sample rows the chosen arm generated to their end during calibration, by request id: the
    # shard keeps them instead of generating them again (calibration work is not thrown away).
    finished: dict[str, Completion] = field(default_factory=dict, repr=False)

    @property
    def chosen_arm(self) -> ArmResult | None:
        return next((a for a in self.arms if a.measured and a.label == self.chosen.label), None)

    def reused_by(self, shard_id: str) -> "Decision":
        return replace(self, source="reused", calibration_s=0.0, capped=False, finished={},
                       reason=f"shard too small to calibrate; reused the decision of {self.shard_id}")


def fixed_decision(spec: SpecConfig, reason: str) -> Decision:
    return Decision(spec, source="fixed", reason=reason)


def calibrate(engine: Engine, requests: Sequence[Request], arms: Sequence[SpecConfig], batch_size: int,
              settings: CalibrationSettings = CalibrationSettings(), shard_id: str | None = None,
              expected_rows: int | None = None) -> Decision:
    """Measure "none" and the candidate `arms` on a sample of `requests`; return the decision.

    `expected_rows` (default: all requests) sizes the budget: calibration stops measuring new arms
    once it has spent `max_fraction` of the predicted time to generate the whole shard."""
    start = time.perf_counter()
    sample = pick_sample(requests, settings.sample_rows(batch_size), settings.max_tokens)
    rounds = _split(sample, settings.rounds)
    by_method: dict[str, list[SpecConfig]] = {}
    for arm in arms:
        if arm.method != "none":
            by_method.setdefault(arm.method, []).append(arm)
    results: dict[str, ArmResult] = {}
    finished: dict[str, dict[str, Completion]] = {}  # arm label -> request id -> completed row
    full_budget = {r.id: r.params.max_tokens for r in requests}
    capped = False

    def measure(specs: list[SpecConfig]) -> None:
        """Run `specs` on every round of the sample, rotating the order each round. A round runs
        whole or not at all, so arms compared with each other saw the same rows."""
        nonlocal capped
        for r, chunk in enumerate(rounds):
            if "none" in results and time.perf_counter() - start > _budget(results["none"], sample, requests, expected_rows, settings):
                capped = True
                return
            for spec in specs[r % len(specs):] + specs[: r % len(specs)]:
                arm = results.setdefault(spec.label, ArmResult(spec.method, spec.draft_len))
                if arm.error:
                    continue
                try:
                    result = engine.generate(chunk, spec, batch_size)
                    arm.add(result)
                    finished.setdefault(spec.label, {}).update(
                        (c.id, c) for c in result.completions if _complete(c, full_budget[c.id]))
                except Exception as exc:  # an arm that fails is skipped and recorded
                    arm.error = " ".join(str(exc).split())[:300] or type(exc).__name__

    measure([NO_SPEC] + [_middle(c) for c in by_method.values()])

    for method, cands in by_method.items():
        probe = results.get(_middle(cands).label)
        if probe is None or not probe.measured or probe.error:
            continue
        best = None
        for cand in cands:
            arm = results.setdefault(cand.label, ArmResult(cand.method, cand.draft_len))
            arm.predicted_tokens_per_s = predict_tokens_per_s(probe, cand.draft_len, results["none"])
            if best is None or (arm.predicted_tokens_per_s or 0) > (results[best.label].predicted_tokens_per_s or 0):
                best = cand
        if settings.confirm and best is not None and not results[best.label].measured:
            measure([best])

    chosen, reason = choose(list(results.values()), arms, settings.margin)
    if capped:
        reason += "; calibration budget reached, some arms skipped"
    order = {label: i for i, label in enumerate(["none"] + [a.label for a in arms])}
    return Decision(
        chosen=chosen,
        arms=sorted(results.values(), key=lambda a: order.get(a.label, len(order))),
        baseline_tokens_per_s=results["none"].tokens_per_s,
        calibration_s=time.perf_counter() - start,
        capped=capped,
        reason=reason,
        shard_id=shard_id,
        finished=finished.get(chosen.label, {}),
    )


def _complete(c: Completion, max_tokens: int) -> bool:
    """Did calibration generate this row to the end it would have had in production?"""
    return c.finish_reason == "stop" or (c.finish_reason == "length" and c.output_tokens >= max_tokens)


def choose(results: Sequence[ArmResult], arms: Sequence[SpecConfig], margin: float) -> tuple[SpecConfig, str]:
    """The decision rule over measured arms: the best measured goodput wins, but speculation only
    when it beats "none" by more than `margin`. Arms with errors or no measurement never win;
    among equal goodputs the shorter draft wins (less draft work, less memory)."""
    baseline = next((a for a in results if a.method == "none" and a.measured and a.tokens_per_s), None)
    if baseline is None:
        return NO_SPEC, "plain decoding could not be measured"
    usable = [a for a in results if a.measured and not a.error and a.tokens_per_s and a.method != "none"]
    if not usable:
        return NO_SPEC, "no speculative arm could be measured"
    best = max(usable, key=lambda a: (a.tokens_per_s, -a.draft_len))
    ratio = best.tokens_per_s / baseline.tokens_per_s
    if ratio > 1 + margin:
        spec = next(s for s in arms if s.label == best.label)
        return spec, f"{best.label} measured {ratio:.2f}x plain decoding"
    return NO_SPEC, f"best arm {best.label} measured {ratio:.2f}x plain decoding, not above the {margin:.0%} margin"


def pick_sample(requests: Sequence[Request], n: int, max_tokens: int) -> list[Request]:
    """Evenly spaced rows (deterministic), with generation capped at `max_tokens`."""
    if len(requests) <= n:
        picked = list(requests)
    else:
        step = len(requests) / n
        picked = [requests[int(i * step)] for i in range(n)]
    return [replace(r, params=replace(r.params, max_tokens=min(r.params.max_tokens, max_tokens))) for r in picked]


def acceptance_from_mean_len(mean_len: float, k: int) -> float:
    """Per-token acceptance a such that (1 - a^(k+1)) / (1 - a) == mean_len (bisection)."""
    mean_len = min(max(mean_len, 1.0), k + 1.0)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_tokens_per_step(mid, k) < mean_len:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def expected_tokens_per_step(a: float, k: int) -> float:
    """Leviathan et al.: committed tokens per target step with k drafts at per-token acceptance a."""
    if a >= 1.0:
        return k + 1.0
    return (1 - a ** (k + 1)) / (1 - a)


def predict_tokens_per_s(probe: ArmResult, k: int, baseline: ArmResult) -> float | None:
    """Goodput at draft length k, from an arm measured at probe.draft_len and the baseline.

    Per step: verify time is interpolated linearly in k between the baseline's (k = 0) and the
    probe's; draft time scales with k for a draft model (one forward per draft) and stays flat for
    n-gram lookup; coordination time per step is the probe's."""
    if not (probe.target_steps and baseline.target_steps and probe.mean_accepted_len):
        return None
    k0 = probe.draft_len
    a = acceptance_from_mean_len(probe.mean_accepted_len, k0)
    v0 = baseline.verify_s / baseline.target_steps
    vk = probe.verify_s / probe.target_steps
    verify = v0 + (vk - v0) * k / k0
    draft = probe.draft_s / probe.target_steps * (k / k0 if probe.method == "draft_target" else 1.0)
    other = probe.other_s / probe.target_steps
    per_step = verify + draft + other
    # rows decoding at once per step: the probe's committed tokens over its steps and mean length
    rows_per_step = probe.decode_tokens / (probe.target_steps * probe.mean_accepted_len)
    return rows_per_step * expected_tokens_per_step(a, k) / per_step if per_step > 0 else None


def _budget(baseline: ArmResult, sample: Sequence[Request], shard: Sequence[Request],
            expected_rows: int | None, settings: CalibrationSettings) -> float:
    """Seconds calibration may spend: max_fraction of the shard's predicted plain-decoding time.

    A row is predicted to generate what it generated in calibration, or its own max_tokens when
    calibration's cap cut it short."""
    if not baseline.tokens_per_s or not baseline.rows:
        return float("inf")
    full = {r.id: r.params.max_tokens for r in shard}
    capped_rows = sum(full.get(r.id, 0) > r.params.max_tokens for r in sample) / max(1, len(sample))
    tokens_per_row = baseline.output_tokens / baseline.rows
    mean_cap = sum(full.values()) / max(1, len(full))
    tokens_per_row = (1 - capped_rows) * tokens_per_row + capped_rows * max(tokens_per_row, mean_cap)
    rows = expected_rows if expected_rows is not None else len(shard)
    return settings.max_fraction * rows * tokens_per_row / baseline.tokens_per_s


def _middle(cands: list[SpecConfig]) -> SpecConfig:
    ordered = sorted(cands, key=lambda s: s.draft_len)
    return ordered[(len(ordered) - 1) // 2]


def _split(items: list, parts: int) -> list[list]:
    parts = max(1, min(parts, len(items)))
    return [items[i::parts] for i in range(parts)] if items else [[]]


__all__ = [
    "ArmResult", "CalibrationSettings", "Decision", "calibrate", "choose", "fixed_decision", "pick_sample",
    "predict_tokens_per_s", "expected_tokens_per_step", "acceptance_from_mean_len",
]
