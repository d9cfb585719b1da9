"""The engine contract: requests in, completions with statistics out.

Every engine (the embedded torch engine, the TensorRT-LLM adapter) implements `Engine` and passes
the one conformance suite in `tests/engine/conformance.py`. The contract knows nothing about
Parquet, Ray or calibration: it generates a list of requests under one speculative setting and
reports what it did.

Glossary (as in vLLM's rejection sampler):
- draft tokens: tokens proposed by the drafter (n-gram lookup, draft model, EAGLE head).
- accepted tokens: draft tokens the target kept under the accept/reject rule.
- bonus token: the token the target adds after every verify step (the recovered token on a
  rejection, or a fresh one when every draft passed); so each target step commits
  accepted + 1 tokens.
- target steps: target forward passes during decode (prefill excluded).
- mean accepted length: committed tokens per target step, bonus included (1 + accepted / steps).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from batchspec.engine.response_format import ResponseFormat

SPEC_METHODS = ("none", "ngram", "draft_target", "eagle3", "mtp", "suffix")
FINISH_REASONS = ("stop", "length", "error")
# Which speculative methods each engine runs ("none" always); factory.py builds them by these names.
ENGINE_METHODS: dict[str, tuple[str, ...]] = {
    "torch": ("none", "ngram", "draft_target", "eagle3", "suffix"),
    "trtllm": ("none", "ngram", "draft_target", "eagle3", "mtp"),  # suffix: not in TensorRT-LLM 1.2 (docs/suffix.md)
}
# Methods whose drafter is a model of its own (`SpecConfig.draft_model`): a cost profile times its
# draft step beside the target's forwards (batchspec.predict.costs).
DRAFTED_METHODS = ("draft_target", "eagle3")
# Weight dtypes a run may ask for, by torch name (engine/torch/load.py maps them to torch dtypes).
DTYPES = ("float32", "bfloat16", "float16")
# How an input row's text `prompt` reaches the model (batchspec.parse): "chat" as one user message
# through the model's chat template (a Request with `messages`), "raw" as is (a Request with `prompt`),
# as the chat and completion endpoints of the batch APIs do. `messages` rows always take the template.
PROMPT_FORMATS = ("chat", "raw")


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling. temperature 0 means greedy; `seed` makes sampling reproducible."""

    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class Request:
    """One row to complete: a plain `prompt` (tokenized as is, with the tokenizer's special tokens),
    chat `messages` ([{role, content}, ...], through the model's chat template), or
    `prompt_token_ids` (already tokenized, as vLLM's TokensPrompt). A `response_format` constrains
    the output to its JSON schema (structured output: docs/structured-output.md).

    `draft_scope`: rows with the same scope on one engine draft from each other's finished
    outputs (the suffix arm); meant to be a shard's key, set by whoever runs the shard (docs/suffix.md,
    "Scope"). None: the row drafts from its own context only. Engines without cross-row drafting
    ignore it."""

    id: str
    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    params: SamplingParams = SamplingParams()
    prompt_token_ids: tuple[int, ...] | None = None
    draft_scope: str | None = None
    response_format: ResponseFormat | None = None


# NGramDecodingConfig.max_matching_ngram_size's default in TensorRT-LLM's LLM API
# (tensorrt_llm/llmapi/llm_args.py: `max_matching_ngram_size: PositiveInt = Field(default=2, ...)`,
# the same in the 1.x reference docs through 1.4.0rc4). The one default for every engine, so an
# option file without the key means the same thing to trtllm-serve and to the torch engine.
NGRAM_SIZE_DEFAULT = 2
# The suffix arm's max_spec_factor and min_token_prob defaults: SuffixDecoding's (arXiv 2411.04975),
# vLLM's suffix_decoding_max_spec_factor / suffix_decoding_min_token_prob, Arctic Inference's.
SPEC_FACTOR_DEFAULT = 1.0
MIN_TOKEN_PROB_DEFAULT = 0.1
# The cap on one worker's suffix trees, MiB (the pipeline's worker.suffix_tree_mb; engine/torch/suffix.py).
SUFFIX_TREE_MB_DEFAULT = 256.0


