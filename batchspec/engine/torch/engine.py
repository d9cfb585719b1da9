"""The embedded engine: Hugging Face causal LMs in PyTorch, batched, with lossless speculation.

One `generate` call runs a list of requests under one `SpecConfig` with continuous batching: up
to `batch_size` rows decode together; a finished row leaves at once and a queued request is
prefilled and joins. Each decode step:

    drafts  = drafter.propose(rows)                 # n-gram lookup or draft model, 0..k per row
    logits  = target([pending token] + drafts)      # one forward verifies every row's drafts
    n, next = accept_reject(drafts, q, p, uniforms) # sampling.py; greedy is its T=0 limit
    commit n drafts + next per row; finish on eos, stop string or max_tokens

Plain decoding is the same loop with no drafts (k = 0), so the baseline and the speculative
arms share every line of code but the drafter, and comparisons between them are fair.

The engine knows nothing about Parquet, Ray or calibration. It does know tokenization: prompts,
chat templates, stop strings and the per-row checks (empty prompt, too long for the context).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from batchspec.engine.base import (
    ENGINE_METHODS,
    Completion,
    GenerateResult,
    Request,
    SamplingParams,
    SpecConfig,
    StepCost,
    Timing,
)
from batchspec.engine.sampling import accept_reject, probs_from_logits, sample_from
from batchspec.engine.torch.drafters import ModelDrafter, NgramDrafter, fit_vocab
from batchspec.engine.torch.kv import Batch
from batchspec.engine.torch.load import check_same_tokenizer, load_pretrained
from batchspec.errors import ConfigError, ModelError, one_line

SUPPORTED = ENGINE_METHODS["torch"]


@dataclass
class Row:
    """A request being decoded: its tokens so far, its randomness and its counters."""

    index: int  # position in the request list
    params: SamplingParams
    prompt_len: int
    context: list[int]  # prompt + output so far
    generator: torch.Generator | None
    draft_tokens: int = 0
    accepted_tokens: int = 0
    target_steps: int = 0
    accepted_at: list[int] = field(default_factory=list)  # see Completion
    accepted_steps: list[int] = field(default_factory=list)  # see Completion
    finish: str | None = None
    stop_at: int | None = None  # char offset where a stop string begins

    @property
    def output(self) -> list[int]:
        return self.context[self.prompt_len :]

    def uniform(self) -> torch.Tensor:
        return self.uniforms(1)[0]

    def uniforms(self, n: int) -> torch.Tensor:
        """n uniform draws from this row's own generator (greedy rows draw nothing: zeros)."""
        if self.generator is None:
            return torch.zeros(n)
        return torch.rand(n, generator=self.generator)


@dataclass
class Clock:
    timing: Timing = field(default_factory=Timing)

    def add(self, part: str, since: float) -> float:
        now = time.perf_counter()
        setattr(self.timing, part, getattr(self.timing, part) + now - since)
        return now


