"""Step 3, shard workers: Ray actors, one engine each for its whole life (`ShardWorker`).

Per shard a worker reads the shard's own file, OUTPUT/_shards/<shard_id>.parquet (written by
`batchspec.group`; nothing else of the input is read), turns bad rows into error rows, calibrates
and generates through `batchspec.shard.run_shard`, and commits outputs then stats
(`batchspec.write`); where every attempt failed, the shard's rows as error rows naming the last
failure (`commit_failed`). The driver side, which hands shards to these actors, is
`batchspec.worker_pool.run_pool`. Torch threads per actor are set explicitly (`torch_threads`).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from batchspec.calibrate.worker import LAST_SHARD
from batchspec.config.run import WorkerConfig
from batchspec.engine.base import NO_SPEC, Completion, SpecConfig
from batchspec.errors import one_line
from batchspec.lease import Lease
from batchspec.plan import ShardPlan
from batchspec.redact import redact_text
from batchspec.group import INTERNAL, read_shard_input, shard_ids
from batchspec.parse import ParsedRow, RowDefaults, parse_rows
from batchspec.stats import ShardStats, device_seconds
from batchspec.write import Output, output_table, stats_table


@dataclass(frozen=True)
class WorkerJob:
    """Everything a worker needs, fixed for the run (sent once to each actor)."""

    output: Output | None  # None for the Ray Data stage, which writes nothing itself
    passthrough: pa.Schema
    out_schema: pa.Schema
    engine: str
    model: str
    draft_model: str | None
    dtype: str
    device: str | None
    arms: tuple[SpecConfig, ...]
    calibrate: bool
    batch_size: int
    calibration: tuple[tuple[str, Any], ...]
    defaults: RowDefaults
    worker: WorkerConfig
    llm_options: tuple[tuple[str, Any], ...] = ()  # trtllm: what every arm is built with
    storage_options: tuple[tuple[str, Any], ...] = ()  # fsspec options for a model given as a URL
    lease: Lease | None = None  # the run's hold on OUTPUT, checked before every commit (batchspec.lease)
    train_head: bool = False  # train an EAGLE-3 head per shard key on its first rows (batchspec.heads)
    train_head_budget: float = 0.05  # its training seconds, as a share of the key's expected decode seconds
    heads_from: str | None = None  # the prior run's OUTPUT, whose heads a key without one of its own reuses

    def load_key(self) -> str:
        """What an actor loads and holds for its life: two jobs with the same key can share actors.
        The rest (output, arms, calibration settings, row defaults, fault policy) is per run."""
        w = self.worker
        return repr((self.engine, self.model, self.draft_model, self.dtype, self.device, w.num_cpus, w.num_gpus,
                     w.torch_threads, self.llm_options, self.storage_options))


@dataclass(frozen=True)
class ShardTask:
    plan: ShardPlan
    attempt: int = 1
    prior: SpecConfig | None = None  # the arm the last shard of this key ended under (on any worker), or the prior run's
    prior_why: str = LAST_SHARD  # which of the two
    failures: tuple[str, ...] = ()  # why earlier attempts failed (recorded in the stats' note)
    horizon_rows: int = 0  # the key's rows after this shard, per worker: what an engine build can be repaid over
    was_failed: bool = False  # an earlier run committed it as error rows after every attempt failed
    key_rows: int = 0  # the key's rows in the shards this run has to do, this one included
    trains_head: bool = False  # train_head: the key's first shard of the run, the one that trains its head where none is found


@dataclass
class ShardOutcome:
    """What a committed shard reports back to the driver (small: no row data)."""

    shard_id: str
    shard_key: str | None
    rows: int
    error_rows: int
    output_tokens: int
    stats: ShardStats
    decision: Any = None
    node_id: str | None = None  # the Ray node that ran it
    actor_id: str | None = None  # the worker actor that ran it


# ---- the shard's rows ------------------------------------------------------------------------


@dataclass
class ShardRows:
    table: pa.Table  # the shard's input rows, in plan order
    parsed: list[ParsedRow]


def load_shard(job: WorkerJob, plan: ShardPlan) -> ShardRows:
    table = read_shard_input(job.output, plan)
    ids = shard_ids(table)
    table = table.drop_columns(list(INTERNAL))
    return ShardRows(table, parse_rows(table, ids, job.defaults))


@dataclass
class ShardRun:
    """One shard's rows generated (not yet written): completions and settings in row order."""

    completions: list[Completion]
    specs: list[SpecConfig]
    stats: ShardStats
    decision: SpecConfig | None  # the arm the shard ended under (the key's next shard starts there)

    def output_table(self, shard_id: str, passthrough: pa.Table, schema: pa.Schema) -> pa.Table:
        return output_table(shard_id, self.completions, self.specs, passthrough, schema)


