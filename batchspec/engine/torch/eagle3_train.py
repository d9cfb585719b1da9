"""Training an EAGLE-3 head for a job on the target's own rows (eagle3.py owns the head and its
format): from recorded rows (the target's tokens and hidden states), a head whose chain drafts
follow what this target writes on this workload, within a time budget. It knows the target's
embeddings and LM head; it knows nothing about where rows came from or how the head is used.

As EAGLE-3 trains (SafeAILab/EAGLE @ cb7e0841fe0c206c6ed74a197ad5e2a1f13f5a2b,
eagle/traineagle3/cnets.py `Model.forward`, eagle/traineagle3/main.py): the training-time test
unrolls `depth` positions, each depth fed the head's own hidden state from the depth before and
the true next token; the loss at depth d is the cross-entropy of the head's draft-vocabulary
distribution against the target's (its logits over the draft vocabulary, from the recorded final
hidden states: `soft`) or against the token the target wrote (`soft` False), on output positions
whose target token lies in the draft vocabulary, weighted 0.8^d; AdamW with betas (0.9, 0.95);
the target's embeddings frozen. The draft vocabulary is the most frequent output tokens
(`Model.scandata`).

Where it departs, for a small CPU budget: the LM head and the final norm start from the target's
(its LM head's rows of the draft vocabulary, its final norm), not at random (`warm_start`); the
learning rate warms up over the first 5% of the run and decays linearly to zero at its end, the
end being `max_steps` or the time budget.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from batchspec.engine.acceptance import PlainRow
from batchspec.engine.torch.counterfactual import chain_acceptance
from batchspec.engine.torch.eagle3 import Eagle3Head, aux_layers
from batchspec.engine.torch.eagle3_chains import chains
from batchspec.engine.torch.eagle3_states import Recorded
from batchspec.engine.torch.eagle3_release import head_config

LOSS_DECAY = 0.8  # depth d's loss weight is LOSS_DECAY ** d (EAGLE-3's `ploss_weight`)
WARMUP = 0.05  # share of the run over which the learning rate warms up


@dataclass(frozen=True)
class TrainSettings:
    budget_s: float = 60.0  # wall seconds of training (the head's steps; recording is not counted)
    max_steps: int | None = None  # optimizer steps; None: until the budget ends
    depth: int = 4  # training-time test positions unrolled
    draft_vocab_size: int = 8192
    lr: float = 2e-3
    rows_per_step: int = 4
    soft: bool = True
    warm_start: bool = True
    seed: int = 0


@dataclass
class TrainStats:
    """What a training run did: seconds, optimizer steps, passes over the rows, the rows and their
    output positions, and over its last pass the mean loss and, per depth, how often the head's
    argmax was the target's token (teacher-forced, on positions the draft vocabulary covers)."""

    seconds: float = 0.0
    steps: int = 0
    epochs: float = 0.0
    rows: int = 0
    positions: int = 0
    draft_vocab_size: int = 0
    coverage: float = 0.0  # share of the rows' output tokens inside the draft vocabulary
    loss: float = math.nan
    accuracy: list[float] = field(default_factory=list)


def coverage_of(rows: Sequence[Recorded], used: torch.Tensor) -> float:
    """The share of `rows`' output tokens inside the draft vocabulary `used` (target ids)."""
    outputs = torch.cat([row.tokens[row.prompt_len :] for row in rows]) if rows else torch.zeros(0, dtype=torch.long)
    return int(torch.isin(outputs, used).sum()) / len(outputs) if len(outputs) else 0.0


def draft_vocabulary(rows: Sequence[Recorded], size: int, vocab: int) -> tuple[torch.Tensor, float]:
    """The `size` most frequent output tokens of `rows` (fewer if fewer occur; ties to the lower
    id), sorted, and the share of output tokens they cover."""
    counts = Counter()
    for row in rows:
        counts.update(row.tokens[row.prompt_len :].tolist())
    top = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[: min(size, vocab)]
    used = torch.tensor(sorted(token for token, _ in top), dtype=torch.long)
    return used, coverage_of(rows, used)


