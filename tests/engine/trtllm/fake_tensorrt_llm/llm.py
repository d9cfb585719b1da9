"""`LLM`: build (memory, build time), generate (in-flight batching, speculative steps),
iteration stats, shutdown. The behaviour an adapter must respect is cited to SOURCES.md.

The executor runs lazily: it advances when a caller waits on a result (`GenerationResult.result()`)
or calls `generate()`, one iteration at a time, with every admitted request in the batch. That
keeps tests deterministic while preserving what matters: iterations accumulate in the stats queue
while the caller waits, and the queue drops the oldest beyond `max_stats_len` (PYX 46,036).
"""

from __future__ import annotations

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

BACKEND_ID_BASE = 1 << 20  # executor request ids differ from the LLM API's RequestOutput.request_id

# Simulated iteration cost (milliseconds on the simulated clock; fixtures, not measurements).
BASE_MS, PER_TOKEN_MS, PER_CONTEXT_MS = 8.0, 0.02, 0.5
DRAFT_MODEL_MS_PER_TOKEN, EAGLE_MS_PER_TOKEN, NGRAM_MS = 1.5, 0.6, 0.2


# ---- results (RESULT in SOURCES.md) ----------------------------------------------------------------


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: Optional[float] = None
    logprobs: list = field(default_factory=list)
    finish_reason: Optional[str] = None  # 'stop' | 'length' | 'timeout' | 'cancelled' | None
    stop_reason: Optional[Any] = None


@dataclass
class RequestOutput:
    request_id: int
    prompt: Optional[str]
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    decoding_iter: int = 0  # GenerationResultBase.decoding_iter: iterations the request took part in


class GenerationResult:
    """What `generate_async` returns; `result()` waits (here: drives the executor) until done."""

    def __init__(self, llm: "LLM", req: "_Req") -> None:
        self._llm, self._req = llm, req

    @property
    def done(self) -> bool:
        return self._req.finished

    def result(self, timeout: Optional[float] = None) -> RequestOutput:
        while not self._req.finished:
            self._llm._step()
        return self._req.output()


@dataclass
class _Req:
    id: int
    prompt: Optional[str]
    prompt_ids: list[int]
    params: SamplingParams
    tokenizer: Any
    rng: random.Random
    out: list[int] = field(default_factory=list)
    decoding_iter: int = 0
    in_context: bool = True
    finished: bool = False
    finish_reason: Optional[str] = None
    text: str = ""

    def output(self) -> RequestOutput:
        completion = CompletionOutput(0, self.text, list(self.out), finish_reason=self.finish_reason)
        return RequestOutput(self.id, self.prompt, list(self.prompt_ids), [completion], self.finished, self.decoding_iter)


# ---- the LLM -----------------------------------------------------------------------------------------


class LLM:
    """tensorrt_llm.LLM on the PyTorch backend, over the simulated GPU of this process."""

    def __init__(self, model: str, tokenizer: Any = None, **kwargs: Any) -> None:
        self.args = TorchLlmArgs(model=str(model), tokenizer=tokenizer, **kwargs)  # unknown keys raise
        self.tokenizer = _sim.FakeTokenizer()
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
        self._stats: list[dict] = []
        self._iter = 0
        self._next_id = 0
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
                kv_budget = int(self.args.kv_cache_config.free_gpu_memory_fraction * gpu.free_bytes())
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
            raise RuntimeError("LLM is shut down")
        params = sampling_params or SamplingParams()
        if isinstance(inputs, str):  # LLM: text is tokenized with add_special_tokens (BOS)
            prompt, ids = inputs, self.tokenizer.encode(inputs, add_special_tokens=params.add_special_tokens)
        elif isinstance(inputs, (list, tuple)) and all(isinstance(t, int) for t in inputs):
            prompt, ids = None, list(inputs)  # token ids are taken as given
        else:
            raise TypeError(f"The inputs must be type str or list of int, but got {type(inputs)}")
        if not ids:
            raise ValueError("The prompt must not be empty")
        if len(ids) + params.max_tokens > self.max_seq_len:
            raise ValueError(f"The sum of prompt length ({len(ids)}) and max_tokens ({params.max_tokens}) exceeds max_seq_len ({self.max_seq_len})")
        if params.guided_decoding is not None:
            params.guided_decoding._validate()
        self.guided.append(params.guided_decoding)
        seed = params.seed if params.seed is not None else random.SystemRandom().randrange(2**31)
        req = _Req(self._next_id, prompt, ids, params, self.tokenizer, random.Random(seed))
        self._next_id += 1
        self._queue.append(req)
        return GenerationResult(self, req)

    def generate(self, inputs: Sequence[Any], sampling_params: Any = None, **_: Any) -> list[RequestOutput]:
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(inputs)
        futures = [self.generate_async(x, p) for x, p in zip(inputs, params)]
        return [f.result() for f in futures]

    def get_stats(self, timeout: float = 2.0) -> list[dict]:
        """LLM.get_stats: the iteration stats kept since the last call (drained), oldest first."""
        stats, self._stats = self._stats, []
        return stats

    def shutdown(self) -> None:
        if not self._shutdown:
            self._shutdown = True
            for gpu in self.gpus:
                gpu.release(id(self))
            _sim.STATE.live.discard(id(self))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    # -- the executor ------------------------------------------------------------------------------

    @staticmethod
    def _request_stat(req: _Req) -> dict:
        """PYX _populate_req_stats for an active or just finished request: numGeneratedTokens is
        max_beam_num_tokens - orig_prompt_len; the id is the executor's request id, not RequestOutput's."""
        stage = "GENERATION_COMPLETE" if req.finished else "GENERATION_IN_PROGRESS"
        return {"id": BACKEND_ID_BASE + req.id, "stage": stage, "contextPrefillPosition": len(req.prompt_ids),
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
        p, first = req.params, not req.out
        if p.greedy or self._forced_greedy():
            return _sim.greedy(context, allow_eos=not first)
        return _sim.sample(context, float(p.temperature), p.top_p if p.top_p is not None else 1.0, req.rng, allow_eos=not first)

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
            return self._ngram.get_draft_tokens(history, req.id, len(req.prompt_ids) + req.params.max_tokens)[:k]
        agree = self._target.mtp_agree if isinstance(spec, MTPDecodingConfig) else self._draft.agree
        drafts: list[int] = []
        for j in range(k):
            drafts.append(_sim.draft_token(history + drafts, agree, salt=j))
        return drafts

    def _commit(self, req: _Req, token: int) -> bool:
        """Append one token; return False when the request finished with it."""
        p = req.params
        if token == _sim.EOS and not p.ignore_eos:
            req.finished, req.finish_reason = True, "stop"
            return False
        req.out.append(token)
        text = req.tokenizer.decode(req.out)
        for stop in p.stops:
            at = text.find(stop)
            if at >= 0:
                req.finished, req.finish_reason = True, "stop"
                req.text = text[:at] + (stop if p.include_stop_str_in_output else "")
                return False
        req.text = text
        if len(req.out) >= p.max_tokens:
            req.finished, req.finish_reason = True, "length"
            return False
        return True

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
                self._ngram.release(req.id)
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
        _sim.STATE.clock.advance(iter_ms / 1000)
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
                {"id": BACKEND_ID_BASE + r.id, "stage": "QUEUED", "contextPrefillPosition": 0, "numGeneratedTokens": 0,
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
        if len(self._stats) > self.args.max_stats_len:  # PYX _append_iter_stats: drop the oldest, then append
            self._stats.pop(0)
        self._stats.append(entry)


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