def commit(job: WorkerJob, plan: ShardPlan, rows: ShardRows, completions: list[Completion], specs: list[SpecConfig], stats: ShardStats,
           failed: str | None = None, was_failed: bool = False) -> ShardOutcome:
    """Write the shard: its rows (error rows included) counted into `stats`, outputs then stats,
    once this run still holds OUTPUT's lease. `failed`: why every attempt failed (marked for retry)."""
    errors = sum(c.finish_reason == "error" for c in completions)
    tokens = sum(c.output_tokens for c in completions)
    empty = sum(c.finish_reason != "error" and not c.text for c in completions)
    stats = replace(stats, shard_id=plan.shard_id, shard_key=plan.shard_key, rows=len(completions), error_rows=errors,
                    output_tokens=tokens, empty_rows=empty, gpus=job.worker.num_gpus, **_redacted(stats))
    stats = replace(stats, **device_seconds(stats, job.worker.num_gpus, torch_threads(job.worker)))
    passthrough = rows.table.select([n for n in job.passthrough.names if n in rows.table.column_names])
    if job.lease is not None:
        job.lease.check()
    job.output.commit_shard(plan.shard_id, output_table(plan.shard_id, completions, specs, passthrough, job.out_schema), stats_table(stats),
                            failed=failed, was_failed=was_failed)
    return ShardOutcome(plan.shard_id, plan.shard_key, len(completions), errors, tokens, stats)


def torch_threads(w: WorkerConfig) -> int:
    """The threads a worker's torch engine computes on: what a CPU worker's CPU-seconds count."""
    return w.torch_threads or max(1, math.ceil(w.num_cpus))


def _redacted(stats: ShardStats) -> dict[str, str | None]:
    """The stats' text that may quote a URL (a model given by one, an error), without its secrets."""
    return {name: redact_text(getattr(stats, name)) for name in ("model", "draft_model", "note") if getattr(stats, name)}


def commit_failed(job: WorkerJob, plan: ShardPlan, reason: str, attempts: int) -> ShardOutcome:
    """Every row of a shard that kept failing, written as an error row (nothing lost)."""
    rows = load_shard(job, plan)
    reason = f"shard failed {attempts} times: {reason}"
    completions = [Completion.failed(p.request.id, reason) for p in rows.parsed]
    stats = _unrun_stats(job, plan.shard_id, plan.shard_key, attempts=attempts, note=reason)
    return commit(job, plan, rows, completions, [NO_SPEC] * len(completions), stats, failed=reason)


def _unrun_stats(job: WorkerJob, shard_id: str, shard_key: str | None, **more: Any) -> ShardStats:
    """Stats of a shard no row of which ran on the engine: counts only, no measurements."""
    return ShardStats(shard_id=shard_id, shard_key=shard_key, rows=0, error_rows=0, engine=job.engine,
                      model=job.model, draft_model=job.draft_model, batch_size=job.batch_size,
                      prompt_format=job.defaults.prompt_format, **more)


# ---- the actor -------------------------------------------------------------------------------


