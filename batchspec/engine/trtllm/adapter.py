"""The TensorRT-LLM engine: a thin adapter over `tensorrt_llm.LLM` (1.2 LLM API, PyTorch backend).

This module owns the library calls; the translation to and from TensorRT-LLM's API is pure and
lives in translate.py, the iteration stats' parsing in iterstats.py, memory planning in memory.py
(docs/engines/trtllm.md: the design and every source read). The rules it follows, each from
TensorRT-LLM's source (file and offset in tests/engine/trtllm/fake_tensorrt_llm/SOURCES.md, where
the stand-in that tests this module is written from the same reading):

- One live LLM per worker. Each LLM takes its weights plus `free_gpu_memory_fraction` of the
  memory still free and holds it until `shutdown()`; a second one would run out of memory or get
  almost no KV cache. Switching arms shuts the live LLM down, releases its memory, then plans and
  builds the next with nothing else resident. Every build's seconds are recorded (calibration
  counts them as cost; `arms_are_builds`).
- Like for like: every arm is built with the run's non-speculative options (`run_options`, merged
  once from the run's option files by config/spec.py); an arm whose file disagrees is refused.
- Iteration stats: the executor keeps at most `max_stats_len` and drops the oldest
  (py_executor.py `_append_iter_stats`), so the adapter drains `get_stats()` after every finished
  request and sizes `max_stats_len` for the gap between drains; the totals are then checked against
  the per-request counts (`stats_gap`), and figures that could not be checked are labelled. Per-
  request stats give each row's accepted drafts per step and each decode iteration a `Step`
  (seconds, rows, context) for calibration's cost table.
- Several GPUs: one LLM spans all of the worker's GPUs (tensor x pipeline parallel sizes, checked
  against worker.num_gpus before the run); memory is planned and reported per GPU.
- Per request: accepted = len(token_ids) - decoding_iter, target steps = decoding_iter - 1
  (executor/result.py `decoding_iter` counts the context step, which yields one token). Proposed
  tokens are counted per iteration only (`numDraftTokens`, what each request really carried: NGram
  often proposes fewer than max_draft_len); the exact total is shared out over rows, and where the
  stats are incomplete the rows keep the upper bound draft_len x steps, labelled an estimate in
  `GenerateResult.caveats`.
- One-model arms (Eagle3 one-model, MTP): 1.2 samples them greedily unless
  `allow_advanced_sampling` (translate.decoding_config_spec sets it; a file that forbids it has
  its sampled rows refused), and reports no draft latency, so no draft/verify split is claimed.
- Prompts go in as token ids (chat templates tokenized here): a text prompt would be tokenized
  again with `add_special_tokens=True`, doubling the BOS a rendered chat template holds.

Nothing here has run against real TensorRT-LLM; `python jobs/gpu_check.py` on a GPU node checks it.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from batchspec.engine.acceptance import Acceptance, PlainRow
from batchspec.engine.base import (
    ENGINE_METHODS,
    Completion,
    GenerateResult,
    Progress,
    Request,
    SpecConfig,
    Timing,
)
from batchspec.engine.trtllm.guided import guided_kwargs, split_unguided, with_guided_backend
from batchspec.engine.trtllm.memory import (
    DEFAULT_FREE_GPU_MEMORY_FRACTION,
    free_gpu_bytes,
    model_size,
    plan_draft_memory,
    release_gpu_memory,
)
from batchspec.engine.trtllm.iterstats import (
    IterationSpecStats,
    apportion_drafts,
    attach_request_steps,
    parse_entries,
    peak_gpu_memory,
    request_traces,
    stats_from_iterations,
    stats_gap,
    steps_from_iterations,
)
from batchspec.engine.trtllm.ngram_pool import pool_acceptance
from batchspec.engine.trtllm.translate import (
    DTYPES,
    METHOD_TO_DECODING_TYPE,
    NESTED_CLASSES,
    SPEC_PREFIX,
    TRTLLM_RELEASE,
    completion_from_output,
    conflicting_options,
    llm_kwargs,
    one_model,
    prompt_input,
    sampling_kwargs,
    spec_options,
    world_size,
)
from batchspec.errors import ConfigError, EngineUnavailable, one_line

# Under a controller, rows submitted beyond those finished, in batches: the executor admits a new
# row as soon as one finishes, while the adapter collects rows in submission order.
AHEAD = 2

INSTALL_HINT = (
    "pip install tensorrt_llm==1.2.* --extra-index-url https://pypi.nvidia.com "
    "(or use NVIDIA's TensorRT-LLM release container)"
)


def require_trtllm():
    """Import tensorrt_llm, or raise EngineUnavailable with one line saying how to get it."""
    try:
        return importlib.import_module("tensorrt_llm")
    except Exception as exc:  # ImportError, or CUDA/driver errors raised while it imports
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise EngineUnavailable(
            f"engine trtllm needs tensorrt_llm (TensorRT-LLM 1.2) on a GPU node: {INSTALL_HINT}; "
            f"not importable here: {reason}"
        ) from None


# ---------------------------------------------------------------------------------------------
# The adapter (needs tensorrt_llm and a GPU)


@dataclass
class BuildRecord:
    """One LLM built for an arm: how long it took, and any memory fallback applied."""

    label: str
    seconds: float
    ran_as: str  # the label actually built (differs after a memory fallback)
    reason: str | None = None


@dataclass
class _Built:
    llm: Any
    spec: SpecConfig  # what the LLM actually runs
    key: tuple  # (arm asked for, batch size)
    options: dict | None = None  # the LLM options it was built with (the run's, a guided decoding backend added: guided.py)
    guided: bool = False  # built for rows with a response_format


class TrtllmEngine:
    """The `Engine` protocol over `tensorrt_llm.LLM`; one instance per worker, whose LLM spans all
    of the worker's GPUs (its LLM options' tensor x pipeline parallel sizes)."""

    name = "trtllm"
    arms_are_builds = True  # switching arms builds an LLM: calibration counts and caps builds
    in_flight_control = False  # an arm is a build: the controller chooses per chunk of rows
    counterfactual = False  # no teacher-forced logits: a model drafter's acceptance is measured by running it
    end_token_in_output = False  # TensorRT-LLM's output ids and counts leave the end token out
    regime = None

    def __init__(self, model: str, llm_options: dict[str, Any] | None = None, *, dtype: str | None = None,
                 clock: Callable[[], float] = time.perf_counter, stats_timeout_s: float = 2.0):
        self._trtllm = require_trtllm()
        self.model_name = model
        self.run_options = dict(llm_options or {})
        if dtype is not None:
            if dtype not in DTYPES:
                raise ConfigError(f"dtype: expected one of {', '.join(DTYPES)} for the trtllm engine, got {dtype!r}")
            self.run_options["dtype"] = DTYPES[dtype]
        self.clock = clock
        self.stats_timeout_s = stats_timeout_s
        self.builds: list[BuildRecord] = []
        self.last_iteration_stats = IterationSpecStats()
        self.peak_gpu_bytes: int | None = None  # most memory seen in use on one of the LLM's GPUs
        self._live: _Built | None = None

    def check(self, spec: SpecConfig) -> None:
        where = spec.source or "spec"
        if spec.method not in ENGINE_METHODS[self.name]:
            raise ConfigError(f"{where}: {spec.method} is not supported by the trtllm engine")
        if spec.method in ("draft_target", "eagle3") and not spec.draft_model:
            raise ConfigError(f"{where}: speculative_config.speculative_model_dir: {METHOD_TO_DECODING_TYPE[spec.method]} needs a draft model location")
        differ = conflicting_options(spec, self.run_options)
        if differ:
            raise ConfigError(f"{where}: sets {differ[0]}; every arm of a run is built with the run's LLM options (like for like with none): set it once for the run")

    def generate(self, requests: Sequence[Request], spec: SpecConfig, batch_size: int, control=None) -> GenerateResult:
        """Complete `requests` under `spec` (base.Engine.generate). With `control` (calibrate/segments.py),
        rows are submitted at most AHEAD batches ahead of the rows finished, so the executor's batch
        stays full without every row queued at once, and `control` is called with the call's
        `Progress` after every `batch_size` finished rows and at the end. Once it returns another
        arm no row is submitted: an arm is a build, so the call returns when the rows submitted
        finish, its completions those of the prefix of `requests` that ran."""
        self.check(spec)
        self._check_sampling(spec, requests)
        built = self._llm_for(spec, batch_size, guided=any(r.response_format is not None for r in requests))
        llm, params = built.llm, self._trtllm.SamplingParams
        guided = importlib.import_module("tensorrt_llm.sampling_params").GuidedDecodingParams
        unguided = split_unguided(requests, built.spec, built.options)
        start = self.clock()

        def submit(i: int, request: Request) -> Any:
            if i in unguided:
                return Completion.failed(request.id, unguided[i])
            try:
                sampling = params(**sampling_kwargs(request.params), **guided_kwargs(request, guided))
                return llm.generate_async(prompt_input(llm, request), sampling)
            except Exception as exc:  # a bad row (empty, too long) fails alone
                return Completion.failed(request.id, one_line(exc))

        futures: list[Any] = []
        completions: list[Completion] = []
        entries: list[dict] = []
        stop, told = False, 0
        read, steps, last, traces = 0, [], {}, {}  # the iteration stats read into decode steps and request traces

        def read_stats() -> None:  # the entries drained since the last read, into steps and traces
            nonlocal read
            steps.extend(steps_from_iterations(entries[read:], built.spec, last))
            request_traces(entries[read:], traces)
            read = len(entries)

        def submitted() -> list[tuple[Completion, int]]:  # the finished rows the executor ran, with their max_tokens
            return [(c, r.params.max_tokens) for r, c, f in zip(requests, completions, futures) if not isinstance(f, Completion)]

        ahead = len(requests) if control is None else AHEAD * batch_size
        while len(completions) < len(futures) or (len(futures) < len(requests) and not stop):
            while len(futures) < len(requests) and not stop and len(futures) - len(completions) < ahead:
                futures.append(submit(len(futures), requests[len(futures)]))
            n = len(completions)
            completions.append(self._collect(requests[n], futures[n], built.spec.draft_len))
            entries.extend(parse_entries(llm.get_stats(timeout=self.stats_timeout_s)))  # drain: the queue drops the oldest
            ended = len(completions) == len(futures) and (stop or len(futures) == len(requests))
            if control is not None and (len(completions) - told >= batch_size or ended):
                read_stats()
                if built.spec.method != "none":  # the finished rows' accepted drafts per step, as far as traced
                    ran = submitted()
                    attach_request_steps(ran, dict(sorted(traces.items())[:len(ran)]))
                progress = Progress(spec, list(range(told, len(completions))), completions + [None] * (len(requests) - len(completions)),
                                    {}, len(requests) - len(completions), Timing(wall_s=self.clock() - start), list(steps))
                told = len(completions)
                new = control(progress)
                stop = stop or (new is not None and new.label != spec.label)
        wall = self.clock() - start
        entries.extend(parse_entries(llm.get_stats(timeout=self.stats_timeout_s)))
        read_stats()
        caveats: dict[str, str] = {}
        gap = attach_request_steps(submitted(), dict(sorted(traces.items()))) if built.spec.method != "none" else None
        if gap is not None:
            caveats["accepted_steps"] = f"not reported: {gap}"
        peak = peak_gpu_memory(entries)
        self.peak_gpu_bytes = max(filter(None, (self.peak_gpu_bytes, peak)), default=None)
        stats = self.last_iteration_stats = stats_from_iterations(entries)
        result = self._result(built.spec, completions, stats, wall, caveats)
        result.steps = steps
        if result.steps and not any(s.context for s in result.steps):
            result.caveats["steps"] = "context not measured: TensorRT-LLM reported no per-request iteration stats"
        return result

    def encode(self, request: Request) -> list[int]:
        """The prompt ids the live LLM was given (a text prompt through its tokenizer with special
        tokens, as TensorRT-LLM tokenizes it). Only after a generate call: it builds nothing."""
        if self._live is None:
            raise RuntimeError("encode: no LLM is live on this worker yet (generate builds one)")
        llm = self._live.llm
        prompt = prompt_input(llm, request)
        return list(llm.tokenizer.encode(prompt, add_special_tokens=True)) if isinstance(prompt, str) else prompt

    def gpu_memory_per_gpu(self) -> int | None:
        """The most device memory seen in use on one GPU of this worker's LLMs (iteration stats'
        gpuMemUsage); None before any call reported it."""
        return self.peak_gpu_bytes

    @property
    def gpus(self) -> int:
        """GPUs each LLM of this engine spans (tensor x pipeline x context parallel sizes)."""
        return world_size(self.run_options)

    def acceptance(self, rows: Sequence[PlainRow], arms: Sequence[SpecConfig], requests: Sequence[Request] = (),
                   tree=None, batch_size: int = 1, grow: bool = False) -> tuple[dict[str, Acceptance], bool]:
        """The NGram arms' acceptance on unconstrained rows, its pool's rules replayed over their
        tokens (ngram_pool.py); no other arm's (base.Engine.acceptance): a model drafter's needs
        logits TensorRT-LLM does not return, so it is measured by running it."""
        if any(r.response_format is not None for r in requests):  # guided rows: the pool is not replayed under a grammar
            return {}, False
        return pool_acceptance(rows, arms, batch_size)

    def profile(self, target, drafts=(), tries: int = 2) -> list:
        """Nothing: TensorRT-LLM times no forward apart from generate; the controller learns step
        costs from the iteration statistics of the chunks it runs."""
        return []

    def build_seconds(self, spec: SpecConfig) -> float:
        """Seconds spent building the LLM(s) for `spec`'s label (calibration counts them as cost)."""
        return sum(b.seconds for b in self.builds if b.label == spec.label)

    def close(self) -> None:
        self._shutdown_live()

    # -- helpers ------------------------------------------------------------------------------

    def _result(self, spec: SpecConfig, completions: list[Completion], stats: IterationSpecStats, wall: float,
                caveats: dict[str, str]) -> GenerateResult:
        draft_s = 0.0
        if spec.method != "none":
            gap = stats_gap(stats, completions)
            if gap is None:
                apportion_drafts(completions, stats.draft_tokens, spec.draft_len)
            else:
                caveats["draft_tokens"] = f"estimate: upper bound draft_len x target steps per row ({gap})"
            if one_model(spec):
                caveats["draft_s"] = ("not measured: TensorRT-LLM reports no draft latency for one-model speculation; "
                                      "drafting is inside verify_s")
            else:
                draft_s = min(stats.draft_latency_s, wall)
        return GenerateResult(completions, Timing(draft_s=draft_s, verify_s=wall - draft_s, wall_s=wall), caveats=caveats)

    def _check_sampling(self, spec: SpecConfig, requests: Sequence[Request]) -> None:
        """1.2 decodes temperature > 0 greedily on one-model paths without allow_advanced_sampling
        (llm_args.py DecodingBaseConfig); a file that turns it off cannot take sampled rows."""
        if one_model(spec) and spec_options(spec).get("allow_advanced_sampling") is False:
            if any(not r.params.greedy for r in requests):
                raise ConfigError(
                    f"{spec.source or 'spec'}: {SPEC_PREFIX}allow_advanced_sampling: false makes TensorRT-LLM {TRTLLM_RELEASE} decode "
                    f"temperature > 0 rows greedily on one-model {METHOD_TO_DECODING_TYPE[spec.method]}; remove it or set it true"
                )

    def _llm_for(self, spec: SpecConfig, batch_size: int, guided: bool = False) -> _Built:
        """The live LLM for `spec`, built anew when none runs it; a call with constrained rows
        needs one built with a guided decoding backend (guided.py), which serves unconstrained
        rows too; a call without them builds as before structured output (no guided decoder)."""
        key = (spec, batch_size)
        live = self._live
        if live is not None and live.key == key and (live.guided or not guided):
            return live
        self._shutdown_live()  # one live LLM: its memory is back before the next plan and build
        options = with_guided_backend(self.run_options) if guided else self.run_options
        start = self.clock()
        effective, reason = self._fit_memory(spec, batch_size)
        llm = self._build(llm_kwargs(self.model_name, effective, options, batch_size))
        self.builds.append(BuildRecord(spec.label, self.clock() - start, effective.label, reason))
        self._live = _Built(llm, effective, key, options, guided)
        return self._live

    def _shutdown_live(self) -> None:
        if self._live is not None:
            live, self._live = self._live, None
            live.llm.shutdown()
            del live
            release_gpu_memory()

    def _build(self, kwargs: dict[str, Any]) -> Any:
        llmapi = importlib.import_module("tensorrt_llm.llmapi")
        kwargs["model"] = locate_model(kwargs["model"])
        decoding = kwargs.pop("speculative_config")
        if decoding is not None:
            cls = getattr(llmapi, decoding.class_name, None)
            if cls is None:
                version = getattr(self._trtllm, "__version__", "unknown")
                raise EngineUnavailable(
                    f"tensorrt_llm {version} has no llmapi.{decoding.class_name}; batchspec's adapter is written for TensorRT-LLM {TRTLLM_RELEASE}"
                )
            if "speculative_model_dir" in decoding.kwargs:
                decoding.kwargs["speculative_model_dir"] = locate_model(decoding.kwargs["speculative_model_dir"])
            kwargs["speculative_config"] = cls(**decoding.kwargs)
        for key, class_name in NESTED_CLASSES.items():
            if isinstance(kwargs.get(key), dict):
                kwargs[key] = getattr(llmapi, class_name)(**kwargs[key])
        return self._trtllm.LLM(**kwargs)

    def _fit_memory(self, spec: SpecConfig, batch_size: int) -> tuple[SpecConfig, str | None]:
        """Plan a Draft_Target arm's memory on the worker's GPUs as they are now: nothing resident."""
        if spec.method != "draft_target":
            return spec, None
        target, draft = model_size(locate_model(self.model_name)), model_size(locate_model(spec.draft_model or ""))
        if target is None or draft is None:
            return spec, None  # hub ids: sizes unknown before TensorRT-LLM downloads them
        options = self.run_options
        fraction = (options.get("kv_cache_config") or {}).get("free_gpu_memory_fraction") or DEFAULT_FREE_GPU_MEMORY_FRACTION
        plan = plan_draft_memory(
            free_gpu_bytes(), target, draft, fraction=fraction, batch_size=batch_size,
            max_seq_len=int(options.get("max_seq_len") or 4096), draft_len=spec.draft_len, gpus=self.gpus,
        )
        if plan.draft_len == spec.draft_len:
            return spec, None
        if plan.draft_len == 0:
            return SpecConfig(options=tuple((k, v) for k, v in spec.options if not k.startswith(SPEC_PREFIX)), source=spec.source), plan.reason
        return spec.with_draft_len(plan.draft_len), plan.reason

    @staticmethod
    def _collect(request: Request, future: Any, draft_len: int) -> Completion:
        if isinstance(future, Completion):
            return future
        try:
            return completion_from_output(request, future.result(), draft_len)
        except Exception as exc:
            return Completion.failed(request.id, one_line(exc))


def locate_model(name: str) -> str:
    """A model location TensorRT-LLM can load: registry names and fsspec URLs become local
    folders through batchspec.models; local folders and Hugging Face ids pass unchanged."""
    from batchspec.models import REGISTRY, resolve_model

    if name in REGISTRY or "://" in name:
        return str(resolve_model(name))
    return name
