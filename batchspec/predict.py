"""Acceptance and cost models: what an arm would deliver, without running it.

Three parts, no clock in any (the engine measures; this module replays and prices):

1. Counterfactual acceptance (the exact model). A row decoded under "none" gives its prompt ids
   and output ids. Under greedy decoding every arm commits exactly those output tokens (the engine
   is lossless); only how many tokens each target step commits differs. So the accepted length of
   every step an arm would have taken follows from the plain row, for every draft length at once:
   - n-gram lookup: at output position t the drafter sees prompt + output[:t] and proposes what
     followed the latest earlier match (`drafters.ngram_lookup`, the engine's own function). Its
     proposal at draft length k is the first k tokens of its proposal at any longer length, so
     one lookup per position serves every k.
   - draft model: the draft's greedy proposal j at a step starting at t only matters if proposals
     0..j-1 matched output[t..t+j-1], in which case the draft saw exactly prompt + output[:t+j].
     So one teacher-forced forward of the draft over prompt + output gives the proposal g[s] it
     would make at every position s, and a step at t accepts the stretch s = t, t+1, ... with
     g[s] == output[s].
   A step at t with budget b = min(k, max_tokens - t - 1) (the engine's cap) accepts
   n = min(run[t], b) drafts (fewer if the row ends inside them) and the next step starts at
   t + n + 1. Greedy and float32: exact (tests/test_predict.py checks step-by-step
   equality with the engine running the arm). Sampling (temperature > 0) has no single
   counterfactual: along the sampled path position s passes with sum_v min(p_s(v), q_s(v)) (p the
   target's, q the draft's distribution; q one-hot on the proposal for n-gram lookup), and a step's
   expected accepted length is sum_j prod_{i<=j} a_i: an estimate (`Acceptance.exact` False),
   because after a rejection the real run leaves the sampled path.

2. The cost profile of a worker (`CostProfile`): seconds of one target forward at a batch size,
   context length and tokens per row (1 plain, 1 + k to verify k drafts), of one draft step, and of
   a draft's prefill, measured once per worker by the engine over the grid `profile_grid` lays out
   and again only when a shard leaves what it covers. A step costs cost_b(tokens) x a context
   factor: cost_b piecewise linear in tokens per row at the profile's middle context for each
   measured batch size (linear in rows between them), the factor the width-1 cost at the real
   context over that at the middle one. `predict_decode_s` replays a sample's schedule as the
   engine runs it (continuous batching, every step as wide as its widest row) with each row's
   counterfactual steps and prices every step. Plain decoding is priced by the same replay, so a
   predicted speedup is a ratio of two predictions of one model.

3. The i.i.d. and per-position models from a measured probe (Leviathan et al.), for engines whose
   arms must be measured by running (TensorRT-LLM's Eagle3 and MTP):

    expected_tokens_per_step(a, k)   Leviathan et al.: tokens per target step at i.i.d. acceptance a
    acceptance_from_mean_len(m, k)   the a that gives mean accepted length m at draft length k
    tokens_per_step(probe, k)        per-position (bursty) model from a probe at another length
    predict_tokens_per_s(probe, k, baseline)   goodput at k from the probe's and baseline's costs
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from batchspec.engine.base import StepCost, acceptance_rate, mean_accepted_len
from batchspec.engine.sampling import probs_from_logits
from batchspec.engine.torch.drafters import ngram_lookup
from batchspec.stats import ArmResult

# -- 1. counterfactual acceptance ------------------------------------------------------------------


@dataclass(frozen=True)
class PlainRow:
    """One row as plain decoding produced it."""

    prompt_ids: list[int]
    output_ids: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Acceptance:
    """Counterfactual steps of one arm (method, draft length) on a list of rows.

    `steps[r]` holds, for each target step row r would have taken, the drafts accepted (expected,
    a float, when `exact` is False); `proposed[r]` the drafts proposed at each step."""

    method: str
    draft_len: int
    steps: list[list[float]] = field(default_factory=list)
    proposed: list[list[int]] = field(default_factory=list)
    exact: bool = True

    def extend(self, other: "Acceptance") -> "Acceptance":
        """These rows followed by `other`'s (the same arm); returns self."""
        self.steps += other.steps
        self.proposed += other.proposed
        self.exact = self.exact and other.exact
        return self

    @property
    def target_steps(self) -> float:
        return float(sum(len(s) for s in self.steps))

    @property
    def accepted_tokens(self) -> float:
        return float(sum(sum(s) for s in self.steps))

    @property
    def draft_tokens(self) -> int:
        return sum(sum(p) for p in self.proposed)

    @property
    def acceptance_rate(self) -> float | None:
        return acceptance_rate(self.accepted_tokens, self.draft_tokens)

    @property
    def mean_accepted_len(self) -> float | None:
        return mean_accepted_len(self.accepted_tokens, self.target_steps)


