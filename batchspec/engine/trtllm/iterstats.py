"""TensorRT-LLM's iteration statistics (`llm.get_stats()`), parsed: the speculative totals of a
call, the decode steps it ran, and each request's accepted drafts per step.

Key names are the C++ executor's JSON serialization (cpp/tensorrt_llm/executor/jsonSerialization.cpp:
IterationStats iter, iterLatencyMS, gpuMemUsage, inflightBatchingStats {numContextRequests,
numGenRequests, ...}, specDecodingStats {numDraftTokens, numAcceptedTokens,
numRequestsWithDraftTokens, acceptanceLength, iterLatencyMS, draftOverhead}; RequestStats id,
stage, contextPrefillPosition, numGeneratedTokens, scheduled, ...); the PyTorch executor fills
them in py_executor.py `_update_iter_stats` and `_populate_req_stats`, and the worker's
`_stats_serializer` adds a per-iteration "requestStats" list when enable_iter_req_stats is on.
docs/engines/trtllm.md cites the copies read. Plain Python over plain values: tested without
TensorRT-LLM.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from batchspec.engine.base import Completion, SpecConfig, Step, acceptance_rate
from batchspec.engine.trtllm.translate import drafts_per_row


def parse_entries(entries: Sequence[Any]) -> list[dict]:
    """`llm.get_stats()` entries as dicts (JSON strings in older releases, per its docstring)."""
    return [json.loads(e) if isinstance(e, str) else e for e in entries]


@dataclass
class IterationSpecStats:
    """Shard-level speculative figures summed over `llm.get_stats()` iterations. Merges with `+`."""

    iterations: int = 0
    spec_iterations: int = 0  # iterations that proposed at least one draft token
    draft_tokens: int = 0
    accepted_tokens: int = 0
    requests_with_drafts: int = 0  # summed per iteration: request-steps that speculated
    iter_latency_s: float = 0.0
    draft_latency_s: float = 0.0  # specDecodingStats.iterLatencyMS: drafting part of each step
    context_requests: int = 0  # inflightBatchingStats.numContextRequests, summed
    generation_steps: int = 0  # inflightBatchingStats.numGenRequests, summed: request-steps in decode

    @property
    def acceptance_rate(self) -> float | None:
        return acceptance_rate(self.accepted_tokens, self.draft_tokens)

    @property
    def mean_accepted_len(self) -> float | None:
        """Tokens committed per speculative request-step, bonus included (TensorRT-LLM's
        acceptanceLength, as its tests compute it: (accepted + requests) / requests)."""
        n = self.requests_with_drafts
        return (self.accepted_tokens + n) / n if n else None

    def __add__(self, other: "IterationSpecStats") -> "IterationSpecStats":
        return IterationSpecStats(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))


def stats_from_iterations(entries: Sequence[dict]) -> IterationSpecStats:
    """Sum the speculative figures of parsed `llm.get_stats()` entries."""
    stats = IterationSpecStats()
    for it in entries:
        stats.iterations += 1
        stats.iter_latency_s += float(it.get("iterLatencyMS") or 0.0) / 1000
        batching = it.get("inflightBatchingStats") or {}
        stats.context_requests += int(batching.get("numContextRequests") or 0)
        stats.generation_steps += int(batching.get("numGenRequests") or 0)
        spec = it.get("specDecodingStats") or {}
        drafted = int(spec.get("numDraftTokens") or 0)
        if drafted <= 0:
            continue
        stats.spec_iterations += 1
        stats.draft_tokens += drafted
        stats.accepted_tokens += int(spec.get("numAcceptedTokens") or 0)
        stats.requests_with_drafts += int(spec.get("numRequestsWithDraftTokens") or 0)
        stats.draft_latency_s += float(spec.get("iterLatencyMS") or 0.0) / 1000
    return stats


def stats_gap(stats: IterationSpecStats, completions: Sequence[Completion], cuts: Sequence[int] = ()) -> str | None:
    """Why the iteration stats do not account for every request of a call (None when they do):
    every request's context step and decode steps must appear in some iteration, and the accepted
    tokens summed over iterations must equal those counted per request (tokens generated -
    decoding_iter; `cuts`: stop-word tokens TensorRT-LLM cut from a row's token_ids, already in its
    count), up to one per request that stopped: an end token accepted as a draft is counted by the
    executor and, where token_ids leave it out, not by the row."""
    done = [c for c in completions if c.finish_reason != "error"]
    steps = sum(c.target_steps for c in done)
    accepted = sum(c.accepted_tokens for c in done)
    stopped = sum(c.finish_reason == "stop" for c in done)
    if stats.iterations == 0 and done:
        return "get_stats() returned no iterations"
    if stats.context_requests and stats.context_requests < len(done):
        return f"iteration stats hold {stats.context_requests} context steps for {len(done)} requests"
    if stats.generation_steps and stats.generation_steps < steps:
        return f"iteration stats hold {stats.generation_steps} of {steps} decode steps"
    if not 0 <= stats.accepted_tokens - accepted <= stopped:
        return f"iteration stats count {stats.accepted_tokens} accepted tokens, the requests {accepted}"
    return None


def apportion_drafts(completions: Sequence[Completion], total: int, draft_len: int) -> None:
    """Share the exact proposed-token total of a call (iteration stats) out over its rows, in
    proportion to each row's decode steps, within [accepted, draft_len x steps] per row: the sum is
    exact, a row's share is not (TensorRT-LLM counts proposals per iteration, not per request)."""
    rows = [c for c in completions if c.finish_reason != "error" and c.target_steps > 0]
    room = {id(c): draft_len * c.target_steps - c.accepted_tokens for c in rows}
    spare = max(total - sum(c.accepted_tokens for c in rows), 0)
    steps = sum(c.target_steps for c in rows) or 1
    share = {id(c): min(room[id(c)], spare * c.target_steps // steps) for c in rows}
    left = spare - sum(share.values())
    for c in rows:  # what rounding and the caps left over goes to rows with room, in order
        more = min(left, room[id(c)] - share[id(c)])
        share[id(c)] += more
        left -= more
    for c in rows:
        c.draft_tokens = c.accepted_tokens + share[id(c)]


def peak_gpu_memory(entries: Sequence[dict]) -> int | None:
    """The most device memory in use on the LLM's first GPU in these iterations (gpuMemUsage:
    total - free on that rank's device, py_executor.py _update_iter_stats); with tensor or
    pipeline parallelism every rank holds about as much. None when not reported."""
    seen = [int(e["gpuMemUsage"]) for e in entries if e.get("gpuMemUsage") is not None]
    return max(seen) if seen else None


@dataclass
class RequestTrace:
    """One executor request as requestStats show it: its prompt (contextPrefillPosition) and its
    numGeneratedTokens after each iteration it was scheduled in, context step first."""

    prompt: int
    counts: list[int] = field(default_factory=list)


def request_traces(entries: Sequence[dict], traces: dict[int, RequestTrace] | None = None) -> dict[int, RequestTrace]:
    """Every request that ran in these iterations, by executor request id, ids ascending (the
    executor numbers requests in the order they were enqueued); `traces`: those of the iterations
    before these, extended in place (a caller reading the stats in parts)."""
    traces = {} if traces is None else traces
    for entry in entries:
        for r in entry.get("requestStats") or ():
            if r.get("stage") == "QUEUED" or not r.get("scheduled", True):
                continue
            trace = traces.setdefault(int(r["id"]), RequestTrace(int(r.get("contextPrefillPosition") or 0)))
            trace.counts.append(int(r["numGeneratedTokens"]))
    return dict(sorted(traces.items()))


def steps_from_iterations(entries: Sequence[dict], spec: SpecConfig, last: dict[int, int] | None = None) -> list[Step]:
    """The decode steps of these iterations, for the calibration controller's cost table. An
    iteration that also ran a context (prefill) request is left out: its seconds are not a decode
    step's. `context` is the mean cache length of the step's rows before it (paged KV: each row
    reads its own), from requestStats; 0 where they are not reported. `tokens` is 1 + the drafts
    every row carried (1.2 pads them for its CUDA graphs): the arm's draft length, or where its
    file sets draft_len_schedule or max_concurrency, what they give at the iteration's active
    requests (`translate.drafts_per_row`). `last`: each request's numGeneratedTokens before these
    iterations, updated in place (a caller reading the stats in parts)."""
    last = {} if last is None else last
    steps = []
    for entry in entries:
        rows = [r for r in entry.get("requestStats") or () if r.get("stage") != "QUEUED" and r.get("scheduled", True)]
        gen = [(int(r["id"]), int(r.get("contextPrefillPosition") or 0), int(r["numGeneratedTokens"])) for r in rows
               if int(r["id"]) in last]
        batching = entry.get("inflightBatchingStats") or {}
        decode_rows = int(batching.get("numGenRequests") or 0)
        if decode_rows and not int(batching.get("numContextRequests") or 0):
            if gen:
                context = sum(prompt + last[i] - 1 for i, prompt, _ in gen) / len(gen)
                committed = sum(n - last[i] for i, _, n in gen)
            else:  # no per-request stats: the totals
                context = 0
                committed = int((entry.get("specDecodingStats") or {}).get("numAcceptedTokens") or 0) + decode_rows
            width = 1 + drafts_per_row(spec, int(entry.get("numActiveRequests") or decode_rows))
            steps.append(Step(decode_rows, round(context), width, committed, float(entry.get("iterLatencyMS") or 0.0) / 1000,
                              spec.method))
        for r in rows:
            last[int(r["id"])] = int(r["numGeneratedTokens"])
    return steps


@dataclass
class RowCount:
    """A row the executor took: its prompt length, and once it finished its completion and the
    stop-word tokens cut from its token_ids."""

    prompt: int
    completion: Completion | None = None
    cut: int = 0


def attach_request_steps(rows: Sequence[RowCount], traces: dict[int, RequestTrace]) -> list[str]:
    """Give each finished row (in submission order) its accepted drafts per step from its trace;
    the ids of the rows given none. Traces are in executor id order, which is submission order
    for the requests the executor took: a request the worker refused as it built it has no trace
    and an error row is skipped, so each row takes the next trace of its prompt length.

    A step commits accepted + 1 tokens, and numGeneratedTokens counts every token the sampler
    added, the end token and cut stop words included (sampler.py TorchSampler: add_token, then
    _handle_stop_criteria; py_executor.py _populate_req_stats). A row is given its steps only where
    its trace accounts for all of it: decoding_iter - 1 steps (its target_steps), and its tokens,
    the cut ones included, plus at most the end token."""
    pending = list(traces.values())
    at, missed = 0, []
    for row in rows:
        c = row.completion
        if c is not None and c.finish_reason == "error":
            continue
        k = next((i for i in range(at, len(pending)) if pending[i].prompt == row.prompt), None)
        if k is not None:
            at = k + 1
        if c is None or c.accepted_steps:  # still running (its trace taken), or given its steps before
            continue
        if k is None:
            missed.append(c.id)
            continue
        counts = pending[k].counts
        steps = [b - a - 1 for a, b in zip(counts, counts[1:])]
        generated = c.output_tokens + row.cut
        ends = (generated,) if c.finish_reason != "stop" else (generated, generated + 1)
        if not counts or counts[-1] not in ends or len(steps) != c.target_steps or min(steps, default=0) < 0:
            missed.append(c.id)
            continue
        c.accepted_steps = steps
        c.accepted_tokens = sum(steps)
    return missed