def spec_label(method: str, draft_len: int) -> str:
    """An arm's name in stats, reports and logs: `none`, or `method:k=N`."""
    return "none" if method == "none" else f"{method}:k={draft_len}"


@dataclass(frozen=True)
class SpecConfig:
    """One speculative setting (one calibration arm), engine-neutral.

    `method` is one of SPEC_METHODS; `draft_len` is TensorRT-LLM's `max_draft_len` (0 for none);
    `draft_model` is the draft/EAGLE head location for draft_target/eagle3; `ngram_size` is
    `max_matching_ngram_size`. `spec_factor` and `min_token_prob` are the suffix arm's
    `max_spec_factor` and `min_token_prob` (SuffixDecoding's names; engine/torch/suffix.py).
    `options` keeps every other field of the source file untouched so the TensorRT-LLM adapter
    can pass it through.
    """

    method: str = "none"
    draft_len: int = 0
    draft_model: str | None = None
    ngram_size: int = NGRAM_SIZE_DEFAULT
    spec_factor: float = SPEC_FACTOR_DEFAULT
    min_token_prob: float = MIN_TOKEN_PROB_DEFAULT
    options: tuple[tuple[str, Any], ...] = ()
    source: str | None = None  # the file it came from, for error messages

    def __post_init__(self) -> None:
        assert self.method in SPEC_METHODS, self.method
        assert (self.method == "none") == (self.draft_len == 0), (self.method, self.draft_len)

    @property
    def label(self) -> str:
        return spec_label(self.method, self.draft_len)

    def with_draft_len(self, k: int) -> "SpecConfig":
        return dataclasses.replace(self, draft_len=k)


NO_SPEC = SpecConfig()


def acceptance_rate(accepted: int, drafted: int) -> float | None:
    """Accepted drafts over proposed drafts (None where nothing was drafted)."""
    return accepted / drafted if drafted else None


def mean_accepted_len(accepted: int, steps: int) -> float | None:
    """Tokens committed per target step, the bonus token included (None without steps)."""
    return 1.0 + accepted / steps if steps else None


class FrozenMap(tuple):
    """A YAML mapping kept hashable inside a frozen SpecConfig: a tuple of (key, value) pairs."""


def freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return FrozenMap((k, freeze(v)) for k, v in value.items())
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """The inverse of `freeze`: mappings back to dicts, sequences back to lists."""
    if isinstance(value, FrozenMap):
        return {k: thaw(v) for k, v in value}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


@dataclass
class Completion:
    """What became of one request. Exactly one per request, in request order."""

    id: str
    text: str | None
    token_ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str = "length"  # stop | length | error
    error: str | None = None
    draft_tokens: int = 0  # proposed
    accepted_tokens: int = 0
    target_steps: int = 0
    # Drafts accepted at each of the row's target steps, in order (counts only tokens committed:
    # drafts accepted past the row's end are not output). Empty when the engine does not report it.
    accepted_steps: list[int] = field(default_factory=list)
    # The suffix arm: its lookups for this row (one a step it drafted at) and how many of them
    # the shared tree (other rows' outputs) answered, not the row's own context.
    tree_lookups: int = 0
    tree_drafts: int = 0
    # Of accepted_tokens: drafts the row's grammar forced (the only continuation it allowed, as the
    # grammar library tokenizes it) that the target kept. 0 for an unconstrained row.
    forced_tokens: int = 0

    @classmethod
    def failed(cls, request_id: str, reason: str, prompt_tokens: int = 0) -> "Completion":
        return cls(request_id, None, prompt_tokens=prompt_tokens, finish_reason="error", error=reason)


@dataclass(frozen=True)
class StepCost:
    """One measured point of an engine's cost profile (`Engine.profile`): seconds of one forward
    of `model` over `batch` rows whose cache holds `context` tokens, `tokens` new tokens per row.
    kind: target (a verify or plain step, the accept rule included) | draft (one draft step)."""

    kind: str  # target | draft
    model: str  # the model timed
    batch: int  # rows in the forward
    context: int  # tokens each row's cache held
    tokens: int  # new tokens per row (a verify's width)
    seconds: float  # the fastest try's