# -- runs: how far each position's proposal agrees with the plain output --------------------------


def ngram_runs(row: PlainRow, max_ngram: int, k_max: int) -> tuple[list[int], list[int]]:
    """(run, offered) per output position t >= 1: how many leading tokens of the n-gram proposal
    made at t equal output[t:], and how many tokens it offered (the lookup may find fewer)."""
    tokens = np.asarray(list(row.prompt_ids) + list(row.output_ids))
    base = len(row.prompt_ids)
    out = row.output_ids
    runs, offered = [0], [0]
    for t in range(1, len(out)):
        proposal = ngram_lookup(tokens[: base + t], max_ngram, k_max)
        runs.append(_agree(proposal, out[t:]))
        offered.append(len(proposal))
    return runs, offered


def greedy_runs(proposals: Sequence[int], output: Sequence[int]) -> list[int]:
    """run[t] = length of the stretch s = t, t+1, ... where proposals[s] == output[s]."""
    runs = [0] * (len(output) + 1)
    for s in range(len(output) - 1, -1, -1):
        runs[s] = runs[s + 1] + 1 if proposals[s] == output[s] else 0
    return runs[: len(output)]


def _agree(proposal: Sequence[int], truth: Sequence[int]) -> int:
    n = 0
    for a, b in zip(proposal, truth):
        if a != b:
            break
        n += 1
    return n


# -- steps: walk a row with one draft length -----------------------------------------------------


def walk(row: PlainRow, runs: Sequence[int], offered: Sequence[int] | None, k: int) -> tuple[list[int], list[int]]:
    """The accepted and proposed counts of every step row would take with draft length k.

    `offered[t]` caps what a drafter proposes at t (None: a draft model always proposes the budget)."""
    accepted, proposed = [], []
    out_len = len(row.output_ids)
    t = 1  # prefill commits the first token
    while t < out_len:
        budget = max(0, min(k, row.max_tokens - t - 1))
        size = budget if offered is None else min(budget, offered[t])
        n = min(runs[t], size, out_len - t)
        accepted.append(n)
        proposed.append(size)
        t += n + 1
    return accepted, proposed


def expected_walk(row: PlainRow, accept: np.ndarray, offered: Sequence[int] | None, k: int) -> tuple[list[float], list[int]]:
    """Sampling estimate: accept[t, j] is the probability that draft j of a step at t passes given
    drafts before it passed; a step's expected accepted length is sum_j prod_{i<=j} accept[t, i].
    The walk advances by the expected committed tokens (positions rounded down)."""
    expected, proposed = [], []
    out_len = len(row.output_ids)
    t = 1.0
    while t < out_len:
        i = int(t)
        budget = max(0, min(k, row.max_tokens - i - 1))
        size = budget if offered is None else min(budget, offered[i])
        n = float(np.cumprod(accept[i, :size]).sum()) if size else 0.0
        n = min(n, out_len - i)
        expected.append(n)
        proposed.append(size)
        t += n + 1.0
    return expected, proposed


def _probs(logits: torch.Tensor, row: PlainRow) -> torch.Tensor:
    n = logits.shape[0]
    return probs_from_logits(logits, torch.full((n,), row.temperature), torch.full((n,), row.top_p))


# -- the entry point -----------------------------------------------------------------------------


