"""The embedded engine: Hugging Face causal LMs in PyTorch, batched, with lossless speculation.

One `generate` call runs a list of requests under one `SpecConfig` with continuous batching
(decode.py: the loop, prefill and the accept step). Plain decoding is the same loop with no
drafts (k = 0), so the baseline and the speculative arms share every line of code but the
drafter, and comparisons between them are fair. What calibration needs besides generate (a
cost profile, teacher-forced logits) is in measure.py.

The engine knows nothing about Parquet, Ray or calibration. It does know tokenization: prompts,
chat templates, stop strings and the per-row checks (empty prompt, too long for the context).
"""

from __future__ import annotations

import array
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch

from batchspec.engine.base import (
    ENGINE_METHODS,
    SUFFIX_TREE_MB_DEFAULT,
    Completion,
    Control,
    GenerateResult,
    Profile,
    Progress,
    Request,
    SpecConfig,
    Timing,
)
from batchspec.engine.acceptance import Acceptance, PlainRow
from batchspec.engine.torch import counterfactual, measure
from batchspec.engine.sampling import argmax
from batchspec.engine.torch.clock import Clock, WallClock
from batchspec.engine.torch.decode import Decoder, ModelTarget, Recording, Row
from batchspec.engine.torch.drafters import ModelDrafter, NgramDrafter
from batchspec.engine.eagle3_format import is_head
from batchspec.engine.torch.eagle3 import Eagle3Head, aux_layers
from batchspec.engine.torch.eagle3_chains import chains
from batchspec.engine.torch.eagle3_states import HiddenCapture, Recorded, record
from batchspec.engine.torch.eagle3_release import load_head, save_head
from batchspec.engine.torch.eagle3_train import train_for_key
from batchspec.engine.torch.eagle3_drafter import Eagle3Drafter
from batchspec.engine.torch.grammar import Grammar, GrammarError, Grammars
from batchspec.engine.torch.kv import Batch
from batchspec.engine.torch.load import check_same_tokenizer, load_pretrained
from batchspec.engine.torch.suffix import Lookups, SuffixDrafter, SuffixTrees
from batchspec.engine.torch.suffix_tree import SuffixTree
from batchspec.errors import ConfigError, ModelError, one_line

SUPPORTED = ENGINE_METHODS["torch"]
ENCODED_KEPT = 2048  # requests whose prompt ids `TorchEngine.encode` keeps (4-byte ints; not the requests)