@dataclass(frozen=True)
class Profile:
    """A cost profile (`Engine.profile`): its points, and the seconds timing them took."""

    points: list[StepCost] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class Timing:
    """Where one generate call spent its time, in seconds. Merges with `+`."""

    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    wall_s: float = 0.0

    @property
    def decode_s(self) -> float:
        return self.draft_s + self.verify_s + self.other_s

    def __add__(self, other: "Timing") -> "Timing":
        return Timing(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    def __sub__(self, other: "Timing") -> "Timing":
        """What was spent between two readings of one call's timing (`Progress.timing`)."""
        return Timing(*(a - b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))


ADMIT_WINDOW = 8  # batches' worth of rows within which a decode loop admits the shortest prompt first (`admission_order`)


def admission_order(lengths: Sequence[int], batch_size: int) -> list[int]:
    """The order a continuous-batching loop admits rows (indices into `lengths`, their prompt
    lengths): in input order by windows of ADMIT_WINDOW x `batch_size` rows, the shortest prompt
    first within each window.

    Sorted within a window, the rows a step admits together have close lengths, so a batched
    prefill pads little and a row joins a batch whose cache is about its length. Sorted over the
    whole shard instead, a shard whose workload changes along the file would mix its two halves,
    and calibration's window of recent rows (a few batches) would see a mixture, never the change
    (docs/pipeline.md, "Admission order")."""
    window = max(1, ADMIT_WINDOW * max(1, batch_size))
    out: list[int] = []
    for begin in range(0, len(lengths), window):
        out += sorted(range(begin, min(begin + window, len(lengths))), key=lambda i: lengths[i])
    return out


@dataclass(frozen=True)
class Step:
    """One decode step as the engine ran it: `rows` in flight, their cache's length before the
    step (`context`, holes included, as attention reads it), `tokens` per row (1 + the widest
    draft), the tokens it `committed` in all (accepted drafts plus a bonus token per row), its
    `seconds` (drafting, the verify forward and the step's bookkeeping, as the engine's clock
    counts them) and the `method` it drafted with. Calibration learns step costs from them."""

    rows: int
    context: int
    tokens: int
    committed: int
    seconds: float = 0.0
    method: str = "none"


@dataclass
class Progress:
    """What a generate call's `control` sees when it is called (`Engine.generate`)."""

    spec: SpecConfig  # the setting the rows in flight decode under
    done: list[int]  # request indices finished since the last call, in the order they finished
    completions: list["Completion | None"]  # by request index; None while a row is queued or in flight
    in_flight: Mapping[int, list[int]]  # request index -> output token ids so far (a live view: read it now)
    queued: int  # rows not admitted yet
    timing: "Timing"  # so far (a copy)
    steps: list[Step]  # every decode step so far, in order (the engine's own list: read, do not keep)


@dataclass
class GenerateResult:
    completions: list[Completion]
    timing: Timing
    # Figures of this result that are estimates or were not measured, by field name (for example
    # "draft_s", "draft_tokens"), each with a one-line reason; empty when everything was measured.
    caveats: dict[str, str] = field(default_factory=dict)
    # The decode steps the call ran, in order, each with its seconds (engines that report them:
    # the torch engine per step, TensorRT-LLM per iteration from its iteration stats).
    steps: list[Step] = field(default_factory=list)

    @property
    def output_tokens(self) -> int:
        return sum(c.output_tokens for c in self.completions)

    @property
    def decode_tokens(self) -> int:
        """Tokens committed by decode steps: each row's first token comes from prefill."""
        return sum(max(c.output_tokens - 1, 0) for c in self.completions)

    @property
    def draft_tokens(self) -> int:
        return sum(c.draft_tokens for c in self.completions)

    @property
    def accepted_tokens(self) -> int:
        return sum(c.accepted_tokens for c in self.completions)

    @property
    def target_steps(self) -> int:
        return sum(c.target_steps for c in self.completions)

    @property
    def acceptance_rate(self) -> float | None:
        return acceptance_rate(self.accepted_tokens, self.draft_tokens)

    @property
    def mean_accepted_len(self) -> float | None:
        return mean_accepted_len(self.accepted_tokens, self.target_steps)

    @property
    def goodput(self) -> float:
        """Tokens committed in decode per second of decode time (docs/architecture.md, "Glossary").
        The target's prefill and the first token it yields are left out (the same for every arm); a
        draft model's own prefill counts as draft time."""
        decode_s = self.timing.decode_s
        return self.decode_tokens / decode_s if decode_s > 0 else 0.0


@runtime_checkable
class Engine(Protocol):
    """What the pipeline and calibration need from an engine; one instance lives per worker."""

    name: str  # "torch" | "trtllm"
    model_name: str
    in_flight_control: bool  # generate switches arms between decode steps (else an arm switch ends the call: see generate)
    arms_are_builds: bool  # an arm switch builds a new engine; `builds` records each (label, seconds)
    counterfactual: bool  # `acceptance` answers for every arm it runs (else some are measured by running them)
    end_token_in_output: bool  # a row that ends on an end token has it among its output ids (torch; not TensorRT-LLM)

    def profile(self, target: Sequence[tuple[int, int, int]], drafts: Sequence[tuple[str, int, int, int]] = (),
                tries: int = 2) -> "Profile":
        """Time one forward per (batch, context, tokens per row) of the target and (draft model,
        batch, context, tokens) of a draft, the fastest of at least `tries` (no point where forwards
        cannot be timed apart from generate)."""

    def switch_s(self, arm: SpecConfig) -> float:
        """What switching the rows to `arm` is expected to cost, in seconds: 0 where arms switch
        between decode steps; where arms are builds, a build's (as this engine's builds took)."""

    def acceptance(self, rows: Sequence[Any], arms: Sequence[SpecConfig], requests: Sequence[Request] = (),
                   tree: Any = None, batch_size: int = 1, grow: bool = False) -> tuple[dict[str, Any], bool]:
        """Counterfactual acceptance (engine/acceptance.py): for plain rows (`PlainRow`, in the order
        they finished; `requests` theirs, for their grammars), each arm's `Acceptance` by label,
        this engine's drafters replayed over the rows' tokens, and whether all are exact. Arms it
        cannot replay are left out. `tree` is a suffix arm's tree of the key's earlier rows (with
        `grow` these rows join it); `batch_size` the batch they decoded at."""

    def check(self, spec: SpecConfig) -> None:
        """Raise a BatchspecError (one line) if this engine cannot run `spec` with its models."""

    def encode(self, request: Request) -> list[int]:
        """The token ids the engine prefills for `request` (calibration replays drafters over them)."""

    def generate(self, requests: Sequence[Request], spec: SpecConfig, batch_size: int) -> GenerateResult:
        """Complete every request under `spec`, at most `batch_size` sequences at a time.

        A bad row (empty prompt, too long for the context) yields an error Completion for that
        row only; the call raises only for problems that affect every row.

        Every engine also takes `control=`, a `Control` (calibration's controller), called with
        the call's `Progress` and returning the arm to go on under (None: stay):
        - where `in_flight_control` (the torch engine), after every decode step; the rows in flight
          and those queued decode under the arm it returns from the next step on (greedy output
          stays plain decoding's);
        - otherwise (TensorRT-LLM, where an arm is a build), after every `batch_size` finished rows
          and at the end; once it returns another arm no further row is submitted, and the call
          returns when the rows submitted finish: its completions are those of a prefix of
          `requests` (calibrate/segments.py runs the rest under the new arm).
        """

    def gpu_memory_per_gpu(self) -> int | None:
        """The most device memory seen in use on one of this engine's GPUs since it loaded (bytes;
        None on a CPU or where not measured): what the worker's shard stats report per GPU."""

    def close(self) -> None:
        """Release models and devices."""


class Control(Protocol):
    """A generate call's control (`Engine.generate`): given the call's `Progress`, the setting to
    go on under (None: keep the current one)."""

    def __call__(self, progress: Progress) -> SpecConfig | None:
        ...