def ngram_acceptance(rows: Sequence[PlainRow], draft_lens: Sequence[int], max_ngram: int,
                     target_logits: Sequence[torch.Tensor] | None = None) -> dict[int, Acceptance]:
    """Counterfactual steps of n-gram lookup at every draft length in `draft_lens`.

    Greedy rows are exact. Sampled rows need `target_logits` (the engine's teacher-forced logits
    of the target) and give an estimate: draft j of the proposal at t passes with p_{t+j}(draft)."""
    k_max = max(draft_lens)
    out = {k: Acceptance("ngram", k) for k in draft_lens}
    for r, row in enumerate(rows):
        runs, offered = ngram_runs(row, max_ngram, k_max)
        if row.greedy:
            for k in draft_lens:
                acc, prop = walk(row, runs, offered, k)
                out[k].steps.append(acc)
                out[k].proposed.append(prop)
            continue
        assert target_logits is not None, "sampled rows need the target's teacher-forced logits"
        p = _probs(target_logits[r], row)
        accept = _ngram_accept_probs(row, p, max_ngram, k_max)
        for k in draft_lens:
            acc, prop = expected_walk(row, accept, offered, k)
            out[k].steps.append(acc)
            out[k].proposed.append(prop)
            out[k].exact = False
    return out


def _ngram_accept_probs(row: PlainRow, p: torch.Tensor, max_ngram: int, k_max: int) -> np.ndarray:
    """accept[t, j] = p at position t+j of the j-th token n-gram lookup proposes at t (path context)."""
    tokens = np.asarray(list(row.prompt_ids) + list(row.output_ids))
    base, n = len(row.prompt_ids), len(row.output_ids)
    accept = np.zeros((max(n, 1), k_max))
    for t in range(1, n):
        for j, d in enumerate(ngram_lookup(tokens[: base + t], max_ngram, k_max)):
            if t + j < n:
                accept[t, j] = float(p[t + j, d])
    return accept


def draft_acceptance(rows: Sequence[PlainRow], draft_lens: Sequence[int], draft_logits: Sequence[torch.Tensor],
                     target_logits: Sequence[torch.Tensor] | None = None) -> dict[int, Acceptance]:
    """Counterfactual steps of a draft model at every draft length, from its teacher-forced logits.

    Greedy rows are exact: the proposal at s is the draft's argmax there. Sampled rows need the
    target's logits too: position s passes with sum_v min(p_s(v), q_s(v)) (an estimate)."""
    out = {k: Acceptance("draft_target", k) for k in draft_lens}
    k_max = max(draft_lens)
    for r, row in enumerate(rows):
        if row.greedy:
            runs = greedy_runs(draft_logits[r].argmax(-1).tolist(), row.output_ids)
            for k in draft_lens:
                acc, prop = walk(row, runs, None, k)
                out[k].steps.append(acc)
                out[k].proposed.append(prop)
            continue
        assert target_logits is not None, "sampled rows need the target's teacher-forced logits"
        overlap = torch.minimum(_probs(target_logits[r], row), _probs(draft_logits[r], row)).sum(-1).numpy()
        n = len(row.output_ids)
        accept = np.zeros((max(n, 1), k_max))
        for j in range(k_max):  # draft j of a step at t sits at position t + j
            accept[: max(0, n - j), j] = overlap[j:n]
        for k in draft_lens:
            acc, prop = expected_walk(row, accept, None, k)
            out[k].steps.append(acc)
            out[k].proposed.append(prop)
            out[k].exact = False
    return out


# -- 2. the cost profile and the replay -----------------------------------------------------------


def profile_grid(batch_size: int, lo: int, hi: int, max_width: int,
                 draft_models: Sequence[str] = ()) -> tuple[list[tuple[int, int, int]], list[tuple[str, int, int]]]:
    """The (batch, context, tokens) target points and (draft, batch, context) draft points to
    measure for a shard whose rows hold `lo`..`hi` tokens of context and verify up to
    `max_width` tokens per row: widths 1, 2, 3, 5, 9, ... up to max_width at the middle context
    and the production batch; width 1 at both ends of the context range; and batch 1 at the
    narrowest and widest, for the rows that drain a batch at the end."""
    mid = (lo + hi) // 2
    widths = sorted({w for w in (1, 2, 3, 5, 9, 17) if w < max_width} | {max_width})
    target = {(batch_size, mid, w) for w in widths} | {(batch_size, c, 1) for c in (lo, hi)}
    if batch_size > 1:
        target |= {(1, mid, 1), (1, mid, max_width)}
    drafts = {(d, b, c) for d in draft_models for b, c in ((batch_size, mid), (batch_size, hi), (1, mid))}
    return sorted(target), sorted(drafts)


