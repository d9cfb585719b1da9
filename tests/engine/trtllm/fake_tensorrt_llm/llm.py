"""`LLM`: build (memory, build time), generate (in-flight batching, speculative steps),
iteration stats, shutdown. The behaviour an adapter must respect is cited to SOURCES.md, by
section name ("Stats", "Shutdown", "Stop strings", "Lengths", "Seeds", "End tokens", ...).

The executor runs lazily: it advances when a caller waits (`GenerationResult.result()`,
`generate()`, or `get_stats()` waiting for entries), one iteration at a time, with every admitted
request in the batch, on the simulated clock. That keeps tests deterministic while preserving what
matters: the executor keeps at most `max_stats_len` entries between the worker's polls (every 0.2
simulated seconds), the proxy relays them 0.2 s later, and `get_stats(timeout)` reads until no entry
has arrived for `timeout` seconds (running the executor meanwhile), then returns [] until the next
`generate_async` (SOURCES.md, "Stats").
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from . import _ngram, _sim
from .llm_args import (
    DecodingBaseConfig,
    DraftTargetDecodingConfig,
    EagleDecodingConfig,
    MTPDecodingConfig,
    NGramDecodingConfig,
    TorchLlmArgs,
)
from .sampling_params import SamplingParams

_log = logging.getLogger("tensorrt_llm")
BACKEND_ID_BASE = 1 << 20  # executor request ids differ from the LLM API's RequestOutput.request_id
POLL_S = 0.2  # the worker moves the executor's iteration stats to the proxy every 0.2 s ("Stats")
RELAY_S = 0.2  # the proxy's dispatch thread sleeps 0.2 s before relaying them ("Stats")
GLOBAL_SEED = 42  # TorchSampler's one generator ("Seeds")

# Simulated iteration cost (milliseconds on the simulated clock; fixtures, not measurements).
BASE_MS, PER_TOKEN_MS, PER_CONTEXT_MS = 8.0, 0.02, 0.5
DRAFT_MODEL_MS_PER_TOKEN, EAGLE_MS_PER_TOKEN, NGRAM_MS = 1.5, 0.6, 0.2


# ---- results (RESULT in SOURCES.md) ----------------------------------------------------------------


class RequestError(RuntimeError):
    """tensorrt_llm.executor.utils.RequestError: a request the worker refused as it built it
    (base_worker.py `_enqueue_request`), raised by its result() ("Lengths")."""


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: Optional[float] = None
    logprobs: list = field(default_factory=list)
    finish_reason: Optional[str] = None  # 'stop' | 'length' | 'timeout' | 'cancelled' | None
    stop_reason: Optional[Any] = None  # the stop string or stop token id that ended it


@dataclass
class RequestOutput:
    request_id: int
    prompt: Optional[str]
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    decoding_iter: int = 0  # GenerationResultBase.decoding_iter: iterations the request took part in


class _ResponseQueue:
    """GenerationResultBase.queue: the proxy's dispatch thread puts a request's responses there and
    result() takes them ("Results"). A non-streaming request gets one, when it finishes (or its
    refusal, at once)."""

    def __init__(self, llm: "LLM", req: "_Req") -> None:
        self._llm, self._req = llm, req

    def empty(self) -> bool:
        now = _sim.STATE.clock()
        self._llm._catch_up(now)
        return self._req.refused is None and not (self._req.finished and self._req.finished_at <= now)


class GenerationResult:
    """What `generate_async` returns; `result()` waits (here: runs the executor, then moves the
    clock to when the request finished) until done."""

    def __init__(self, llm: "LLM", req: "_Req") -> None:
        self._llm, self._req = llm, req
        self.queue = _ResponseQueue(llm, req)

    @property
    def done(self) -> bool:
        return self._req.finished

    def result(self, timeout: Optional[float] = None) -> RequestOutput:
        if self._req.refused is not None:
            raise RequestError(self._req.refused)
        while not self._req.finished:
            self._llm._step()
        clock = _sim.STATE.clock
        clock.advance(self._req.finished_at - clock())
        return self._req.output()


@dataclass
class _Req:
    id: int
    prompt: Optional[str]
    prompt_ids: list[int]
    params: SamplingParams
    tokenizer: Any
    max_new_tokens: int = 0  # max_tokens as the worker deduced it ("Lengths")
    refused: Optional[str] = None  # why the worker refused it as it built it
    backend_id: int = -1  # the executor's request id (refused requests get none)
    out: list[int] = field(default_factory=list)  # every token the sampler added, end and stop tokens included
    decoding_iter: int = 0
    in_context: bool = True
    finished: bool = False
    finished_at: float = 0.0  # the end of the iteration it finished in
    finish: Optional[str] = None  # the executor's FinishReason: END_ID | STOP_WORDS | LENGTH

    def output(self) -> RequestOutput:
        """GenerationResultBase._handle_sequence then DetokenizedGenerationResultBase._handle_response
        ("Stop strings", "End tokens"): a stop word the sampler matched is cut from token_ids (not
        from the stats); a stop string found only in the decoded text cuts the text, and token_ids
        run on."""
        p, ids = self.params, list(self.out)
        reason, stop_reason = {"END_ID": "stop", "STOP_WORDS": "stop", "LENGTH": "length", None: None}[self.finish], None
        if self.finish == "END_ID" and not _sim.STATE.end_token_in_output:
            ids = ids[:-1]
        if self.finish == "STOP_WORDS":
            for why, words in p._get_stop_reasons_and_words():
                if ids[-len(words):] == words:
                    stop_reason = why
                    if not p.include_stop_str_in_output:
                        ids = ids[:-len(words)]
                    break
        text = self.tokenizer.decode(ids) if self.tokenizer is not None and p.detokenize else ""
        if reason in ("stop", "length"):
            for why in p.stops:
                at = text.find(why)
                if at >= 0:
                    text = text[:at + (len(why) if p.include_stop_str_in_output else 0)]
                    reason, stop_reason = "stop", why
                    break
        completion = CompletionOutput(0, text, ids, finish_reason=reason, stop_reason=stop_reason)
        return RequestOutput(self.id, self.prompt, list(self.prompt_ids), [completion], self.finished, self.decoding_iter)


# ---- the LLM -----------------------------------------------------------------------------------------


class LLM:
    """tensorrt_llm.LLM on the PyTorch backend, over the simulated GPU of this process."""

    def __init__(self, model: str, tokenizer: Any = None, **kwargs: Any) -> None:
        self.args = TorchLlmArgs(model=str(model), tokenizer=tokenizer, **kwargs)  # unknown keys raise
        # BaseLLM._try_load_tokenizer: none with skip_tokenizer_init ("Tokenizer")
        self.tokenizer = None if self.args.skip_tokenizer_init else _sim.FakeTokenizer()
        self._target = _sim.find_model(self.args.model)
        spec = self.args.speculative_config
        self._draft = None
        if isinstance(spec, (DraftTargetDecodingConfig, EagleDecodingConfig)):
            self._draft = _sim.find_model(str(spec.speculative_model))
        if isinstance(spec, MTPDecodingConfig) and self._target.mtp_layers < spec.num_nextn_predict_layers:
            raise ValueError(f"MTP needs {spec.num_nextn_predict_layers} MTP modules; {self.args.model} has {self._target.mtp_layers}")
        self.max_seq_len = self.args.max_seq_len or self._target.max_position_embeddings
        self.guided_decoder = _guided_decoder(self.args)
        self.guided: list[Any] = []  # the GuidedDecodingParams of each request, in order (None: unguided)
        self._claim_memory()
        _sim.STATE.clock.advance(_sim.STATE.build_seconds)
        _sim.STATE.builds += 1
        _sim.STATE.live.add(id(self))
        _sim.STATE.max_live = max(_sim.STATE.max_live, len(_sim.STATE.live))
        _sim.STATE.built.append(self.args)
        self._ngram = None
        if isinstance(spec, NGramDecodingConfig):  # NG: one NGramPoolManager per LLM
            self._ngram = _ngram.NGramPoolManager(spec.max_total_draft_tokens, spec.max_matching_ngram_size,
                                                  spec.is_keep_all, spec.is_use_oldest, spec.is_public_pool)
        self._queue: list[_Req] = []
        self._active: list[_Req] = []
        self._t = _sim.STATE.clock()  # the executor's own time: the end of its last iteration
        self._poll0 = self._t  # the worker's polls of the executor's stats: every POLL_S from here
        self._stats: list[tuple[int, dict]] = []  # (the poll that takes it, entry): py_executor.py self.stats
        self._relayed: list[tuple[float, dict]] = []  # (when it reaches IterationResult's queue, entry)
        self._stats_started = False  # the IterationResult singleton exists (first generate_async)
        self._stats_done = False  # ... and has latched (get_results timed out)
        self._generator = random.Random(GLOBAL_SEED)  # TorchSampler.get_generator: one for every request
        self._iter = 0
        self._next_id = 0
        self._next_backend_id = 0
        self._shutdown = False

    def _claim_memory(self) -> None:
        """On each of the tensor_parallel_size x pipeline_parallel_size GPUs: its share of the
        weights, then free_gpu_memory_fraction of what is still free for the KV cache, held until
        shutdown(). A world larger than the GPUs this process sees, or a KV budget below one
        sequence of max_seq_len, is an error."""
        world, gpus, me = self.args.world_size, _sim.STATE.gpus, id(self)
        if world > len(gpus):
            raise RuntimeError(f"tensor_parallel_size x pipeline_parallel_size = {world} GPUs, but this process sees {len(gpus)}")
        weights = (self._target.weight_bytes + (self._draft.weight_bytes if self._draft else 0)) // world
        per_token = (self._target.kv_bytes_per_token + (self._draft.kv_bytes_per_token if self._draft else 0)) // world
        self.gpus = gpus[:world]
        try:
            for gpu in self.gpus:
                gpu.allocate(me, "weights", weights)
                kv_budget = int(self.args.kv_cache_config.free_gpu_memory_fraction * gpu.mem_get_info()[0])
                if kv_budget < per_token * self.max_seq_len:
                    raise RuntimeError(
                        f"The KV cache budget ({kv_budget / _sim.GIB:.2f} GiB) cannot hold one sequence of max_seq_len "
                        f"{self.max_seq_len} ({per_token * self.max_seq_len / _sim.GIB:.2f} GiB); free GPU memory or lower max_seq_len"
                    )
                gpu.allocate(me, "kv cache", kv_budget)
        except Exception:
            for gpu in self.gpus:
                gpu.release(me)
            raise
        self.kv_cache_bytes = kv_budget

    # -- requests ----------------------------------------------------------------------------------

    def generate_async(self, inputs: Any, sampling_params: Optional[SamplingParams] = None, **_: Any) -> GenerationResult:
        if self._shutdown:
            raise RuntimeError("LLM is shutting down")
        params = sampling_params or SamplingParams()
        if params.end_id is None:  # BaseLLM._prepare_sampling_params ("Tokenizer")
            if self.tokenizer is None:
                raise ValueError("tokenizer is required to reset end_id if it is None, or you can explicitly specify "
                                 "the end_id for sampling_params")
            params._setup(self.tokenizer)
        if isinstance(inputs, str):  # LLM: text is tokenized with add_special_tokens (BOS)
            if self.tokenizer is None:
                raise ValueError("a text prompt needs the tokenizer; skip_tokenizer_init is set")
            prompt, ids = inputs, self.tokenizer.encode(inputs, add_special_tokens=params.add_special_tokens)
        elif isinstance(inputs, (list, tuple)) and all(isinstance(t, int) for t in inputs):
            prompt, ids = None, list(inputs)  # token ids are taken as given
        else:
            raise TypeError(f"The inputs must be type str or list of int, but got {type(inputs)}")
        if not ids:
            raise ValueError("The prompt must not be empty")
        max_num_tokens = self.args.max_num_tokens
        if not self.args.enable_chunked_prefill and max_num_tokens and len(ids) > max_num_tokens:  # _check_arguments
            raise ValueError(f"The sum of prompt length ({float(len(ids))}), query length (0) should not exceed "
                             f"max_num_tokens ({max_num_tokens})")
        if params.guided_decoding is not None:
            params.guided_decoding._validate()
        self.guided.append(params.guided_decoding)
        req = _Req(self._next_id, prompt, ids, params, self.tokenizer)
        self._next_id += 1
        self._stats_started, self._stats_done = True, False  # executor._maybe_initialize_iteration_results: mark_undone
        try:  # the worker builds the executor request (base_worker.py _enqueue_request)
            req.max_new_tokens = self._deduce_max_tokens(len(ids), params.max_tokens)
        except ValueError as exc:
            req.refused = str(exc)
            return GenerationResult(self, req)
        req.backend_id = BACKEND_ID_BASE + self._next_backend_id  # only requests the executor took get an id
        self._next_backend_id += 1
        now = _sim.STATE.clock()
        self._catch_up(now)
        if not (self._queue or self._active):
            self._t = max(self._t, now)  # an idle executor picks it up now
        self._queue.append(req)
        return GenerationResult(self, req)

    def _deduce_max_tokens(self, prompt_len: int, max_tokens: Optional[int]) -> int:
        """base_worker.py `_deduce_max_tokens` ("Lengths"): max_seq_len minus the prompt is the most
        a request may generate; more is capped to it with a warning; nothing left is refused."""
        default = self.max_seq_len - prompt_len
        if default <= 0:
            raise ValueError(f"`default_max_tokens` ({default}) must be greater than 0, `default_max_tokens` ({default}) = "
                             f"max_seq_len ({self.max_seq_len}) - `splited_prompt_len` ({prompt_len}) - `query_token_len` (0)")
        if max_tokens is None:
            return default
        if max_tokens > default:
            _log.warning("User-specified `max_tokens` (%d) is greater than deduced `default_max_tokens` (%d), using "
                         "default_max_tokens instead.", max_tokens, default)
            return default
        if max_tokens <= 0:
            raise ValueError(f"`max_tokens` ({max_tokens}) must be greater than 0")
        return max_tokens

    def generate(self, inputs: Sequence[Any], sampling_params: Any = None, **_: Any) -> list[RequestOutput]:
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(inputs)
        futures = [self.generate_async(x, p) for x, p in zip(inputs, params)]
        return [f.result() for f in futures]

    def get_stats(self, timeout: float = 2.0) -> list[dict]:
        """IterationResult.get_results ("Stats"): read entries until none has arrived for `timeout`
        seconds (the executor runs meanwhile; an entry reaches this queue at the worker's next
        poll, every POLL_S, plus RELAY_S), then latch: [] until the next generate_async. Nothing
        before the first generate_async."""
        if self._shutdown:
            raise AttributeError("'NoneType' object has no attribute 'get_stats'")  # BaseLLM: _executor is None
        if not self._stats_started:
            return []
        clock, results = _sim.STATE.clock, []
        last = clock()
        while not self._stats_done:
            now = clock()
            self._catch_up(now)
            self._poll(now)
            here = [e for at, e in self._relayed if at <= now]
            if here:
                results.append(here[0])
                self._relayed = [(at, e) for at, e in self._relayed if e is not here[0]]
                last = now
                continue
            deadline = last + timeout
            if (self._queue or self._active) and self._t <= deadline:
                self._step()  # the executor runs while the caller waits
                continue
            coming = [at for at, _ in self._relayed] + [self._poll_time(n) + RELAY_S for n, _ in self._stats]
            if coming and min(coming) <= deadline:
                clock.advance(min(coming) - now)
                continue
            clock.advance(deadline - now)
            self._stats_done = True
        return results

    def _poll_time(self, n: int) -> float:
        return self._poll0 + n * POLL_S

    def _poll(self, now: float) -> None:
        """The worker's polls of the executor's stats up to `now`; each reaches the queue RELAY_S later."""
        taken = [(n, e) for n, e in self._stats if self._poll_time(n) <= now]
        self._stats = [(n, e) for n, e in self._stats if self._poll_time(n) > now]
        self._relayed += [(self._poll_time(n) + RELAY_S, e) for n, e in taken]

    def _catch_up(self, now: float) -> None:
        """Run the iterations the executor started before `now` (it runs on its own, caller or not)."""
        while (self._queue or self._active) and self._t < now and not self._shutdown:
            self._step()

    def shutdown(self) -> None:
        """BaseLLM.shutdown ("Shutdown"): the executor and the MPI pool are shut down, and this
        returns; the worker process that holds the GPU memory exits later, so each GPU shows it
        free only after `release_queries` more device queries. Stats not read are gone."""
        if not self._shutdown:
            self._shutdown = True
            for gpu in self.gpus:
                gpu.release_later(id(self), _sim.STATE.release_queries)
            _sim.STATE.live.discard(id(self))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    # -- the executor ------------------------------------------------------------------------------

    @staticmethod
    def _request_stat(req: _Req) -> dict:
        """PYX _populate_req_stats for an active or just finished request: numGeneratedTokens is
        max_beam_num_tokens - orig_prompt_len, every token the sampler added (the end token and
        stop words included: "End tokens", "Stop strings"); the id is the executor's request id,
        not RequestOutput's."""
        stage = "GENERATION_COMPLETE" if req.finished else "GENERATION_IN_PROGRESS"
        return {"id": req.backend_id, "stage": stage, "contextPrefillPosition": len(req.prompt_ids),
                "numGeneratedTokens": len(req.out), "avgNumDecodedTokensPerIter": 0, "scheduled": True, "paused": False}

    @property
    def _spec(self) -> Optional[DecodingBaseConfig]:
        return self.args.speculative_config

    def _forced_greedy(self) -> bool:
        """1.2: non-greedy sampling on one-model speculative paths needs allow_advanced_sampling
        (L12 DecodingBaseConfig.allow_advanced_sampling); without it the request decodes greedily."""
        spec = self._spec
        return spec is not None and spec.one_model and not spec.allow_advanced_sampling

    def _next_token(self, req: _Req, context: list[int]) -> int:
        """Greedy, or drawn from the sampler's one generator in batch order: 1.2's TorchSampler
        ignores a request's seed ("Seeds")."""
        p, first = req.params, not req.out
        if p.greedy or self._forced_greedy():
            return _sim.greedy(context, allow_eos=not first)
        top_p = p.top_p if p.top_p is not None else 1.0
        return _sim.sample(context, float(p.temperature), top_p, self._generator, allow_eos=not first)

    def _draft_len(self) -> int:
        """The drafts each generation request carries this iteration (the target is padded to them).
        A two-model path asks its drafter (PYX `_prepare_and_schedule_batch` 67,657, with
        len(active_requests); DR): none while max_concurrency is set and min(active, max_batch_size,
        max_num_tokens // (1 + max_draft_len)) exceeds it (`should_use_spec_decode`); else the
        draft_len_schedule's length at the largest threshold <= active (0: none this iteration),
        which the NGram pool takes (NG `update_max_total_draft_tokens`), padded to it (DR
        `pad_draft_tokens_for_cuda_graph`: with a schedule, to the current length); max_draft_len
        without either. One-model paths have no drafter in 1.2: max_draft_len always."""
        spec = self._spec
        if spec is None:
            return 0
        if spec.one_model:
            return spec.max_draft_len
        active = len(self._active)
        if spec.max_concurrency is not None:
            cap = self.args.max_num_tokens // (1 + spec.max_draft_len)
            if min(active, self.args.max_batch_size, cap) > spec.max_concurrency:
                return 0
        k = spec.max_draft_len
        if spec.draft_len_schedule:
            k = next((n for batch, n in sorted(spec.draft_len_schedule.items(), reverse=True) if batch <= active), 0)
        if self._ngram is not None:
            self._ngram.k = k
        return k

    def _proposal(self, req: _Req, k: int) -> list[int]:
        spec, history = self._spec, req.prompt_ids + req.out
        if self._ngram is not None:  # NG NGramDrafter.prepare_draft_tokens: prompt + output so far
            # a match the pool kept at a longer length is cut to this iteration's (main's
            # test_draft_len_schedule.py: an NGram draft never exceeds the drafter's current length)
            return self._ngram.get_draft_tokens(history, req.backend_id, len(req.prompt_ids) + req.max_new_tokens)[:k]
        agree = self._target.mtp_agree if isinstance(spec, MTPDecodingConfig) else self._draft.agree
        drafts: list[int] = []
        for j in range(k):
            drafts.append(_sim.draft_token(history + drafts, agree, salt=j))
        return drafts

    def _commit(self, req: _Req, token: int) -> bool:
        """TorchSampler: add the token, then `_handle_stop_criteria` ("End tokens", "Stop strings"):
        the end token, then the length, then stop words as token suffixes of prompt + output.
        Returns False when the request finished with it."""
        p = req.params
        req.out.append(token)
        if token == p.end_id and not p.ignore_eos:
            req.finished, req.finish = True, "END_ID"
        elif len(req.out) >= req.max_new_tokens or len(req.prompt_ids) + len(req.out) >= self.max_seq_len:
            req.finished, req.finish = True, "LENGTH"
        else:
            tokens = req.prompt_ids + req.out
            if any(len(w) <= len(tokens) and tokens[-len(w):] == w for w in p._get_stop_words()):
                req.finished, req.finish = True, "STOP_WORDS"
        return not req.finished

    def _step(self) -> None:
        """One iteration: admit queued requests, run context and generation requests, record stats."""
        assert not self._shutdown, "LLM is shut down"
        while self._queue and len(self._active) < self.args.max_batch_size:
            self._active.append(self._queue.pop(0))
        context = [r for r in self._active if r.in_context]
        generation = [r for r in self._active if not r.in_context]
        for req in context:
            req.in_context = False
            req.decoding_iter += 1
            self._commit(req, self._next_token(req, req.prompt_ids + req.out))
        drafted = accepted = with_drafts = 0
        k = self._draft_len() if generation else 0
        for req in generation:
            req.decoding_iter += 1
            drafts = self._proposal(req, k) if k else []
            if drafts:  # PYX: numDraftTokens counts the drafts each request really carried
                drafted += len(drafts)
                with_drafts += 1
            for d in drafts + [None]:
                token = self._next_token(req, req.prompt_ids + req.out)
                if not self._commit(req, token):
                    break
                if d is None or token != d:
                    break
                accepted += 1
        self._record(context, generation, k, drafted, accepted, with_drafts)
        for req in context + generation:  # NG update_resources: a finished request's private pool goes
            if req.finished and self._ngram is not None:
                self._ngram.release(req.backend_id)
        self._active = [r for r in self._active if not r.finished]

    def _record(self, context, generation, k, drafted, accepted, with_drafts) -> None:
        spec = self._spec
        tokens = sum(len(r.prompt_ids) for r in context) + len(generation) * (1 + k)
        draft_ms = 0.0
        if spec is not None and drafted:
            if isinstance(spec, NGramDecodingConfig):
                draft_ms = NGRAM_MS
            elif spec.one_model:
                draft_ms = EAGLE_MS_PER_TOKEN * k
            else:
                draft_ms = DRAFT_MODEL_MS_PER_TOKEN * k
        iter_ms = BASE_MS + PER_TOKEN_MS * tokens + PER_CONTEXT_MS * len(context) + draft_ms
        self._t += iter_ms / 1000
        for req in context + generation:
            if req.finished and not req.finished_at:
                req.finished_at = self._t
        self._iter += 1
        if not self.args.enable_iter_perf_stats:
            return
        entry: dict[str, Any] = {  # JSON names: executor/jsonSerialization.cpp (JS in SOURCES.md)
            "iter": self._iter, "iterLatencyMS": iter_ms, "numActiveRequests": len(self._active),
            "numNewActiveRequests": len(context), "maxNumActiveRequests": self.args.max_batch_size,
            "numQueuedRequests": len(self._queue), "numCompletedRequests": sum(r.finished for r in self._active),
            # PYX _update_iter_stats: total - free of this rank's GPU (rank 0: the first of the LLM's)
            "gpuMemUsage": self.gpus[0].total_bytes - self.gpus[0].free_bytes(),
            "inflightBatchingStats": {"numScheduledRequests": len(context) + len(generation), "numContextRequests": len(context),
                                      "numGenRequests": len(generation), "numPausedRequests": 0, "numCtxTokens": 0,
                                      "microBatchId": 0, "avgNumDecodedTokensPerIter": 0},
        }
        if self.args.enable_iter_req_stats:  # PYX _populate_req_stats; the worker's serializer adds them as requestStats
            entry["requestStats"] = [self._request_stat(r) for r in self._active] + [
                {"id": r.backend_id, "stage": "QUEUED", "contextPrefillPosition": 0, "numGeneratedTokens": 0,
                 "avgNumDecodedTokensPerIter": 0, "scheduled": False, "paused": False} for r in self._queue]
        if spec is not None:
            # PYX: iterLatencyMS of specDecodingStats comes from `self.drafter.last_draft_latency_ms`,
            # "only for two-model mode": one-model drafters (Eagle3 one-model, MTP) report 0.0.
            measured_ms = 0.0 if spec.one_model else draft_ms
            entry["specDecodingStats"] = {
                "numDraftTokens": drafted, "numAcceptedTokens": accepted, "numRequestsWithDraftTokens": with_drafts,
                "acceptanceLength": (accepted + with_drafts) / with_drafts if with_drafts else 0.0,
                "iterLatencyMS": measured_ms, "draftOverhead": measured_ms / iter_ms if iter_ms > 0 else 0.0,
            }
        _sim.STATE.audit.append(entry)
        poll = math.ceil((self._t - self._poll0) / POLL_S - 1e-9)  # the worker's next poll takes it
        kept = [x for x in self._stats if x[0] == poll]
        if len(kept) > self.args.max_stats_len:  # PYX _append_iter_stats: drop the oldest, then append
            self._stats.remove(kept[0])
        self._stats.append((poll, entry))


def _guided_decoder(args: TorchLlmArgs) -> Optional[str]:
    """The guided decoder the executor builds (py_executor_creator.py `create_py_executor`, with
    interface.py's SpeculativeDecodingMode rules): none without a backend; a GuidedDecoder without
    speculation or with a separate drafter (NGram, DraftTarget, two-model Eagle3); a
    CapturableGuidedDecoder in the model engine for one-model Eagle3 and MTP. Every config class
    here is one of those, so none is refused (the source raises for any other mode)."""
    if args.guided_decoding_backend is None:
        return None
    spec = args.speculative_config
    return "CapturableGuidedDecoder" if spec is not None and spec.one_model else "GuidedDecoder"
