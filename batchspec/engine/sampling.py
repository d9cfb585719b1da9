"""Sampling and the speculative accept/reject rule, as pure tensor functions.

Nothing here calls a model or draws a random number: logits and uniforms come in, tokens and
counts go out, so each rule is tested alone (tests/engine/test_sampling.py). Randomness is drawn
by the caller from per-request `torch.Generator`s and passed in.

Greedy is the temperature-0 limit of the same rule: the target distribution becomes a one-hot
on its argmax, a draft is accepted exactly when it equals that argmax, and the recovered token is
the argmax. So greedy speculative output equals greedy plain output by construction.
"""

from __future__ import annotations

import torch


def probs_from_logits(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Turn logits into the distribution a request samples from.

    logits: [N, V]; temperature, top_p: [N]. Rows with temperature 0 become a one-hot on the
    argmax (greedy). Returns float32 probabilities [N, V].
    """
    logits = logits.float()
    greedy = temperature <= 0
    probs = torch.zeros_like(logits)
    if greedy.any():
        probs[greedy] = _one_hot_argmax(logits[greedy])
    sampled = ~greedy
    if sampled.any():
        scaled = logits[sampled] / temperature[sampled, None].float()
        probs[sampled] = _top_p(torch.softmax(scaled, dim=-1), top_p[sampled].float())
    return probs


def _one_hot_argmax(logits: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(logits)
    out.scatter_(-1, argmax(logits).unsqueeze(-1), 1.0)
    return out


ARGMAX_BLOCKS = (256, 128, 64)  # `argmax`'s block widths on a CPU, the first that divides the vocabulary


def argmax(x: torch.Tensor) -> torch.Tensor:
    """`x.argmax(-1)`, index for index: the first of equal maxima, a NaN counting as the largest
    (as torch's), in any dtype. Every greedy token the engine picks goes through it: the accept
    rule's, the first after prefill, a draft model's proposals and their counterfactual.

    On a CPU torch's argmax along a row of the vocabulary runs one scalar pass, where its
    max-reduction (`amax`) is vectorized; so the row is cut into blocks of `ARGMAX_BLOCKS` width,
    the first block holding a maximum is found from the blocks' maxima, and the first maximum
    within it: the same index, several times faster (docs/engines/torch.md, "The greedy pick").
    Elsewhere (CUDA, whose argmax is a kernel of its own), or where no block width divides the
    vocabulary, torch's own."""
    v = x.shape[-1] if x.dim() else 0
    block = next((b for b in ARGMAX_BLOCKS if v % b == 0 and v >= 4 * b), None)
    if block is None or x.device.type != "cpu":
        return x.argmax(-1)
    blocks = x.reshape(-1, v // block, block)
    first = blocks.amax(-1).argmax(-1)  # a block holding a maximum has it for its own: the first such block
    inner = blocks[torch.arange(blocks.shape[0], device=x.device), first].argmax(-1)
    return (first * block + inner).view(x.shape[:-1])


def _top_p(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p, renormalised."""
    if bool((top_p >= 1.0).all()):
        return probs
    sorted_p, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_p.cumsum(-1) - sorted_p  # mass of strictly more likely tokens
    sorted_p = sorted_p.masked_fill(mass_before >= top_p[:, None], 0.0)  # the top token always stays
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return kept / kept.sum(-1, keepdim=True)


def sample_from(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling. probs: [N, V] (need not be normalised); uniforms: [N] in [0, 1).

    A one-hot row returns its hot index whatever the uniform, which keeps greedy exact.
    """
    cdf = probs.double().cumsum(-1)  # float64: float32 sums over 150k-token vocabularies drift
    target = (uniforms.to(cdf) * cdf[:, -1])[:, None]
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def accept_reject(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    num_drafts: torch.Tensor,
    target_probs: torch.Tensor,
    u_accept: torch.Tensor,
    u_sample: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Leviathan–Kalman–Matias rule for a batch of rows, each with its own number of drafts.

    draft_tokens: [B, K] proposed tokens (positions >= num_drafts are padding)
    draft_probs:  [B, K, V] the drafter's distribution at each position, or None for a
                  deterministic drafter (n-gram lookup), which is a one-hot on the draft token
    num_drafts:   [B] how many drafts each row really proposed, 0..K
    target_probs: [B, K+1, V] the target's distribution after each prefix (last = bonus position)
    u_accept:     [B, K] uniforms for the accept tests
    u_sample:     [B] uniforms for the recovered or bonus token

    Returns (num_accepted [B], next_token [B]). A row commits its first num_accepted drafts and
    then next_token: sampled from the residual max(0, p - q) at the first rejection, or from p
    at the bonus position when every draft passed. Output tokens then follow p exactly.
    """
    B, K = draft_tokens.shape
    rows = torch.arange(B, device=draft_tokens.device)
    if K > 0:
        p_draft = target_probs[:, :K].gather(-1, draft_tokens[..., None]).squeeze(-1)  # [B, K]
        q_draft = (
            torch.ones_like(p_draft)
            if draft_probs is None
            else draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1)
        )
        real = torch.arange(K, device=draft_tokens.device)[None, :] < num_drafts[:, None]
        accepted = real & (u_accept.to(p_draft) * q_draft < p_draft)  # u < p/q, without dividing by 0
        num_accepted = accepted.long().cumprod(-1).sum(-1)
    else:
        num_accepted = torch.zeros(B, dtype=torch.long, device=draft_tokens.device)

    p_next = target_probs[rows, num_accepted]  # [B, V]
    rejected = num_accepted < num_drafts
    dist = p_next
    if bool(rejected.any()):
        at = num_accepted.clamp(max=max(K - 1, 0))
        if draft_probs is None:
            q_next = torch.zeros_like(p_next).scatter_(-1, draft_tokens[rows, at][:, None], 1.0)
        else:
            q_next = draft_probs[rows, at]
        residual = (p_next - q_next).clamp_(min=0.0)
        # p == q leaves no residual mass; that rejection has probability 0, floats aside.
        usable = rejected & (residual.sum(-1) > 0)
        dist = torch.where(usable[:, None], residual, p_next)
    return num_accepted, sample_from(dist, u_sample)


def greedy_accept(draft_tokens: torch.Tensor, num_drafts: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`accept_reject` at temperature 0, on logits: a draft passes when it is the target's argmax,
    and the next token is the argmax after the accepted prefix (the residual of a one-hot p
    against a rejected draft is p itself). No probabilities, no float64 sums: the same tokens.

    draft_tokens: [B, K]; num_drafts: [B]; logits: [B, K+1, V]. Returns (num_accepted [B], next_token [B]).
    """
    best = argmax(logits)  # [B, K+1]
    B, K = draft_tokens.shape
    real = torch.arange(K, device=draft_tokens.device)[None, :] < num_drafts[:, None]
    num_accepted = (real & (draft_tokens == best[:, :K])).long().cumprod(-1).sum(-1)
    return num_accepted, best[torch.arange(B, device=best.device), num_accepted]
