"""What calibration needs from the torch engine besides generate (counterfactual.py replays the
drafters; batchspec.predict prices steps): a cost profile of target and draft forwards (an
EAGLE-3 head's draft step among them), and teacher-forced logits.

It knows models and the KV cache; it does not know requests, rows or the accept rule's bookkeeping.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

import torch

from batchspec.engine.base import StepCost
from batchspec.engine.sampling import argmax, greedy_accept, probs_from_logits
from batchspec.engine.torch.drafters import fit_vocab
from batchspec.engine.eagle3_format import is_head
from batchspec.engine.torch.eagle3_chains import Chain, draft_rows
from batchspec.engine.torch.kv import Batch


REPS, AGREE = 3, 0.2  # a profile point's tries: at most REPS rounds, two enough where they agree within AGREE
SEED = 32  # tokens the target prefills for a profile's probes, repeated to the widest context (kv.Batch.repeated)


def profile(engine, target: Sequence[tuple[int, int, int]], drafts: Sequence[tuple[str, int, int, int]] = (),
            temperature: float = 0.0, reps: int = REPS, agree: float = AGREE, least: int = 2) -> list[StepCost]:
    """Time one target forward of `engine` for each (batch, context, tokens per row) in `target`,
    the accept rule's work on its logits included (`time_forward`), and one draft forward for each
    (draft model, batch, context, tokens per row) in `drafts`. Each model has one seed row as long
    as the widest context asked of it, and every point's cache is a copy of that row cut to the
    point's context and copied to its batch size (attention cost depends on shapes, not values),
    so a profile costs at most one prefill per model and a few forwards. A draft model's row is
    its prefill at that context; the target's row is `SEED` tokens prefilled and repeated to the
    widest context, so its prefill stays small. The engine keeps that row (`probe_seeds`), so a
    later profile of the target (at another batch size) prefills nothing and needs no warm-up.
    Each copy has room for its widest probe, as a decoding batch's cache has between doublings
    (kv.Batch.fork). The fastest try counts: `least` (two) tries of every point (round-robin over
    widths, so a change of load hits every width alike), and up to `reps` while some point's
    tries differ by more than `agree`; one forward per model warms it first, not counted.
    `least=1` times every point once (the calibration controller's profile: the steps the worker
    runs correct its prices).

    A decoding batch of several rows almost always holds holes (rows of different lengths,
    rejected drafts), so its forwards take the explicit-mask path (kv.Batch._attention_inputs);
    a probe of several rows gets one hole, so it times that path too. A single row never keeps a
    hole (slots it does not keep are cut off), so its probe stays dense."""
    points: list[StepCost] = []
    plan = sorted([("target", engine.model_name, b, c, w) for b, c, w in target] + [("draft", d, b, c, w) for d, b, c, w in drafts])
    device = engine.device
    with torch.inference_mode():
        for (kind, name), per_model in itertools.groupby(plan, key=lambda p: p[:2]):
            per_model = list(per_model)
            if kind == "draft" and is_head(name):
                points += head_points(engine, name, per_model, reps, agree, least)
                continue
            model = engine.model if kind == "target" else engine._draft(name)
            widest = max(c for *_, c, _ in per_model)
            filler = [(17 + 31 * i) % engine.vocab for i in range(widest)]
            seed = engine.probe_seeds.get(name) if kind == "target" else None
            # a model's first forwards after loading run slow: one warm-up, not counted, unless the
            # target has decoded rows (engine.warmed: the controller profiles after a shard's first steps)
            warm = seed is None and not (kind == "target" and getattr(engine, "warmed", False))
            if seed is None:
                seed = Batch(device)
                prefilled = widest if kind == "draft" else min(widest, SEED)
                seed.forward(model, [filler[:prefilled]], engine.pad_id, last_only=True)
                seed.keep(torch.tensor([prefilled], device=device))
                if kind == "target":
                    engine.probe_seeds[name] = seed
            if seed.slots < widest:
                seed = seed.repeated(widest)
            for (b, c), group in itertools.groupby(per_model, key=lambda p: p[2:4]):
                widths = [w for *_, w in group]
                batch = seed.fork(torch.zeros(b, dtype=torch.long, device=device), c, room=max(widths))
                if b > 1:
                    _open_hole(batch)
                if warm:
                    time_forward(batch, model, kind, filler[:1], b, temperature, engine.pad_id)
                    warm = False
                tries: dict[int, list[float]] = {w: [] for w in widths}
                for _ in range(reps):
                    if settled(tries, agree, least):
                        break
                    for w in widths:
                        tries[w].append(time_forward(batch, model, kind, filler[:w], b, temperature, engine.pad_id))
                points += [StepCost(kind, name, b, c, w, min(tries[w])) for w in widths]
    return points


def head_points(engine, name: str, per_model: Sequence[tuple], reps: int, agree: float, least: int) -> list[StepCost]:
    """An EAGLE-3 head's draft step at each (batch b, context c) as its drafter runs one
    (eagle3_drafter.Eagle3Drafter): one depth of b rows' chains over c positions of context each,
    drafted together (eagle3_chains.draft_rows). The chains' context is filler (its cost depends on
    shapes only)."""
    head = engine.head(name)
    points = []
    for *_, b, c, w in per_model:
        chain = Chain(head)
        weight = head.fc.weight
        chain.extend(torch.zeros(c, 3 * head.target_hidden, device=weight.device, dtype=weight.dtype),
                     [(17 + 31 * i) % engine.vocab for i in range(c)])
        rows, greedy = [chain] * b, (lambda _b, _i, logits: int(head.to_target(logits.argmax(-1))))
        draft_rows(rows, [1] * b, greedy)  # warm
        tries: dict[int, list[float]] = {w: []}
        for _ in range(reps):
            if settled(tries, agree, least):
                break
            began = time.perf_counter()
            draft_rows(rows, [1] * b, greedy)
            tries[w].append(time.perf_counter() - began)
        points.append(StepCost("draft", name, b, c, w, min(tries[w])))
    return points


def settled(tries: dict, agree: float = AGREE, least: int = 2) -> bool:
    """Whether a point group's tries (width -> seconds, in order) are enough: `least` of every
    width, and each width's within `agree` of its fastest (`profile` then stops; else it tries
    again, up to its `reps`). One try is settled: there is nothing to agree with."""
    return all(len(ts) >= least and (len(ts) == 1 or max(ts) <= (1 + agree) * min(ts)) for ts in tries.values())


def _open_hole(batch: Batch) -> None:
    """Mark every row's first slot invalid, as a row shorter than its batch or a rejected draft
    would leave it: the context is one token shorter, and the forward needs an explicit mask."""
    batch.valid[:, 0] = False
    batch.positions = batch.positions - 1


def time_forward(batch: Batch, model, kind: str, tokens: list[int], b: int, temperature: float, pad_id: int) -> float:
    """Seconds of one forward of `tokens` on each of `b` rows and what the accept rule does with
    its logits: for the target at temperature 0 the greedy accept rule on them
    (sampling.greedy_accept, as decode's greedy step runs it: argmaxes, no probabilities), else
    the probabilities; a draft, as
    drafters.ModelDrafter does, takes the logits after each row's last token only and their
    argmax. The probe's slots are forgotten afterwards. A probe does exactly what the step it
    prices does and nothing more: one-hot probabilities at every position, which the greedy
    engine never builds, would grow with the width and price wide verifies dearer than they run."""
    device = batch.device
    t = time.perf_counter()
    logits = batch.forward(model, [tokens] * b, pad_id, last_only=kind != "target")
    if kind == "target" and temperature <= 0:  # decode's greedy step, every draft counted as proposed
        greedy_rule(logits, [tokens] * b)
    elif kind == "target":
        flat = logits.reshape(-1, logits.shape[-1])
        n = flat.shape[0]
        probs_from_logits(flat, torch.full((n,), temperature, device=device), torch.ones(n, device=device))
    else:
        argmax(logits).tolist()
    seconds = time.perf_counter() - t
    batch.keep(torch.zeros(b, dtype=torch.long, device=device))  # the probe's slots are cut off
    return seconds


def greedy_rule(logits: torch.Tensor, tokens: Sequence[Sequence[int]]) -> None:
    """Decode's greedy step on a forward's `logits` [B, T, V]: the accept rule (sampling.greedy_accept)
    with each row's tokens after its first as its drafts (fewer than T - 1: padded, not proposed),
    and its tokens out. What every profile point times after its forward (`time_forward`), and
    what a bench that sets a probe against those points must time too."""
    k = logits.shape[1] - 1
    drafts = torch.tensor([list(t[1:]) + [0] * (k + 1 - len(t)) for t in tokens], dtype=torch.long,
                          device=logits.device).view(len(tokens), k)
    accepted, nxt = greedy_accept(drafts, torch.tensor([len(t) - 1 for t in tokens], device=logits.device), logits)
    accepted.tolist(), nxt.tolist()


def teacher_forced_logits(model, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], vocab: int, pad_id: int,
                          device: torch.device, group: int = 8) -> list[torch.Tensor]:
    """For each (prompt ids, output ids): the model's logits [len(output), V] after prompt +
    output[:s] for every s, from one forward per group of rows (right-padded). The head runs on
    the output positions only (a prompt's logits would cost memory for nothing); a draft's logits
    are cut or -inf padded to the target's vocabulary `vocab`, as its draft steps are."""
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    out: list[torch.Tensor] = []
    with torch.inference_mode():
        for begin in range(0, len(sequences), group):
            part = sequences[begin : begin + group]
            seqs = [list(p) + list(o)[:-1] for p, o in part]
            width = max(len(s) for s in seqs)
            ids = torch.tensor([s + [pad_id] * (width - len(s)) for s in seqs], device=device)
            mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=device)
            hidden = decoder(input_ids=ids, attention_mask=mask).last_hidden_state
            for r, (p, o) in enumerate(part):
                logits = head(hidden[r, len(p) - 1 : len(p) - 1 + len(o)])
                out.append(fit_vocab(logits.float(), vocab).cpu())
    return out