@dataclass
class CostProfile:
    """Measured step costs, as the engine reported them."""

    points: list[StepCost] = field(default_factory=list)
    measured_s: float = 0.0  # wall seconds spent measuring, summed over refreshes

    def covers(self, batch_size: int, lo: int, hi: int, max_width: int, draft_models: Sequence[str] = (),
               check_context: bool = True) -> bool:
        """Does the profile hold this batch size, widths up to `max_width`, the draft models and
        (with `check_context`) the context range lo..hi?"""
        mine = [p for p in self.points if p.kind == "target" and p.batch == batch_size]
        if not mine or max(p.tokens for p in mine) < max_width:
            return False
        contexts = [p.context for p in mine]
        if check_context and (hi > max(contexts) * 1.25 or lo < min(contexts) / 2):  # a little past the ends is fine
            return False
        return all(any(p.kind == "draft" and p.model == d and p.batch == batch_size for p in self.points) for d in draft_models)

    def merge(self, points: Sequence[StepCost], seconds: float) -> None:
        new = {p.key for p in points}
        self.points = [p for p in self.points if p.key not in new] + list(points)
        self.measured_s += seconds

    def target_s(self, batch: int, context: int, tokens: int) -> float:
        return self._cost("target", None, batch, context, tokens)

    def draft_s(self, model: str, batch: int, context: int) -> float:
        return self._cost("draft", model, batch, context, 1)

    def draft_prefill_s(self, model: str, tokens: int) -> float:
        per = [p.seconds / p.tokens for p in self.points if p.kind == "draft_prefill" and p.model == model and p.tokens]
        return tokens * sum(per) / len(per) if per else 0.0

    def _cost(self, kind: str, model: str | None, batch: int, context: int, tokens: int) -> float:
        pts = [p for p in self.points if p.kind == kind and (model is None or p.model == model)]
        assert pts, f"no {kind} cost measured"
        batches = sorted({p.batch for p in pts})
        return _lerp(batches, [self._at_batch([p for p in pts if p.batch == b], context, tokens) for b in batches], batch)

    @staticmethod
    def _at_batch(pts: Sequence[StepCost], context: int, tokens: int) -> float:
        by_context: dict[int, list[StepCost]] = {}
        for p in pts:
            by_context.setdefault(p.context, []).append(p)
        home = max(by_context, key=lambda c: (len(by_context[c]), -c))  # the context with most widths
        here = sorted((p.tokens, p.seconds) for p in by_context[home])
        cost = _lerp([t for t, _ in here], _rising([s for _, s in here]), tokens)
        narrow = sorted((c, min(ps, key=lambda p: p.tokens).seconds) for c, ps in by_context.items())
        at = dict(zip([c for c, _ in narrow], _rising([s for _, s in narrow])))
        factor = _lerp(list(at), list(at.values()), context) / at[home] if at[home] > 0 else 1.0
        return cost * factor

    def to_struct(self) -> list[dict]:
        return [p.to_struct() for p in self.points]


def _rising(ys: Sequence[float]) -> list[float]:
    """Costs never fall with more tokens or more context: a point below an earlier one was timed
    in a quiet moment of a shared machine, so it takes the earlier value (a running maximum)."""
    out: list[float] = []
    for y in ys:
        out.append(max(y, out[-1]) if out else y)
    return out


def _lerp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise linear through (xs, ys), extended linearly past either end (flat with one point)."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass
class RowPlan:
    """One row as the engine would run it under an arm."""

    prompt_len: int
    decode_tokens: int  # output tokens after the first (which prefill commits)
    steps: Sequence[float]  # drafts accepted per step (0 for plain decoding)
    proposed: Sequence[int]  # drafts proposed per step


@dataclass
class Predicted:
    """An arm's decode time on a sample, priced from the profile."""

    decode_s: float
    verify_s: float
    draft_s: float
    other_s: float
    target_steps: int  # row-steps, as the engine counts them
    decode_tokens: float

    @property
    def tokens_per_s(self) -> float | None:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else None