class ShardWorker:
    """One engine for the actor's life; `process` runs one shard end to end and commits it."""

    def __init__(self, job: WorkerJob):
        self.job = job
        self.engine = None
        self.calibration = None  # batchspec.calibrate.WorkerState: the cost table and keys' last arms, for the actor's life
        self.found: dict[str, str] = {}  # train_head: shard key -> the local folder of its committed head, once found

    def start(self) -> str:
        """Load the engine (a ModelError here stops the run with one line)."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch

        from batchspec.engine.factory import create_engine
        from batchspec.models import loading, local_folder, require_chat_template, resolve_model

        w = self.job.worker
        torch.set_num_threads(torch_threads(w))
        opts = dict(self.job.storage_options)
        model = str(resolve_model(self.job.model, storage_options=opts)) if self.job.engine == "torch" else self.job.model
        if self.job.defaults.prompt_format == "chat":  # a URL's model is here only now (pipeline.check_prompt_format)
            require_chat_template(self.job.model, Path(model) if self.job.engine == "torch" else local_folder(model))
        draft = self.job.draft_model
        if draft and self.job.engine == "torch":
            draft = str(resolve_model(draft, storage_options=opts))
        with loading(self.job.model):  # one line for the run, not a traceback (a BatchspecError is not retried)
            self.engine = create_engine(self.job.engine, model, draft_model=draft, dtype=self.job.dtype, device=self.job.device,
                                        llm_options=dict(self.job.llm_options), suffix_tree_mb=w.suffix_tree_mb)
        return self.engine.model_name

    def adopt(self, job: WorkerJob) -> str:
        """Take a later run's job on the engine already loaded (`WorkerPool`). Only the cost table is
        kept: it belongs to the engine. The keys' last arms belong to the run (its arms and rows)."""
        assert self.engine is not None and job.load_key() == self.job.load_key(), "a pool hands an actor only a job of its own engine"
        self.job = job
        self.found = {}  # heads belong to the run's OUTPUT
        if self.calibration is not None:
            from batchspec.calibrate import WorkerState

            self.calibration = WorkerState(costs=self.calibration.costs)
        return self.engine.model_name

    def process(self, task: ShardTask) -> ShardOutcome:
        import ray

        job, plan = self.job, task.plan
        rows = load_shard(job, plan)
        done = self.generate(plan.shard_id, plan.shard_key, rows.parsed, task.prior, task.attempt, task.horizon_rows,
                             task.prior_why, trains_head=task.trains_head, key_rows=task.key_rows)
        node = ray.get_runtime_context().get_node_id()
        note = "; ".join(f"attempt {i} failed: {why}" for i, why in enumerate(task.failures, 1)) or None
        outcome = commit(job, plan, rows, done.completions, done.specs, replace(done.stats, node_id=node, note=note),
                         was_failed=task.was_failed)
        outcome.decision = done.decision
        outcome.node_id = node
        outcome.actor_id = ray.get_runtime_context().get_actor_id()
        return outcome

    def generate(self, shard_id: str, shard_key: str | None, parsed: list[ParsedRow], prior: SpecConfig | None = None,
                 attempt: int = 1, horizon_rows: int = 0, prior_why: str = LAST_SHARD, trains_head: bool = False,
                 key_rows: int = 0) -> ShardRun:
        """Calibrate and generate one shard's rows on this engine; error rows stay in place. With
        `train_head`, the key's head joins its arms where one is committed (this run's or the prior
        run's); else the shard that `trains_head` records its rows' hidden states as they decode
        and trains one after them (`_train_head`), for the key's later shards."""
        from contextlib import nullcontext

        from batchspec.calibrate import CalibrationSettings, WorkerState
        from batchspec.heads import RECORD_POSITIONS, with_head
        from batchspec.shard import ShardInput, run_shard

        job = self.job
        started = time.perf_counter()
        good = [p.request for p in parsed if p.error is None]
        result = None
        if good:
            arms = list(job.arms) if job.calibrate else [job.arms[0] if job.arms else NO_SPEC]
            head = self.key_head(shard_key)
            if head is not None:
                arms = with_head(arms, head)
            recording = head is None and trains_head and self.heads is not None
            settings = CalibrationSettings(**dict(job.calibration))
            self.calibration = self.calibration or WorkerState()
            with self.engine.recording(RECORD_POSITIONS) if recording else nullcontext() as recorded:
                result = run_shard(self.engine, ShardInput(shard_id, shard_key, good), arms, job.calibrate,
                                   job.batch_size, settings, prior, worker=self.calibration, horizon_rows=horizon_rows,
                                   prior_why=prior_why)
            stats = replace(result.stats, model=job.model, prompt_format=job.defaults.prompt_format,  # the model as configured,
                            attempts=attempt, gpu_memory_per_gpu=self.engine.gpu_memory_per_gpu())  # not its resolved path
            if recording:
                stats = self._train_head(shard_id, shard_key, recorded, stats, max(key_rows, len(good)), len(good))
            elif head is not None:
                stats = replace(stats, head=self._shown(head))
        else:
            stats = _unrun_stats(job, shard_id, shard_key, attempts=attempt, wall_s=time.perf_counter() - started)
        completions, specs = _merge(parsed, result)
        return ShardRun(completions, specs, stats, result.decision.ended if result is not None else prior)

    @property
    def heads(self):
        """The run's trained heads (batchspec.heads.HeadStore), None without `train_head` or OUTPUT."""
        job = self.job
        if not job.train_head or job.output is None:
            return None
        from batchspec.heads import HeadStore
        from batchspec.write import Output

        prior = Output(job.heads_from, job.storage_options) if job.heads_from else None
        return HeadStore(job.output, prior)

    def key_head(self, key: str | None) -> str | None:
        """The local folder of `key`'s committed head (kept once found: a key's later shards on this
        worker read nothing), None without one or without `train_head`."""
        store = self.heads
        if store is None:
            return None
        if str(key) not in self.found:
            found = store.find(key)
            if found is None:
                return None
            self.found[str(key)] = found
        return self.found[str(key)]

    def _train_head(self, shard_id: str, key: str | None, recorded: list, stats: ShardStats, key_rows: int,
                    rows: int) -> ShardStats:
        """Train `key`'s head on the shard's recorded rows within the budget (a share of the key's
        expected decode seconds: this shard's per row, times the key's rows) and commit it: from
        the job's published EAGLE-3 head where an arm runs one (`published_head`), else from
        nothing."""
        import shutil
        import tempfile

        from batchspec.heads import DRAFT_LENS, published_head, training_doc

        if not recorded:
            return stats
        expected = (stats.decode_s or 0.0) / rows * key_rows
        budget = self.job.train_head_budget * expected
        began = time.perf_counter()
        folder = tempfile.mkdtemp(prefix="batchspec-head-")
        try:
            start = published_head(self.job.arms)
            trained = self.engine.train_head(recorded, budget, DRAFT_LENS, folder, start=start)
        except Exception as exc:  # the head is an option: the shard's rows stand without it
            shutil.rmtree(folder, ignore_errors=True)
            why = f"head: not trained ({one_line(exc)})"[:300]
            return replace(stats, head_train_s=time.perf_counter() - began,
                           caveats="; ".join(filter(None, (stats.caveats, why))))
        if trained is None:
            return replace(stats, head_train_s=time.perf_counter() - began)
        if self.job.lease is not None:
            self.job.lease.check()
        doc = training_doc(key, shard_id, self.job.train_head_budget, expected, trained, start)
        committed = self.heads.commit(key, folder, doc)
        if committed != folder:  # read from OUTPUT itself from now on
            shutil.rmtree(folder, ignore_errors=True)
        self.found[str(key)] = committed
        spent = time.perf_counter() - began
        return replace(stats, head=self._shown(committed), head_train_s=spent, wall_s=(stats.wall_s or 0.0) + spent)

    def _shown(self, folder: str) -> str:
        """A head's folder as the stats show it: heads/<name> when it is this run's."""
        from batchspec.heads import relative

        return relative(self.job.output, folder)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


def _merge(parsed: list[ParsedRow], result) -> tuple[list[Completion], list[SpecConfig]]:
    """Engine completions back in row order, error rows in their places."""
    done = iter(zip(result.completions, result.row_specs)) if result is not None else iter(())
    completions, specs = [], []
    for p in parsed:
        if p.error is not None:
            completions.append(Completion.failed(p.request.id, p.error))
            specs.append(NO_SPEC)
        else:
            c, s = next(done)
            assert c.id == p.request.id, (c.id, p.request.id)
            completions.append(c)
            specs.append(s)
    assert next(done, None) is None, "run_shard returned more completions than requests"
    return completions, specs
