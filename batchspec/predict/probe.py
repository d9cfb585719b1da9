"""Goodput at other draft lengths from one measured probe: the i.i.d. model (Leviathan et al.) and
a per-position (bursty) one, for engines whose arms must be measured by running (TensorRT-LLM's
Eagle3 and MTP; batchspec.calibrate.measured uses them to pick the draft length to confirm).

    expected_tokens_per_step(a, k)   Leviathan et al.: tokens per target step at i.i.d. acceptance a
    acceptance_from_mean_len(m, k)   the a that gives mean accepted length m at draft length k
    tokens_per_step(probe, k)        per-position (bursty) model from a probe at another length
    predict_tokens_per_s(probe, k, baseline)   goodput at k from the probe's and baseline's costs
"""

from __future__ import annotations

from batchspec.stats import ArmResult


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