def new_head(target, used: torch.Tensor, warm_start: bool = True, seed: int = 0) -> Eagle3Head:
    """A fresh head for `target` over the draft vocabulary `used` (sorted target ids)."""
    torch.manual_seed(seed)  # nn.Linear's initialisation draws from the global generator
    config = head_config(target.config, len(used))
    head = Eagle3Head(config, target.get_input_embeddings(), aux_layers(target.config.num_hidden_layers))
    with torch.no_grad():
        head.d2t.copy_(used - torch.arange(len(used)))
        head.t2d.zero_()
        head.t2d[used] = True
        if warm_start:
            head.lm_head.weight.copy_(target.get_output_embeddings().weight[used])
            head.norm.weight.copy_(target.get_decoder().norm.weight)
    return head


def train_head(target, rows: Sequence[Recorded], settings: TrainSettings = TrainSettings(),
               clock: Callable[[], float] = time.perf_counter, start: Eagle3Head | None = None) -> tuple[Eagle3Head, TrainStats]:
    """Train a head on `rows` (each with `last` when `settings.soft`) and say how it went: a new
    one over the rows' own draft vocabulary, or `start` (a published head, loaded for `target`)
    trained further in place over its own draft vocabulary, as SpecForge fine-tunes a head from a
    checkpoint."""
    rows = [r for r in rows if len(r.tokens) - r.prompt_len >= 2]  # a row needs a token after its first output
    assert rows, "no row has two output tokens to train on"
    if start is None:
        used, coverage = draft_vocabulary(rows, settings.draft_vocab_size, target.config.vocab_size)
        head = new_head(target, used, settings.warm_start, settings.seed).train()
    else:
        used = start.target_ids().cpu()
        coverage, head = coverage_of(rows, used), start.train()
        if coverage == 0.0:
            raise ValueError("the head's draft vocabulary holds none of the rows' output tokens: nothing to train it on")
        torch.manual_seed(settings.seed)
    to_draft = torch.full((target.config.vocab_size,), -1, dtype=torch.long)
    to_draft[used] = torch.arange(len(used))
    target_head = target.get_output_embeddings().weight.detach()[used]  # [Vd, H]: the target's logits over the draft vocabulary
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0)
    stats = TrainStats(rows=len(rows), draft_vocab_size=len(used), coverage=coverage,
                       positions=sum(len(r.tokens) - r.prompt_len - 1 for r in rows))
    rng = random.Random(settings.seed)
    start = clock()
    order: list[int] = []
    seen = 0
    pass_loss, pass_hits, pass_counts = [], [0] * settings.depth, [0] * settings.depth
    while True:
        progress = _progress(settings, stats.steps, clock() - start)
        if progress >= 1.0:
            break
        for group in optimizer.param_groups:
            group["lr"] = settings.lr * _schedule(progress)
        optimizer.zero_grad(set_to_none=True)
        for _ in range(settings.rows_per_step):
            if not order:
                if seen:  # a pass ended: its figures are the latest
                    stats.loss = sum(pass_loss) / len(pass_loss)
                    stats.accuracy = [h / c if c else 0.0 for h, c in zip(pass_hits, pass_counts)]
                    pass_loss, pass_hits, pass_counts = [], [0] * settings.depth, [0] * settings.depth
                order = list(range(len(rows)))
                rng.shuffle(order)
            row = rows[order.pop()]
            seen += 1
            loss, hits, counts = _row_loss(head, row, settings, to_draft, target_head)
            if loss.requires_grad:  # a row none of whose tokens the draft vocabulary holds has no loss
                (loss / settings.rows_per_step).backward()
            pass_loss.append(loss.item())
            pass_hits = [a + b for a, b in zip(pass_hits, hits)]
            pass_counts = [a + b for a, b in zip(pass_counts, counts)]
        optimizer.step()
        stats.steps += 1
    if math.isnan(stats.loss) and pass_loss:  # fewer rows seen than one pass: report the partial one
        stats.loss = sum(pass_loss) / len(pass_loss)
        stats.accuracy = [h / c if c else 0.0 for h, c in zip(pass_hits, pass_counts)]
    stats.seconds = clock() - start
    stats.epochs = seen / len(rows)
    return head.eval(), stats


def _progress(settings: TrainSettings, steps: int, elapsed: float) -> float:
    """The share of the run done: of max_steps, else of the budget (none: done at once)."""
    if settings.max_steps is not None:
        return steps / settings.max_steps if settings.max_steps > 0 else 1.0
    return elapsed / settings.budget_s if settings.budget_s > 0 else 1.0


def _schedule(progress: float) -> float:
    if progress < WARMUP:
        return (progress + 1e-3) / WARMUP
    return max(0.0, (1.0 - progress) / (1.0 - WARMUP))


