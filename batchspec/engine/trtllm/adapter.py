"""The TensorRT-LLM engine: a thin adapter over `tensorrt_llm.LLM` (1.2 LLM API, PyTorch backend).

This module owns the library calls; the translation to and from TensorRT-LLM's API is pure and
lives in translate.py, the iteration stats' parsing in iterstats.py, memory planning in memory.py
(docs/engines/trtllm.md: the design and every source read). The rules it follows, each from
TensorRT-LLM's source (commit, file and symbol in tests/engine/trtllm/fake_tensorrt_llm/SOURCES.md,
whose stand-in tests this module):

- One live LLM per worker. Each LLM takes its weights plus `free_gpu_memory_fraction` of the
  memory still free and holds it until its executor's worker process exits, which is after
  `shutdown()` returns. Switching arms shuts the live LLM down, waits (bounded) until the
  worker's GPUs show the memory back, then plans and builds the next with nothing else resident.
  Every build's seconds, that wait included, are recorded (calibration counts them as cost;
  `arms_are_builds`).
- Nothing of TensorRT-LLM on the driver: `install.require_trtllm_installed` finds the package
  without importing it (the import loads CUDA bindings a head node may not have); workers import it.
- Like for like: every arm is built with the run's non-speculative options (`run_options`, merged
  once from the run's option files by config/spec.py); an arm whose file disagrees is refused.
- Iteration stats: `get_stats(timeout)` waits until none has come for `timeout` seconds, then
  returns [] until the next request is submitted; so the adapter never waits on them while rows
  run (see `generate`), reads what has come just before a submission, and reads the rest once its
  rows have finished; every iteration is accounted for by its `iter` number. The totals are
  checked against the per-request counts (`stats_gap`), and figures that could not be checked are
  labelled. Per-request stats give each row's accepted drafts per step and each decode iteration
  a `Step` (seconds, rows, context) for calibration's cost table.
- Rows are collected as they finish (a finished row's response waits in its result's queue), so
  the executor always has rows queued while rows remain and its batch stays full.
- Stop strings are matched as tokens and cut from token_ids, not from the counts; max_tokens is
  capped at max_seq_len minus the prompt; a prompt longer than max_num_tokens, or with no room,
  is a row error; the end token is counted by the executor; sampled rows on 1.2 are drawn from one
  generator whatever their seed. Each is handled and labelled where it changes a figure.
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
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from batchspec.engine.acceptance import Acceptance, PlainRow
from batchspec.engine.base import (
    ENGINE_METHODS,
    Completion,
    GenerateResult,
    Profile,
    Progress,
    Request,
    SpecConfig,
    Timing,
)
from batchspec.engine.trtllm.install import import_trtllm, locate_model
from batchspec.engine.trtllm.guided import guided_kwargs, split_unguided, with_guided_backend
from batchspec.engine.trtllm.memory import (
    DEFAULT_FREE_GPU_MEMORY_FRACTION,
    free_gpu_bytes,
    gpu_memory,
    memory_back,
    model_size,
    plan_draft_memory,
    release_gpu_memory,
)
from batchspec.engine.trtllm.iterstats import (
    IterationSpecStats,
    RowCount,
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
    LLM_ARGS_REFUSED,
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
    stop_tokens_cut,
    world_size,
)
from batchspec.errors import ConfigError, EngineUnavailable, one_line

# Under a controller, rows submitted beyond those finished, in batches: the executor admits a new
# row as soon as one finishes, while the adapter collects rows in submission order.
AHEAD = 2
STATS_NOW = 0.0  # get_stats timeout of a read between submissions: what has arrived, no wait
POLL_S = 0.002  # between looks at the rows in flight: well under one decode iteration
SLEEP = time.sleep  # how an engine waits, unless it is given `sleep` (a simulator hands it its own)
# A build's seconds before the engine has timed one (`switch_s`): an 8B engine builds in 60-120 s
# (docs/calibration.md, "Constants"), so a switch is not taken for cheap before the first build.
BUILD_S_UNTIMED = 60.0


def response_ready(future: Any) -> bool:
    """Whether a submitted row's final response has come, so that its result() returns at once:
    the proxy's dispatch thread puts a request's responses in its result's `queue`, which result()
    reads (executor/result.py GenerationResultBase.__init__ and GenerationResult._result_step;
    executor/proxy.py dispatch_result_task); a non-streaming request gets one. A result without
    that queue is waited on in submission order."""
    queue = getattr(future, "queue", None)
    return queue is None or not queue.empty()


# ---------------------------------------------------------------------------------------------
# The adapter (needs tensorrt_llm and a GPU)


@dataclass
class BuildRecord:
    """One LLM built for an arm: how long it took (the wait for the last LLM's memory included),
    and any memory fallback applied."""

    label: str
    seconds: float
    ran_as: str  # the label actually built (differs after a memory fallback)
    reason: str | None = None
    released_s: float = 0.0  # of seconds: waiting for the GPU memory of the LLM shut down before it


@dataclass
class StatsRead:
    """What one generate call read of the iteration stats: entries in order, and how it read them."""

    entries: list[dict] = field(default_factory=list)
    reads: int = 0  # get_stats calls
    wait_s: float = 0.0  # seconds the last read waited for the stats to go quiet
    missing: int = 0  # iterations whose entries never came (gaps in `iter`)


@dataclass
class _Built:
    llm: Any
    spec: SpecConfig  # what the LLM actually runs
    key: tuple  # (arm asked for, batch size)
    options: dict | None = None  # the LLM options it was built with (the run's, a guided decoding backend added: guided.py)
    guided: bool = False  # built for rows with a response_format
    last_iter: int | None = None  # the last iteration whose stats were read


class TrtllmEngine:
    """The `Engine` protocol over `tensorrt_llm.LLM`; one instance per worker, whose LLM spans all
    of the worker's GPUs (its LLM options' tensor x pipeline parallel sizes)."""

    name = "trtllm"
    arms_are_builds = True  # switching arms builds an LLM: calibration counts and caps builds
    in_flight_control = False  # an arm is a build: the controller switches between segments of a shard, each a build
    counterfactual = False  # no teacher-forced logits: a model drafter's acceptance is measured by running it
    end_token_in_output = False  # the adapter leaves the end token out of a row's output ids (its counts include it)
    seeded_sampling = False  # 1.2's PyTorch sampler ignores a request's seed: sampled rows say so (caveats["sampled"])

    def __init__(self, model: str, llm_options: dict[str, Any] | None = None, *, dtype: str | None = None,
                 clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] | None = None,
                 stats_timeout_s: float = 2.0, release_timeout_s: float = 120.0):
        self.run_options = dict(llm_options or {})
        for key in self.run_options:
            if key in LLM_ARGS_REFUSED:
                raise ConfigError(f"llm_options: {key}: {LLM_ARGS_REFUSED[key]}")
        self._trtllm = import_trtllm()
        self.model_name = model
        if dtype is not None:
            if dtype not in DTYPES:
                raise ConfigError(f"dtype: expected one of {', '.join(DTYPES)} for the trtllm engine, got {dtype!r}")
            self.run_options["dtype"] = DTYPES[dtype]
        self.clock, self._sleep = clock, sleep
        self.stats_timeout_s = stats_timeout_s  # the quiet after a call's last iteration that ends its final read
        self.release_timeout_s = release_timeout_s  # the longest wait for a shut-down LLM's memory
        self.builds: list[BuildRecord] = []
        self.last_iteration_stats = IterationSpecStats()
        self.last_stats_read = StatsRead()
        self._baseline: list[tuple[int, int]] | None = None  # (free, total) per GPU before the first build
        self.peak_gpu_bytes: int | None = None  # most memory seen in use on one of the LLM's GPUs
        self._live: _Built | None = None

    def sleep(self, seconds: float) -> None:
        (self._sleep or SLEEP)(seconds)

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
        `Progress` after every `batch_size` finished rows and once at the end. Once it returns
        another arm no row is submitted: an arm is a build, so the call returns when the rows
        submitted finish, its completions those of the prefix of `requests` that ran.

        Nothing here waits on the iteration stats while rows run: `LLM.get_stats(timeout)` reads
        until no entry has come for `timeout` seconds and then returns [] until the next request is
        submitted (executor/result.py IterationResult.get_results), so a read while rows run would
        wait for all of them. The stats are read without waiting (timeout 0) just before a
        submission, which lifts that latch, and once after the last row, waiting for the quiet:
        the controller learns each row as it finishes and the decode steps read so far; every
        iteration of the call is read by its end, or the gap is said (`caveats["iterations"]`)."""
        self.check(spec)
        self._check_sampling(spec, requests)
        built = self._llm_for(spec, batch_size, guided=any(r.response_format is not None for r in requests))
        llm, params = built.llm, self._trtllm.SamplingParams
        guided = importlib.import_module("tensorrt_llm.sampling_params").GuidedDecodingParams
        unguided = split_unguided(requests, built.spec, built.options)
        stop_ids = {s: list(llm.tokenizer.encode(s, add_special_tokens=False)) for r in requests for s in r.params.stop}
        end_id = getattr(llm.tokenizer, "eos_token_id", None)
        start = self.clock()

        prompts: dict[int, int] = {}  # request index -> prompt tokens, as the executor counts them

        def submit(i: int, request: Request) -> Any:
            if i in unguided:
                return Completion.failed(request.id, unguided[i])
            try:
                sampling = params(**sampling_kwargs(request.params), **guided_kwargs(request, guided))
                prompt = prompt_input(llm, request)
                prompts[i] = len(prompt) if isinstance(prompt, list) else len(llm.tokenizer.encode(prompt, add_special_tokens=True))
                return llm.generate_async(prompt, sampling)
            except Exception as exc:  # a bad row (empty, longer than max_num_tokens) fails alone
                return Completion.failed(request.id, one_line(exc))

        futures: list[Any] = []
        finished: dict[int, Completion] = {}  # by request index, as rows finish
        cuts: dict[int, int] = {}  # per row: stop-word tokens TensorRT-LLM cut from its token_ids
        order: list[int] = []  # request indices in the order they finished
        read = StatsRead()
        stop, unlatched = False, False
        seen, steps, last, traces = 0, [], {}, {}  # the entries read so far, as decode steps and request traces

        def read_stats(timeout: float) -> None:
            nonlocal seen, unlatched
            began = self.clock()
            read.entries.extend(parse_entries(llm.get_stats(timeout=timeout)))
            read.reads += 1
            read.wait_s += self.clock() - began
            unlatched = False
            steps.extend(steps_from_iterations(read.entries[seen:], built.spec, last))
            request_traces(read.entries[seen:], traces)
            seen = len(read.entries)

        told: list[int] = []  # rows the controller has heard of, in that order

        def tellable() -> list[int]:
            """Finished rows not yet told whose per-step data is in (or will never be): the
            controller hears of a row once, so it hears of it when its trace has come."""
            if built.spec.method != "none":
                self._attach_steps(futures, prompts, finished, cuts, traces)
            heard = set(told)
            return [i for i in order if i not in heard and (built.spec.method == "none" or finished[i].error is not None
                                                            or not finished[i].target_steps or finished[i].accepted_steps)]

        def progress(rows: list[int]) -> Progress:
            told.extend(rows)
            heard = set(told)
            completions = [finished.get(i) if i in heard else None for i in range(len(requests))]
            return Progress(spec, rows, completions, {}, len(requests) - len(futures), Timing(wall_s=self.clock() - start),
                            list(steps))

        ahead = len(requests) if control is None else AHEAD * batch_size
        while len(finished) < len(futures) or (len(futures) < len(requests) and not stop):
            if len(futures) < len(requests) and not stop and len(futures) - len(finished) < ahead:
                if control is not None and unlatched:
                    read_stats(STATS_NOW)  # what has come so far; the submission below lifts the latch
                while len(futures) < len(requests) and len(futures) - len(finished) < ahead:
                    i = len(futures)
                    futures.append(submit(i, requests[i]))
                    if isinstance(futures[i], Completion):  # refused before it reached TensorRT-LLM
                        finished[i], cuts[i] = futures[i], 0
                        order.append(i)
                    else:
                        unlatched = True
            ready = [i for i in range(len(futures)) if i not in finished and response_ready(futures[i])]
            if not ready:
                self.sleep(POLL_S)  # the executor runs on; a row that finishes is seen within POLL_S
                continue
            for i in ready:
                finished[i], cuts[i] = self._collect(requests[i], futures[i], built.spec.draft_len, stop_ids, end_id, llm)
                order.append(i)
            more = len(futures) < len(requests) and not stop
            if control is not None and len(order) - len(told) >= batch_size and (more or len(finished) < len(futures)):
                rows = tellable()
                if len(rows) >= batch_size:
                    new = control(progress(rows))
                    stop = stop or (new is not None and new.label != spec.label)
        completions = [finished[i] for i in range(len(futures))]
        row_cuts = [cuts[i] for i in range(len(futures))]
        wall = self.clock() - start
        if unlatched or not read.reads:  # a request since the last read: this read is not latched
            read_stats(self.stats_timeout_s)
        read.missing = self._account(built, read.entries)
        caveats: dict[str, str] = {}
        if built.spec.method != "none":
            self._attach_steps(futures, prompts, finished, cuts, traces)
        if control is not None:
            heard = set(told)
            control(progress([i for i in order if i not in heard]))
        missed = [c.id for c, f in zip(completions, futures)
                  if built.spec.method != "none" and not isinstance(f, Completion) and c.error is None and c.target_steps and not c.accepted_steps]
        if missed:
            caveats["accepted_steps"] = f"not reported for {len(missed)} row(s) (first {missed[0]}): requestStats did not account for them"
        if read.missing:
            caveats["iterations"] = f"{read.missing} iteration(s) of this LLM never reported their stats"
        self._row_caveats(requests, completions, row_cuts, caveats)
        peak = peak_gpu_memory(read.entries)
        self.peak_gpu_bytes = max(filter(None, (self.peak_gpu_bytes, peak)), default=None)
        stats = self.last_iteration_stats = stats_from_iterations(read.entries)
        self.last_stats_read = read
        result = self._result(built.spec, completions, stats, wall, caveats, row_cuts)
        result.steps = steps
        if result.steps and not any(s.context for s in result.steps):
            result.caveats["steps"] = "context not measured: TensorRT-LLM reported no per-request iteration stats"
        return result

    @staticmethod
    def _attach_steps(futures, prompts, finished, cuts, traces) -> None:
        """Give the finished rows the executor ran their accepted drafts per step (iterstats.py)."""
        ran = [RowCount(prompts[i], finished.get(i), cuts.get(i, 0)) for i, f in enumerate(futures) if not isinstance(f, Completion)]
        attach_request_steps(ran, traces)

    @staticmethod
    def _account(built: _Built, entries: list[dict]) -> int:
        """Iterations of this LLM since the last call whose stats never came: gaps in `iter`."""
        iters = sorted(int(e["iter"]) for e in entries if e.get("iter") is not None)
        if not iters:
            return 0
        first = built.last_iter + 1 if built.last_iter is not None else iters[0]
        built.last_iter = iters[-1]
        return (iters[-1] - first + 1) - len(set(iters))

    @staticmethod
    def _row_caveats(requests, completions, cuts, caveats: dict[str, str]) -> None:
        """What rows cannot claim: a max_tokens TensorRT-LLM capped (base_worker.py _deduce_max_tokens:
        at most max_seq_len minus the prompt, with a warning in its log); sampled rows' pairing
        (1.2's TorchSampler draws every request from one generator and ignores `seed`)."""
        capped = [(c.id, c.output_tokens + cut, r.params.max_tokens) for r, c, cut in zip(requests, completions, cuts)
                  if c.error is None and c.finish_reason == "length" and c.output_tokens + cut < r.params.max_tokens]
        if capped:
            rid, got, asked = capped[0]
            caveats["max_tokens"] = (f"{len(capped)} row(s) capped by TensorRT-LLM at max_seq_len minus the prompt "
                                     f"(first {rid}: {got} of max_tokens {asked})")
        if any(not r.params.greedy for r in requests[:len(completions)]):
            caveats["sampled"] = (f"TensorRT-LLM {TRTLLM_RELEASE} draws every sampled row from one generator and ignores its "
                                  "seed: sampled rows are neither reproducible nor paired across arms, and their "
                                  "acceptance and speedup figures are estimates")

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

    def profile(self, target, drafts=(), tries: int = 2) -> Profile:
        """Nothing: TensorRT-LLM times no forward apart from generate; the controller learns step
        costs from the iteration statistics of the chunks it runs."""
        return Profile()

    def switch_s(self, arm: SpecConfig) -> float:
        """A build's seconds: the last build of `arm` on this engine, else its last build of any
        arm, else BUILD_S_UNTIMED."""
        same = [b.seconds for b in self.builds if b.label == arm.label] or [b.seconds for b in self.builds]
        return same[-1] if same else BUILD_S_UNTIMED

    def close(self) -> None:
        self._shutdown_live()

    # -- helpers ------------------------------------------------------------------------------

    def _result(self, spec: SpecConfig, completions: list[Completion], stats: IterationSpecStats, wall: float,
                caveats: dict[str, str], cuts: Sequence[int] = ()) -> GenerateResult:
        draft_s = 0.0
        if spec.method != "none":
            gap = stats_gap(stats, completions, cuts)
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
        start = self.clock()
        released = self._shutdown_live(wait=True)  # one live LLM: its memory is back before the next plan and build
        if self._baseline is None:
            self._baseline = gpu_memory(self.gpus)
        options = with_guided_backend(self.run_options) if guided else self.run_options
        effective, reason = self._fit_memory(spec, batch_size)
        llm = self._build(llm_kwargs(self.model_name, effective, options, batch_size))
        self.builds.append(BuildRecord(spec.label, self.clock() - start, effective.label, reason, released))
        self._live = _Built(llm, effective, key, options, guided)
        return self._live

    def _shutdown_live(self, wait: bool = False) -> float:
        """Shut the live LLM down; with `wait`, until its GPUs show its memory back (seconds waited).
        `LLM.shutdown()` returns when the MPI pool's shutdown does, before the executor's worker
        process that holds the memory has exited (proxy.py GenerationExecutorProxy.shutdown,
        mpi_session.py MpiPoolSession.shutdown): a build started at once would size its KV cache
        on a GPU still full, or run out of memory."""
        if self._live is None:
            return 0.0
        live, self._live = self._live, None
        live.llm.shutdown()
        del live
        release_gpu_memory()
        if not wait or self._baseline is None:
            return 0.0
        return memory_back(self._baseline, clock=self.clock, sleep=self.sleep, limit_s=self.release_timeout_s)

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
    def _collect(request: Request, future: Any, draft_len: int, stop_ids: dict[str, list[int]], end_id: int | None,
                 llm: Any) -> tuple[Completion, int]:
        """A row's Completion, and the tokens of a stop word TensorRT-LLM cut from its token_ids."""
        if isinstance(future, Completion):
            return future, 0
        try:
            output = future.result()
            cut = stop_tokens_cut(output, stop_ids, False, llm.tokenizer.decode)
            return completion_from_output(request, output, draft_len, cut, end_id), cut
        except Exception as exc:  # refused as the worker built it (RequestError), or failed running
            return Completion.failed(request.id, one_line(exc)), 0