def predict_decode_s(rows: Sequence[RowPlan], batch_size: int, profile: CostProfile, method: str = "none",
                     draft_model: str | None = None, other_per_row_step: float = 0.0,
                     lookup_per_row_step: float = 0.0) -> Predicted:
    """Replay continuous batching over `rows` and price every step.

    `other_per_row_step` is the engine's bookkeeping per row and step beyond the forward and the
    accept rule (from the measured plain run); `lookup_per_row_step` an n-gram lookup's cost."""
    queue = list(range(len(rows)))
    active: list[list[int | float]] = []  # [row index, next step, context]
    verify = draft = other = 0.0
    steps = 0
    while queue or active:
        while queue and len(active) < batch_size:
            i = queue.pop(0)
            if method == "draft_target":
                draft += profile.draft_prefill_s(draft_model, rows[i].prompt_len)
            if rows[i].steps:
                active.append([i, 0, rows[i].prompt_len + 1])
        if not active:
            continue
        width = 1 + max(rows[i].proposed[s] for i, s, _ in active)
        context = int(max(c for _, _, c in active))
        b = len(active)
        verify += profile.target_s(b, context, width)
        if method == "draft_target" and width > 1:
            draft += (width - 1) * profile.draft_s(draft_model, b, context)
        elif method == "ngram":
            draft += lookup_per_row_step * b
        other += other_per_row_step * b
        steps += b
        for slot in active:
            n = rows[slot[0]].steps[slot[1]]
            slot[1] += 1
            slot[2] += n + 1
        active = [slot for slot in active if slot[1] < len(rows[slot[0]].steps)]
    tokens = float(sum(r.decode_tokens for r in rows))
    return Predicted(verify + draft + other, verify, draft, other, steps, tokens)


# -- 3. models from a measured probe --------------------------------------------------------------



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


def tokens_per_step(probe: ArmResult, k: int) -> float | None:
    """Committed tokens per target step at draft length k, from an arm measured at another length.

    With per-position counts (the torch engine reports them): the first draft is accepted on a
    fraction a1 of all steps (steps without a draft count as misses), and an accepted draft is
    followed by another accepted one at the continuation rate c (pooled over the positions the
    probe measured); so 1 + a1 (1 - c^k) / (1 - c) tokens per step, which at the probe's own length
    is what was measured. On copied text c is far above a1 (acceptance comes in bursts), which
    Leviathan's i.i.d. model under-predicts for long drafts. Without the counts (or a probe of
    length 1), the i.i.d. model: one per-token acceptance a fitted to the mean accepted length."""
    if not probe.target_steps or not probe.mean_accepted_len:
        return None
    k0 = probe.draft_len
    if probe.accepted_at and k0 >= 2:
        acc = (list(probe.accepted_at) + [0] * k0)[:k0]  # positions never accepted count zero
        a1 = acc[0] / probe.target_steps
        c = sum(acc[1:]) / sum(acc[:-1])
        return 1.0 + a1 * (k if c >= 1.0 else (1 - c**k) / (1 - c))
    return expected_tokens_per_step(acceptance_from_mean_len(probe.mean_accepted_len, probe.draft_len), k)


def predict_tokens_per_s(probe: ArmResult, k: int, baseline: ArmResult) -> float | None:
    """Goodput at draft length k, from an arm measured at probe.draft_len and the baseline.

    Per step: verify time is interpolated linearly in k between the baseline's (k = 0) and the
    probe's; draft time scales with k for a draft model (one forward per draft) and stays flat for
    n-gram lookup; coordination time per step is the probe's."""
    if not (probe.target_steps and baseline.target_steps and probe.mean_accepted_len):
        return None
    k0 = probe.draft_len
    v0 = baseline.verify_s / baseline.target_steps
    vk = probe.verify_s / probe.target_steps
    verify = v0 + (vk - v0) * k / k0
    draft = probe.draft_s / probe.target_steps * (k / k0 if probe.method == "draft_target" else 1.0)
    other = probe.other_s / probe.target_steps
    per_step = verify + draft + other
    # rows decoding at once per step: the probe's committed tokens over its steps and mean length
    rows_per_step = probe.decode_tokens / (probe.target_steps * probe.mean_accepted_len)
    return rows_per_step * tokens_per_step(probe, k) / per_step if per_step > 0 else None