class TorchEngine:
    """Engine protocol over a loaded target (and lazily loaded draft models)."""

    name = "torch"
    in_flight_control = True  # generate takes control= (base.Engine.generate)
    arms_are_builds = False
    counterfactual = True
    end_token_in_output = True
    builds: tuple = ()

    def __init__(self, model, tokenizer, model_name: str = "model", device: str | None = None,
                 draft_loader=None, clock: Callable[[], Clock] = WallClock,
                 suffix_tree_mb: float = SUFFIX_TREE_MB_DEFAULT) -> None:
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
        self._heads: dict[str, Eagle3Head] = {}  # EAGLE-3 heads by folder (`head`)
        self._capture: HiddenCapture | None = None  # hooks on the target for every head, idle outside a read
        self._recording: Recording | None = None  # while `recording`: the rows whose hidden states are kept
        self._encoded: dict[int, tuple[weakref.ref, array.array]] = {}  # id(request) -> (the request, its prompt's ids): `encode`
        self.probe_seeds: dict[str, Batch] = {}  # model -> the one short row its cost probes fork from (measure.profile)
        self.warmed = False  # the target has decoded rows: a cost profile needs no warm-up forward (measure.profile)
        self.clock = clock  # makes each generate call's clock (clock.py): where every second it reports comes from
        # Finished rows' outputs by draft scope, for the suffix arm: every row with a scope joins its
        # scope's tree when it finishes, under any arm, so the tree is warm when calibration turns
        # the arm on; capped per worker (the pipeline's worker.suffix_tree_mb).
        self.trees = SuffixTrees(int(suffix_tree_mb * 2**20))
        self.grammars = Grammars(tokenizer, self.vocab, self.eos_ids)  # structured output: schemas compiled once

    @classmethod
    def load(cls, model: str, draft_model: str | None = None, dtype: str = "float32",
             device: str | None = None, suffix_tree_mb: float = SUFFIX_TREE_MB_DEFAULT) -> "TorchEngine":
        """Load the target (registry name, local folder or fsspec URL) and preload a draft model
        (or an EAGLE-3 head)."""
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")

        def loader(name: str):
            return load_pretrained(name, dtype, device)

        target, tokenizer = loader(model)
        engine = cls(target, tokenizer, model_name=model, device=device, draft_loader=loader, suffix_tree_mb=suffix_tree_mb)
        if draft_model:  # a draft model, or an EAGLE-3 head in the released format
            engine.check(SpecConfig("eagle3" if is_head(draft_model) else "draft_target", 1, draft_model=draft_model))
        return engine

    # -- the protocol ---------------------------------------------------------------------------

    def check(self, spec: SpecConfig) -> None:
        if spec.method not in SUPPORTED:
            raise ConfigError(
                f"{spec.source or 'spec'}: decoding_type {spec.method} is not supported by the torch engine "
                "(supported: NGram, Draft_Target, Eagle3, Suffix); use --engine trtllm"
            )
        if spec.method == "draft_target":
            if not spec.draft_model:
                raise ConfigError(f"{spec.source or 'spec'}: Draft_Target needs a draft model (speculative_model_dir or --draft-model)")
            self._draft(spec.draft_model)
        if spec.method == "eagle3":
            if not spec.draft_model:
                raise ConfigError(f"{spec.source or 'spec'}: Eagle3 needs a head (speculative_model_dir or --draft-model: "
                                  "a folder in the released EAGLE-3 format)")
            self.head(spec.draft_model)

    def generate(self, requests: Sequence[Request], spec: SpecConfig, batch_size: int,
                 control: Control | None = None) -> GenerateResult:
        self.check(spec)
        clock = self.clock()
        completions: list[Completion | None] = [None] * len(requests)
        rows: list[Row] = []
        for i, request in enumerate(requests):
            row_or_error = self._prepare(i, request)
            if isinstance(row_or_error, Completion):
                completions[i] = row_or_error
            else:
                rows.append(row_or_error)
        done: list[int] = []
        current = [spec]
        scopes = [r.draft_scope for r in requests]
        for scope in {s for s in scopes if s is not None}:  # a row run again must not draft from its own last run
            self.trees.forget(scope, {r.id for r in requests if r.draft_scope == scope})
        lookups = Lookups()

        def step(active: list[Row], queued: int) -> SpecConfig | None:
            progress = Progress(current[0], done[:], completions, _Outputs({r.index: r for r in active}), queued,
                                Timing(**vars(clock.timing)), clock.steps)
            done.clear()
            new = control(progress)
            if new is not None:
                self.check(new)
                current[0] = new
            return new

        self.warmed = self.warmed or bool(rows)  # a profile inside `control` runs after this call's first forwards
        with torch.inference_mode():
            run = self._decoder(scopes, lookups).run(rows, spec, max(1, batch_size), clock, step if control else None)
            for row in run:  # the next step's drafts see this row (decode.Decoder.retire yields before it steps on)
                completions[row.index] = self._finish(requests[row.index], row, lookups)
                self._keep(row)
                done.append(row.index)
                if scopes[row.index] is not None:
                    self.trees.add(scopes[row.index], requests[row.index].id, row.output)
        timing = clock.close()
        assert all(c is not None for c in completions)
        return GenerateResult(completions, timing, steps=clock.steps)  # type: ignore[arg-type]

    @contextmanager
    def recording(self, max_positions: int) -> Iterator[list[Recorded]]:
        """Keep, for the rows the generate calls inside decode (while their prompts and max_tokens
        stay under `max_positions` in all), the target's hidden states EAGLE-3 reads, taken from
        the forwards that decode them (decode.Recording): the list yielded gets each finished row
        that ran to its end without an error, as `Recorded` (tokens, states; no `last`)."""
        assert self._recording is None, "one recording at a time"
        self._recording = Recording(self.hidden_capture(), max_positions)
        try:
            yield self._recording.rows
        finally:
            self._recording = None

    def train_head(self, rows: Sequence[Recorded], budget_s: float, draft_lens: Sequence[int], folder: str,
                   start: str | None = None) -> dict | None:
        """Train an EAGLE-3 head on recorded rows (`recording`) within `budget_s`, from nothing or
        from the released head in the local folder `start` (a published head the job runs as an
        arm), and write it to the local `folder` in the released format
        (eagle3_train.train_for_key); its training stats as a document, None when no row had two
        output tokens to train on."""
        begun = load_head(start, self.model, dtype=next(self.model.parameters()).dtype) if start is not None else None
        trained = train_for_key(self.model, rows, budget_s, draft_lens, start=begun)
        if trained is None:
            return None
        head, stats = trained
        save_head(head, folder)
        return stats.to_doc()

    def _keep(self, row: Row) -> None:
        """A finished row into the recording, when it has one and the row its states."""
        states = row.traced() if self._recording is not None and row.error is None else None
        row.trace = None
        if states is not None and len(row.output) >= 2:
            self._recording.rows.append(Recorded(torch.tensor(row.context, dtype=torch.long), row.prompt_len, states.cpu()))

    def gpu_memory_per_gpu(self) -> int | None:
        """The most device memory torch allocated on this engine's GPU (None on a CPU)."""
        return int(torch.cuda.max_memory_allocated(self.device)) if self.device.type == "cuda" else None

    def close(self) -> None:
        self._drafts.clear()

    # -- requests in and out ---------------------------------------------------------------------

    def encode(self, request: Request) -> list[int]:
        """Token ids of a request's prompt: chat messages through the chat template, text as is.
        The ids of the last ENCODED_KEPT requests are kept (while the request object lives): calibration
        asks again for the prompts of rows the shard prefilled, each time it counts a row, and a chat
        template costs about as much as pricing every arm over the window (0.5 ms a row)."""
        held = self._encoded.get(id(request))
        if held is not None and held[0]() is request:
            return held[1].tolist()
        ids = self._encode(request)
        try:
            ref = weakref.ref(request)
        except TypeError:  # an object that takes no weak reference is not kept
            return ids
        if len(self._encoded) >= ENCODED_KEPT:
            del self._encoded[next(iter(self._encoded))]
        self._encoded[id(request)] = (ref, array.array("i", ids))
        return ids

    def _encode(self, request: Request) -> list[int]:
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
        try:
            grammar = self.grammar(request)
        except GrammarError as exc:
            return Completion.failed(request.id, str(exc), prompt_tokens=len(ids))
        params = request.params
        generator = None
        if not params.greedy:
            generator = torch.Generator().manual_seed(params.seed if params.seed is not None else _stable_seed(request.id))
        return Row(index, params, len(ids), list(ids), generator, grammar=grammar)

    def grammar(self, request: Request) -> Grammar | None:
        """A fresh matcher at the start of the request's structured output (None when it has none);
        GrammarError (one line) when its schema cannot be compiled. Counterfactual acceptance of
        constrained rows walks one along each plain row (counterfactual.py)."""
        return None if request.response_format is None else self.grammars.matcher(request.response_format)

    def _finish(self, request: Request, row: Row, lookups: Lookups) -> Completion:
        out = row.output
        text = self.tokenizer.decode(out, skip_special_tokens=True)
        if row.stop_at is not None:
            text = text[: row.stop_at]
        return Completion(
            id=request.id, text=text, token_ids=out, prompt_tokens=row.prompt_len, output_tokens=len(out),
            finish_reason=row.finish or "length", error=row.error, draft_tokens=row.draft_tokens,
            accepted_tokens=row.accepted_tokens, target_steps=row.target_steps,
            accepted_steps=row.accepted_steps, forced_tokens=row.forced_tokens,
            tree_lookups=lookups.lookups.get(row.index, 0), tree_drafts=lookups.tree_drafts.get(row.index, 0),
        )

    def _decoder(self, scopes: Sequence[str | None], lookups: Lookups) -> Decoder:
        return Decoder(ModelTarget(self.model, self.pad_id, self.device, self._recording), self.tokenizer, self.eos_ids, self.vocab,
                       self.device, lambda spec: self._drafter(spec, scopes, lookups))

    # -- what calibration needs besides generate ---------------------------------------------------

    def profile(self, target: Sequence[tuple[int, int, int]], drafts: Sequence[tuple[str, int, int, int]] = (),
                tries: int = 2, temperature: float = 0.0, reps: int = measure.REPS) -> Profile:
        """Time one target forward for each (batch, context, tokens per row) in `target` and one draft
        forward for each (draft model, batch, context, tokens per row) in `drafts`, the fastest of
        at least `tries` (see measure.profile); the profile's seconds are its wall time."""
        began = time.perf_counter()
        points = measure.profile(self, target, drafts, temperature, max(reps, tries), least=tries)
        return Profile(points, time.perf_counter() - began)

    def switch_s(self, arm: SpecConfig) -> float:
        """Nothing: the engine switches drafters between decode steps (their time is draft time)."""
        return 0.0

    def acceptance(self, rows: Sequence[PlainRow], arms: Sequence[SpecConfig], requests: Sequence[Request] = (),
                   tree: SuffixTree | None = None, batch_size: int = 1, grow: bool = False) -> tuple[dict[str, Acceptance], bool]:
        """Every arm's acceptance on plain rows, its drafter replayed (base.Engine.acceptance;
        counterfactual.py): n-gram lookup, a draft model and suffix drafting, under each row's
        grammar where it has one."""
        return counterfactual.acceptance(self, rows, arms, requests, tree, batch_size, grow)

    def teacher_forced_logits(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
                              draft_model: str | None = None, group: int = 8) -> list[torch.Tensor]:
        """Per (prompt ids, output ids): the target's (or a draft's) logits over the output (see
        measure.teacher_forced_logits)."""
        model = self.model if draft_model is None else self._draft(draft_model)
        return measure.teacher_forced_logits(model, sequences, self.vocab, self.pad_id, self.device, group)

    def draft_proposals(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], draft_model: str) -> list[list[int]]:
        """Per (prompt ids, output ids): a draft model's greedy proposal at every output position
        (its argmax after prompt + output[:s]), from one teacher-forced forward."""
        return [argmax(logits).tolist() for logits in self.teacher_forced_logits(sequences, draft_model)]

    def head_chains(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], folder: str,
                    k: int) -> list[list[list[int]]]:
        """Per (prompt ids, output ids): the EAGLE-3 head in `folder`'s greedy chain of k drafts for a
        step starting at every output position (eagle3_chains.chains; index 0 empty), over the
        hidden states of one teacher-forced forward of the target (`head_states`)."""
        return chains(self.head(folder), self.head_states(sequences, folder), k)

    def head_states(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], folder: str) -> list[Recorded]:
        """Per (prompt ids, output ids): the target's hidden states the EAGLE-3 head in `folder`
        reads, from one teacher-forced forward (eagle3_states.record; under inference mode: nothing
        here needs gradients), in the head's dtype."""
        head = self.head(folder)
        with torch.inference_mode():
            return record(self.model, sequences, head.layers, keep_last=False, dtype=head.fc.weight.dtype)

    # -- drafters --------------------------------------------------------------------------------

    def _drafter(self, spec: SpecConfig, scopes: Sequence[str | None], lookups: Lookups):
        """A fresh drafter for `spec`; `scopes` (by request index) and `lookups` are the call's."""
        if spec.method == "ngram":
            return NgramDrafter(spec.ngram_size)
        if spec.method == "suffix":
            return SuffixDrafter(self.trees, scopes, lookups, spec.spec_factor, spec.min_token_prob)
        if spec.method == "draft_target":
            return ModelDrafter(self._draft(spec.draft_model), self.pad_id)
        if spec.method == "eagle3":
            return Eagle3Drafter(self.head(spec.draft_model), self.model, self._capture)
        return NgramDrafter(0)  # "none": never called, budgets are 0

    def head(self, folder: str) -> Eagle3Head:
        """Load (once) the EAGLE-3 head in `folder` (the released format: eagle3_release.load_head) in
        the target's dtype, and hook the target's layers it reads (once for every head)."""
        if folder not in self._heads:
            dtype = next(self.model.parameters()).dtype
            self._heads[folder] = load_head(folder, self.model, dtype).to(self.device).eval()
            self.hidden_capture()
        return self._heads[folder]

    def hidden_capture(self) -> HiddenCapture:
        """The one capture of the target's hidden states EAGLE-3 reads (hooked once, idle outside a read)."""
        if self._capture is None:
            self._capture = HiddenCapture(self.model, aux_layers(self.model.config.num_hidden_layers), on=False)
        return self._capture

    def _draft(self, name: str):
        """Load (once) a draft model and check it shares the target's tokenizer."""
        if name not in self._drafts:
            if self._draft_loader is None:
                raise ModelError(f"draft model {name!r}: this engine was built without a model loader")
            model, tokenizer = self._draft_loader(name)
            check_same_tokenizer(self.tokenizer, tokenizer, self.model_name, name)
            self._drafts[name] = model.eval()
        return self._drafts[name]


class _Outputs(Mapping):
    """`Progress.in_flight`: request index -> output so far, copied only when asked for (a control
    reads a few rows, once; a copy of every row's output at every step would cost more)."""

    def __init__(self, rows: dict) -> None:
        self._rows = rows

    def __getitem__(self, index: int) -> list[int]:
        return self._rows[index].output

    def __iter__(self):
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


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
    if p.stop and request.response_format is not None:
        return "stop strings cannot be combined with response_format: a stop string would cut the JSON (the schema ends the output)"
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