def _row_loss(head: Eagle3Head, row: Recorded, settings: TrainSettings, to_draft: torch.Tensor,
              target_head: torch.Tensor) -> tuple[torch.Tensor, list[int], list[int]]:
    """The weighted loss over depths on one row's output positions, and per depth the argmax
    hits and the positions counted."""
    P, N = row.prompt_len, len(row.tokens)
    at = torch.arange(P - 1, N - 2)  # positions whose next-but-one token is an output token
    dtype = head.fc.weight.dtype
    logits = head.unroll(row.aux[None].to(dtype), row.tokens[None], settings.depth, at)
    total = torch.zeros(())
    hits, counts = [], []
    for d, lg in enumerate(logits):
        lg = lg[0]
        valid = at + 2 + d <= N - 1
        truth = to_draft[row.tokens[(at + 2 + d).clamp(max=N - 1)]]
        keep = valid & (truth >= 0)
        if not keep.any():
            hits.append(0)
            counts.append(0)
            continue
        logp = torch.log_softmax(lg[keep].float(), dim=-1)
        if settings.soft:
            target_logits = row.last[(at + 1 + d)[keep]].to(dtype) @ target_head.T
            loss = -(torch.softmax(target_logits.float(), dim=-1) * logp).sum(-1).mean()
        else:
            loss = torch.nn.functional.nll_loss(logp, truth[keep])
        total = total + LOSS_DECAY**d * loss
        hits.append(int((lg[keep].argmax(-1) == truth[keep]).sum()))
        counts.append(int(keep.sum()))
    return total, hits, counts


# -- a head for a job's shard key ------------------------------------------------------------------

HELD_BACK = 0.1  # share of a key's recorded rows held back from training, to measure the head on


@dataclass
class KeyTraining:
    """A job's head training on one shard key's recorded rows: the training run's stats, the
    rows held back from it, and on them, per draft length k, the mean accepted length of the
    head's greedy chain drafts against the tokens the target wrote (1.0: nothing accepted)."""

    budget_s: float
    train: TrainStats
    held_rows: int
    mean_accepted_len: dict[int, float] = field(default_factory=dict)

    def to_doc(self) -> dict:
        return {"budget_s": self.budget_s, "seconds": self.train.seconds, "steps": self.train.steps,
                "epochs": self.train.epochs, "rows": self.train.rows, "tokens": self.train.positions,
                "draft_vocab_size": self.train.draft_vocab_size, "coverage": self.train.coverage,
                "loss": None if math.isnan(self.train.loss) else self.train.loss, "accuracy": self.train.accuracy,
                "held_rows": self.held_rows, "mean_accepted_len": {str(k): v for k, v in self.mean_accepted_len.items()}}


def train_for_key(target, rows: Sequence[Recorded], budget_s: float, draft_lens: Sequence[int],
                  settings: TrainSettings = TrainSettings(soft=False), start: Eagle3Head | None = None
                  ) -> tuple[Eagle3Head, KeyTraining] | None:
    """Train a head on a key's recorded rows (`rows`, states without `last`: hard targets, the
    tokens the target wrote) within `budget_s`, from nothing or from `start` (`train_head`),
    every 1/HELD_BACK-th row held back and the head measured on those; None when no row has two
    output tokens to train on."""
    rows = [Recorded(r.tokens.clone(), r.prompt_len, r.aux.clone(), None) for r in rows if r.output_len >= 2]  # normal tensors: autograd reads them
    if not rows:
        return None
    step = max(2, round(1 / HELD_BACK))
    held = [r for i, r in enumerate(rows) if len(rows) >= 2 and i % step == step - 1]
    train = [r for i, r in enumerate(rows) if not (len(rows) >= 2 and i % step == step - 1)]
    head, stats = train_head(target, train, TrainSettings(**{**vars(settings), "budget_s": budget_s}), start=start)
    result = KeyTraining(budget_s, stats, len(held))
    if held and draft_lens:
        plain = [PlainRow(r.tokens[: r.prompt_len].tolist(), r.tokens[r.prompt_len :].tolist(), r.output_len) for r in held]
        by_k = chain_acceptance(plain, draft_lens, chains(head, held, max(draft_lens)))
        result.mean_accepted_len = {k: 1 + a.accepted_tokens / a.target_steps if a.target_steps else 1.0 for k, a in by_k.items()}
    return head, result