class TorchEngine:
    """Engine protocol over a loaded target (and lazily loaded draft models)."""

    name = "torch"

    def __init__(self, model, tokenizer, model_name: str = "model", device: str | None = None,
                 draft_loader=None) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.device = torch.device(device or next(model.parameters()).device)
        self.vocab = model.get_output_embeddings().weight.shape[0]
        self.max_context = _max_context(model.config)
        self.eos_ids = _eos_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids, default=0)
        self._draft_loader = draft_loader  # name -> (model, tokenizer)
        self._drafts: dict[str, object] = {}

    @classmethod
    def load(cls, model: str, draft_model: str | None = None, dtype: str = "float32",
             device: str | None = None) -> "TorchEngine":
        """Load the target (registry name, local folder or fsspec URL) and preload a draft model."""
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")

        def loader(name: str):
            return load_pretrained(name, dtype, device)

        target, tokenizer = loader(model)
        engine = cls(target, tokenizer, model_name=model, device=device, draft_loader=loader)
        if draft_model:
            engine.check(SpecConfig("draft_target", 1, draft_model=draft_model))
        return engine

    # -- the protocol ---------------------------------------------------------------------------

    def check(self, spec: SpecConfig) -> None:
        if spec.method not in SUPPORTED:
            raise ConfigError(
                f"{spec.source or 'spec'}: decoding_type {spec.method} is not supported by the torch engine "
                "(supported: NGram, DraftTarget); use --engine trtllm"
            )
        if spec.method == "draft_target":
            if not spec.draft_model:
                raise ConfigError(f"{spec.source or 'spec'}: DraftTarget needs a draft model (speculative_model_dir or --draft-model)")
            self._draft(spec.draft_model)

    def generate(self, requests: Sequence[Request], spec: SpecConfig, batch_size: int) -> GenerateResult:
        self.check(spec)
        clock = Clock()
        start = time.perf_counter()
        completions: list[Completion | None] = [None] * len(requests)
        rows: list[Row] = []
        for i, request in enumerate(requests):
            row_or_error = self._prepare(i, request)
            if isinstance(row_or_error, Completion):
                completions[i] = row_or_error
            else:
                rows.append(row_or_error)
        with torch.inference_mode():
            for row in self._decode(rows, spec, max(1, batch_size), clock):
                completions[row.index] = self._finish(requests[row.index], row)
        clock.timing.wall_s = time.perf_counter() - start
        assert all(c is not None for c in completions)
        return GenerateResult(completions, clock.timing)  # type: ignore[arg-type]

    def close(self) -> None:
        self._drafts.clear()

    # -- requests in and out ---------------------------------------------------------------------

    def encode(self, request: Request) -> list[int]:
        """Token ids of a request's prompt: chat messages through the chat template, text as is."""
        if request.prompt_token_ids is not None:
            return list(request.prompt_token_ids)
        if request.messages is not None:
            ids = self.tokenizer.apply_chat_template(list(request.messages), add_generation_prompt=True, tokenize=True)
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        return self.tokenizer(request.prompt, add_special_tokens=True)["input_ids"]

    def _prepare(self, index: int, request: Request) -> Row | Completion:
        problem = _request_problem(request)
        if problem:
            return Completion.failed(request.id, problem)
        try:
            ids = self.encode(request)
        except Exception as exc:  # a malformed chat message must fail its row, not the batch
            return Completion.failed(request.id, f"cannot tokenize the prompt: {one_line(exc)}")
        if not ids:
            return Completion.failed(request.id, "prompt is empty after tokenization")
        limit = self.max_context
        if len(ids) + request.params.max_tokens > limit:
            return Completion.failed(
                request.id,
                f"prompt has {len(ids)} tokens; with max_tokens {request.params.max_tokens} it exceeds "
                f"the model's context of {limit} tokens",
                prompt_tokens=len(ids),
            )
        params = request.params
        generator = None
        if not params.greedy:
            generator = torch.Generator().manual_seed(params.seed if params.seed is not None else _stable_seed(request.id))
        return Row(index, params, len(ids), list(ids), generator)

    def _finish(self, request: Request, row: Row) -> Completion:
        out = row.output
        text = self.tokenizer.decode(out, skip_special_tokens=True)
        if row.stop_at is not None:
            text = text[: row.stop_at]
        return Completion(
            id=request.id, text=text, token_ids=out, prompt_tokens=row.prompt_len, output_tokens=len(out),
            finish_reason=row.finish or "length", draft_tokens=row.draft_tokens,
            accepted_tokens=row.accepted_tokens, target_steps=row.target_steps,
            accepted_at=row.accepted_at, accepted_steps=row.accepted_steps,
        )

    # -- the decode loop -------------------------------------------------------------------------

    def _decode(self, queue: list[Row], spec: SpecConfig, batch_size: int, clock: Clock):
        """Yield each row when it finishes; keeps at most batch_size rows in flight. Rows are
        admitted shortest prompt first (completions keep request order), so rows prefilled
        together have similar lengths and batched prefill pads little."""
        queue = sorted(queue, key=lambda r: r.prompt_len)
        active: list[Row] = []
        batch = Batch(self.device)
        drafter = self._drafter(spec)
        while queue or active:
            if queue and len(active) < batch_size:
                fresh, queue = queue[: batch_size - len(active)], queue[batch_size - len(active) :]
                fresh_batch = self._prefill(fresh, clock)
                t = time.perf_counter()
                drafter.admit(fresh, self.device)
                clock.add("draft_s", t)
                batch.extend(fresh_batch)
                active += fresh
                active, batch, drafter = yield from self._retire(active, batch, drafter)
                continue
            self._step(active, batch, drafter, spec, clock)
            t = time.perf_counter()
            active, batch, drafter = yield from self._retire(active, batch, drafter)
            batch.compact()
            if isinstance(drafter, ModelDrafter) and drafter.batch is not None:
                drafter.batch.compact()
            clock.add("other_s", t)

    def _retire(self, active: list[Row], batch: Batch, drafter):
        done = [r for r in active if r.finish]
        if not done:
            return active, batch, drafter
        for row in done:
            yield row
        keep = [i for i, r in enumerate(active) if not r.finish]
        if not keep:
            return [], Batch(self.device), self._fresh_drafter(drafter)
        index = torch.tensor(keep, device=self.device)
        batch.select(index)
        drafter.select(index)
        return [active[i] for i in keep], batch, drafter

    def _prefill(self, rows: list[Row], clock: Clock) -> Batch:
        t = time.perf_counter()
        batch = Batch(self.device)
        prompts = [r.context for r in rows]
        logits = batch.forward(self.model, prompts, self.pad_id)
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        batch.keep(lengths)
        last = logits[torch.arange(len(rows)), lengths - 1]
        probs = probs_from_logits(last, *self._sampling_tensors(rows))
        first = sample_from(probs, torch.stack([r.uniform() for r in rows]).to(self.device)).tolist()
        for row, token in zip(rows, first):
            self._commit(row, [token])
        clock.add("prefill_s", t)
        return batch

    def _step(self, rows: list[Row], batch: Batch, drafter, spec: SpecConfig, clock: Clock) -> None:
        t = time.perf_counter()
        budgets = [max(0, min(spec.draft_len, r.params.max_tokens - len(r.output) - 1)) for r in rows]
        drafts = drafter.propose(rows, budgets, self.vocab) if max(budgets, default=0) > 0 else None
        t = clock.add("draft_s", t)

        draft_lists = drafts.tokens if drafts else [[] for _ in rows]
        logits = batch.forward(self.model, [[r.context[-1]] + d for r, d in zip(rows, draft_lists)], self.pad_id)
        t = clock.add("verify_s", t)

        K = logits.shape[1] - 1
        num_drafts = torch.tensor([len(d) for d in draft_lists], device=self.device)
        draft_tokens = torch.tensor([d + [0] * (K - len(d)) for d in draft_lists], device=self.device, dtype=torch.long)
        temps, top_ps = self._sampling_tensors(rows)
        target_probs = probs_from_logits(
            logits.reshape(-1, logits.shape[-1]), temps.repeat_interleave(K + 1), top_ps.repeat_interleave(K + 1)
        ).view(len(rows), K + 1, -1)
        u = torch.stack([r.uniforms(K + 1) for r in rows]).to(self.device)
        draft_probs = drafts.probs[:, :K] if drafts is not None and drafts.probs is not None else None
        num_accepted, next_token = accept_reject(draft_tokens.view(len(rows), K), draft_probs, num_drafts,
                                                 target_probs, u[:, :K], u[:, K])
        batch.keep(num_accepted + 1)  # the pending token plus the accepted drafts
        accepted, nexts = num_accepted.tolist(), next_token.tolist()
        if drafts is not None:
            drafter.commit(num_accepted, drafts, nexts)
        for row, d, n, nxt in zip(rows, draft_lists, accepted, nexts):
            # drafts accepted past the row's end (eos, a stop string) are not output: not counted
            n = min(n, self._commit(row, d[:n] + [nxt]))
            row.target_steps += 1
            row.draft_tokens += len(d)
            row.accepted_tokens += n
            row.accepted_steps.append(n)
            row.accepted_at.extend([0] * (n - len(row.accepted_at)))
            for j in range(n):
                row.accepted_at[j] += 1
        clock.add("other_s", t)

    def _commit(self, row: Row, tokens: list[int]) -> int:
        """Append committed tokens, stopping at eos, max_tokens or a stop string; return how many
        were appended. Stop strings are checked after every token, so a speculative row ends on
        the same token as a plain one."""
        for i, token in enumerate(tokens, 1):
            row.context.append(token)
            if token in self.eos_ids:
                row.finish = "stop"
                return i
            if row.params.stop and self._stopped(row):
                return i
            if len(row.output) >= row.params.max_tokens:
                row.finish = "length"
                return i
        return len(tokens)

    def _stopped(self, row: Row) -> bool:
        text = self.tokenizer.decode(row.output, skip_special_tokens=True)
        hits = [text.find(s) for s in row.params.stop if s and s in text]
        if hits:
            row.stop_at, row.finish = min(hits), "stop"
        return bool(hits)

    def _sampling_tensors(self, rows: list[Row]) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.tensor([r.params.temperature for r in rows], device=self.device),
            torch.tensor([r.params.top_p for r in rows], device=self.device),
        )

    # -- what calibration needs besides generate (batchspec.predict replays and prices) ----------

    def profile(self, target: Sequence[tuple[int, int, int]], drafts: Sequence[tuple[str, int, int]] = (),
                temperature: float = 0.0, reps: int = 3) -> list[StepCost]:
        """Time one target forward for each (batch, context, tokens per row) in `target`, the
        accept rule's sampling work included, and one step for each (draft model, batch, context)
        in `drafts` (plus each draft model's prefill of one row). Each point's cache is one
        prefilled row copied to the batch size (attention cost depends on shapes, not values), so
        a profile costs a few forwards, not batched prefills. The fastest of `reps` tries counts."""
        points: list[StepCost] = []
        plan = sorted([("target", self.model_name, b, c, w) for b, c, w in target] + [("draft", d, b, c, 1) for d, b, c in drafts])
        with torch.inference_mode():
            for (kind, name, b, c), group in itertools.groupby(plan, key=lambda p: p[:4]):
                model = self.model if kind == "target" else self._draft(name)
                filler = [(17 + 31 * i) % self.vocab for i in range(c)]
                batch = Batch(self.device)
                t = time.perf_counter()
                batch.forward(model, [filler], self.pad_id)
                if kind == "draft" and not any(p.kind == "draft_prefill" and p.model == name for p in points):
                    points.append(StepCost("draft_prefill", name, 1, 0, c, time.perf_counter() - t))
                batch.keep(torch.tensor([c], device=self.device))
                batch.select(torch.zeros(b, dtype=torch.long, device=self.device))
                widths = [w for *_, w in group]
                self._time_forward(batch, model, kind, filler[:1], b, temperature)  # warm-up, not counted
                best = {w: float("inf") for w in widths}
                for _ in range(reps):  # round-robin over widths, so load changes hit every width alike
                    for w in widths:
                        best[w] = min(best[w], self._time_forward(batch, model, kind, filler[:w], b, temperature))
                points += [StepCost(kind, name, b, c, w, best[w]) for w in widths]
        return points

    def _time_forward(self, batch: Batch, model, kind: str, tokens: list[int], b: int, temperature: float) -> float:
        t = time.perf_counter()
        logits = batch.forward(model, [tokens] * b, self.pad_id)
        if kind == "target":
            flat = logits.reshape(-1, logits.shape[-1])
            n = flat.shape[0]
            probs_from_logits(flat, torch.full((n,), temperature, device=self.device), torch.ones(n, device=self.device))
        else:
            logits[:, -1].argmax(-1).tolist()
        seconds = time.perf_counter() - t
        batch.keep(torch.zeros(b, dtype=torch.long, device=self.device))  # the probe's slots become holes
        return seconds

    def teacher_forced_logits(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
                              draft_model: str | None = None, group: int = 8) -> list[torch.Tensor]:
        """For each (prompt ids, output ids): the target's (or a draft model's) logits [len(output), V]
        after prompt + output[:s] for every s, from one forward per group of rows (right-padded).
        The head runs on the output positions only (a prompt's logits would cost memory for
        nothing); a draft's logits are cut or -inf padded to the target's vocabulary, as its draft
        steps are."""
        model = self.model if draft_model is None else self._draft(draft_model)
        decoder, head = model.get_decoder(), model.get_output_embeddings()
        out: list[torch.Tensor] = []
        with torch.inference_mode():
            for begin in range(0, len(sequences), group):
                part = sequences[begin : begin + group]
                seqs = [list(p) + list(o)[:-1] for p, o in part]
                width = max(len(s) for s in seqs)
                ids = torch.tensor([s + [self.pad_id] * (width - len(s)) for s in seqs], device=self.device)
                mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=self.device)
                hidden = decoder(input_ids=ids, attention_mask=mask).last_hidden_state
                for r, (p, o) in enumerate(part):
                    logits = head(hidden[r, len(p) - 1 : len(p) - 1 + len(o)])
                    out.append(fit_vocab(logits.float(), self.vocab).cpu())
        return out

    # -- drafters --------------------------------------------------------------------------------

    def _drafter(self, spec: SpecConfig):
        if spec.method == "ngram":
            return NgramDrafter(spec.ngram_size)
        if spec.method == "draft_target":
            return ModelDrafter(self._draft(spec.draft_model), self.pad_id)
        return NgramDrafter(0)  # "none": never called, budgets are 0

    def _fresh_drafter(self, drafter):
        return ModelDrafter(drafter.model, self.pad_id) if isinstance(drafter, ModelDrafter) else drafter

    def _draft(self, name: str):
        """Load (once) a draft model and check it shares the target's tokenizer."""
        if name not in self._drafts:
            if self._draft_loader is None:
                raise ModelError(f"draft model {name!r}: this engine was built without a model loader")
            model, tokenizer = self._draft_loader(name)
            check_same_tokenizer(self.tokenizer, tokenizer, self.model_name, name)
            self._drafts[name] = model.eval()
        return self._drafts[name]


def _request_problem(request: Request) -> str | None:
    p = request.params
    if request.prompt_token_ids is not None:
        pass
    elif request.messages is None and (request.prompt is None or not isinstance(request.prompt, str)):
        return "prompt is missing (null)" if request.prompt is None else f"prompt must be a string, got {type(request.prompt).__name__}"
    elif request.messages is None and not request.prompt.strip():
        return "prompt is empty"
    if not isinstance(p.max_tokens, int) or p.max_tokens < 1:
        return f"max_tokens must be an integer >= 1, got {p.max_tokens!r}"
    if not p.temperature >= 0:
        return f"temperature must be >= 0, got {p.temperature!r}"
    if not 0 < p.top_p <= 1:
        return f"top_p must be in (0, 1], got {p.top_p!r}"
    return None


def _max_context(config) -> int:
    for key in ("max_position_embeddings", "n_positions", "max_seq_len"):
        value = getattr(config, key, None)
        if value:
            return int(value)
    return 2048


def _eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def _stable_seed(text: str) -> int:
    import zlib

    return zlib.crc32(text.encode())
