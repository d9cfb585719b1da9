"""`batchspec run` as a library call: read -> plan -> group -> shard workers -> commit -> manifest
(`batchspec calibrate`'s, the same reading and calibration with nothing written, is calibrate_keys.py).

`run(config)` reads as the list of steps of docs/architecture.md "Data flow"; each step lives in
its own module (read, plan, workers, write). Everything that can be checked before work starts
is checked first, in this order, so a bad run stops with one line and writes nothing it could
mistake for done: the engine is available, the spec files are valid (batchspec.preflight, the one
preparation `batchspec calibrate` and the Ray Data stage share), OUTPUT is writable and apart
from INPUT, no other run holds OUTPUT (batchspec.lease: the run holds it until it ends), the plan
and the run's options (batchspec.identity) match any shards already committed in OUTPUT, the
input files and columns are readable.

Plan and group are one committed step (`plan_and_group`): the plan is made with Ray Data, each
shard's rows are written once under OUTPUT/_shards/, and OUTPUT/_plan.json is written last, as
the step's commit mark. A run that finds a _plan.json of the same input listing and options
takes the plan and the shard files as they are (without reading the input again); one that finds
none plans and groups from scratch. `plan_run` stops there (`batchspec run --plan-only`).

`_shards/` after `_SUCCESS`. OUTPUT/_shards/ is intermediate data, like Spark's `_temporary/` or
Ray Data's spilled blocks: a shard's input file is read only while the shard is uncommitted, and
once `_SUCCESS` is written every shard is committed, so nothing reads `_shards/` again (a rerun of
a finished OUTPUT resumes with nothing to do, and `plan_and_group` accepts a committed shard
without its input file). A complete run therefore removes `_shards/` right after writing
`_SUCCESS`; `--keep-shards` (pipeline key `keep_shards: true`) keeps it for debugging. Exactly-once
and resume do not depend on it: a crash between `_SUCCESS` and the removal leaves the files, and
the next run (a no-op over committed shards) removes them; a crash before `_SUCCESS` removes
nothing, so an unfinished run always finds its shards' inputs. `--plan-only` keeps `_shards/`:
it is what the later run reads.

Ray: inside an existing Ray session (a test fixture, `ray job submit`) the pipeline uses it; with
`ray_address` or RAY_ADDRESS set it connects to that cluster; otherwise it starts a local Ray with
`ray_num_cpus` CPUs and no dashboard.

Totals. `tokens_per_s` is this run's output tokens over the wall time of the worker step (end to
end). `speedup` compares every committed shard's decode time with what plain decoding would have
taken for the same tokens, priced by the worker's cost table from the steps the shard ran:
sum(decode_s x speedup) / sum(decode_s) (`batchspec.stats.speedup_total`, which the report shows
too); `decode_tokens_per_s` and `baseline_tokens_per_s` are those shards' goodput and plain
decoding's priced goodput, so speedup = decode_tokens_per_s / baseline_tokens_per_s.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.metadata
import logging
import platform
import signal
import threading
import time
from dataclasses import asdict, dataclass
from typing import Protocol

from batchspec import preflight
from batchspec.config.run import RunConfig
from batchspec.errors import OutputError
from batchspec.group import RowCheck, check_rows, group_shards
from batchspec.lease import Held, Lease
from batchspec.plan import Plan, RunIdentity, check_identity, check_resume, fingerprint, make_plan
from batchspec.preflight import check_engine, check_prompt_format, resolve_spec, row_defaults, run_arms, run_llm_options  # noqa: F401  (re-exported)
from batchspec.read import InputListing, list_input, open_input, passthrough_schema
from batchspec.redact import redact_strings
from batchspec.stats import OUTPUT_NAMES, ShardStats, speedup_total
from batchspec.worker_pool import WorkerPool, run_pool
from batchspec.workers import ShardOutcome, ShardWorker
from batchspec.write import Output, check_apart, output_schema, resolve_template


class RunProgress(Protocol):
    """What the CLI's progress bar hears from a run."""

    def planned(self, shards: int, rows: int, skipped: int) -> None: ...

    def shard_done(self, outcome: ShardOutcome) -> None: ...


# The share of rows that ran whose empty text a run's summary warns about (RunSummary.empty_text_warning).
EMPTY_TEXT_SHARE = 0.1


@dataclass(frozen=True)
class RunSummary:
    output: str
    rows: int
    error_rows: int
    shards: int
    shards_skipped: int  # committed by an earlier run and not recomputed
    shards_failed: int  # written as error rows after every attempt failed (a rerun retries them)
    retries: int
    output_tokens: int
    wall_s: float
    tokens_per_s: float  # end to end: this run's output tokens over the worker step's wall time
    baseline_tokens_per_s: float | None  # plain decoding's goodput, priced for the same tokens as decode_tokens_per_s
    speedup: float | None  # decode_tokens_per_s over baseline_tokens_per_s
    complete: bool
    speedup_predicted_share: float = 0.0  # share of the speedup's decode time priced by prediction, not measured
    # shards whose calibration could not measure any speculative arm (every arm failed), and why
    speculation_unmeasured: int = 0
    speculation_reason: str | None = None
    builds: int = 0  # engine builds over the run (TensorRT-LLM: one per arm switched to)
    build_s: float = 0.0
    dropped_arms: tuple[str, ...] = ()  # candidate arms left out of calibration, one line each with the reason
    prompt_format: str = "chat"  # how text prompts reached the model (RunConfig.prompt_format)
    empty_rows: int = 0  # rows that ran and returned an empty text
    prior_run: str | None = None  # the prior run each key started from, or why none (batchspec.prior)
    failed_reason: str | None = None  # the first failed shard and why, "<shard_id>: <note>"
    decode_tokens_per_s: float | None = None  # goodput of the shards with a speedup: decode tokens per decode second

    @property
    def empty_text_warning(self) -> str | None:
        """One line when EMPTY_TEXT_SHARE or more of the rows that ran came back empty: the symptom of
        a prompt format the model does not expect (an instruct model given a bare instruction ends
        its turn at once)."""
        ran = self.rows - self.error_rows
        if not ran or self.empty_rows < EMPTY_TEXT_SHARE * ran:
            return None
        other = {"chat": "raw (a base model?)", "raw": "chat (an instruct model?)"}[self.prompt_format]
        return (f"{self.empty_rows} of {ran} rows returned an empty text: a likely prompt-format mismatch "
                f"(prompt_format {self.prompt_format}; try --prompt-format {other})")


def run(config: RunConfig, *, progress: RunProgress | None = None, worker_cls: type[ShardWorker] = ShardWorker,
        pool: WorkerPool | None = None, force: bool = False) -> RunSummary:
    """One run. With `pool`, shard workers already loaded with this run's engine take its shards and
    stay loaded for the next run (`batchspec.worker_pool.WorkerPool`); without, they stop at the end.
    `force`: with `resume` false, delete a previous run's committed shards in OUTPUT (refused without)."""
    started = time.perf_counter()
    job = preflight.prepare(config)
    config, choice = job.config, job.choice
    identity, prior = job.identity(), job.prior()
    output, listing = open_output(config), input_listing(config)
    check_apart(listing, dict(config.storage_options), output)
    with Held(output) as lease:  # one writer per OUTPUT, until the run ends however it ends
        plan = plan_and_group(config, output, listing, identity, lease, force)  # 1. read  2. plan + group (or the committed plan)
        passthrough = passthrough_schema(plan.arrow_schema, OUTPUT_NAMES)
        todo, failed, skipped = pending(output, plan)
        if progress:
            progress.planned(len(plan.shards), plan.rows, skipped)

        ensure_ray(config)
        work = job.worker_job(output, passthrough, output_schema(passthrough), lease, prior.url)  # 3. shard workers: calibrate -> generate -> write
        work_started = time.perf_counter()
        report = run_pool(work, todo, config.workers, _on_done(progress), worker_cls, pool, prior.seeds, failed) if todo else None
        work_s = time.perf_counter() - work_started

        stats = output.read_stats(_committed_in_order(output, plan))  # 4. commit: every shard accounted for
        summary = summarize(output.url, plan, stats, report, skipped, work_s, time.perf_counter() - started, choice.dropped,
                            config.prompt_format, prior.note, output.failed())
        if summary.complete and not summary.shards_failed:
            if report is not None or output.read_text("_SUCCESS") is None:  # 5. manifest (a rerun with nothing to do keeps it)
                lease.check()
                write_manifest(output, config, plan, summary)
            if not config.keep_shards:  # 6. _shards/ is intermediate: removed once _SUCCESS is there
                output.clear_shard_inputs()
    return summary


def ensure_ray(config: RunConfig) -> None:
    import ray

    if ray.is_initialized():
        return
    quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
    term = signal.getsignal(signal.SIGTERM)  # the process's own (the CLI's): Ray's core replaces it with a stack dump
    if config.ray_address:
        ray.init(address=config.ray_address, **quiet)
    else:
        # address="local": start Ray in this process even when a head (`make ray-head`) runs on
        # this machine; plain ray.init() would join that head and refuse num_cpus.
        ray.init(address="local", num_cpus=config.ray_num_cpus, include_dashboard=False, **quiet)
    if callable(term) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, term)
    import ray.data  # configures Ray Data's loggers on import; quiet them afterwards

    logging.getLogger("ray.data").setLevel(logging.ERROR)  # our progress bar is the one to watch
    ray.data.DataContext.get_current().enable_progress_bars = False


@dataclass(frozen=True)
class PlannedRun:
    """What `batchspec run --plan-only` reports: the plan, and the rows that will fail as parsed."""

    plan: Plan
    rows: RowCheck


def plan_run(config: RunConfig, force: bool = False) -> PlannedRun:
    """`batchspec run --plan-only`: check the config, then plan and group, and parse every row as a
    worker will (the rows that will fail); no model is loaded."""
    job = preflight.prepare(config)
    config, identity = job.config, job.identity()
    output, listing = open_output(config), input_listing(config)
    check_apart(listing, dict(config.storage_options), output)
    with Held(output) as lease:
        plan = plan_and_group(config, output, listing, identity, lease, force)
    return PlannedRun(plan, check_rows(output, plan, job.defaults, skip=output.committed()))


def open_output(config: RunConfig) -> Output:
    output = Output(resolve_template(config.output, config.date()), tuple(config.storage_options))
    output.check_writable()
    return output


def input_listing(config: RunConfig) -> InputListing:
    return list_input(resolve_template(config.input, config.date()), dict(config.storage_options))


def plan_and_group(config: RunConfig, output: Output, listing: InputListing, identity: RunIdentity, lease: Lease,
                   force: bool = False) -> Plan:
    """The committed plan of OUTPUT if it is this input's and options', else a new plan and group.
    A run with other options (`identity`) is refused where shards are committed, and bound to the
    plan where none is; `resume` false deletes a previous run, its committed shards only with `force`."""
    committed = output.committed()
    if not config.resume:
        if committed and not force:
            raise OutputError(f"OUTPUT {output.url} holds {_previous_run(output, committed)}; --no-resume deletes it: "
                              "add --force to delete it and start over, or use another OUTPUT")
        lease.check()
        output.clear()
        committed = set()
    start_over = f"--no-resume --force (deleting its {len(committed)} committed shard(s))" if committed else "--no-resume"
    text = output.read_text("_plan.json")
    existing = Plan.from_json(text) if text else None
    check_resume(existing, fingerprint(listing.files, config.shard_by, config.shard_size), start_over)
    if existing is not None:
        check_identity(existing, identity, len(committed), start_over)
        have = output.shard_inputs() | committed
        missing = [s.shard_id for s in existing.shards if s.shard_id not in have]
        if missing:
            raise OutputError(f"OUTPUT {output.url}: {len(missing)} shard file(s) under _shards/ are missing (first {missing[0]}); use {start_over}")
        if existing.identity != identity:  # nothing committed (or a plan from before identities): bind it
            existing = dataclasses.replace(existing, identity=identity)
            lease.check()
            output.put(output.path("_plan.json"), existing.to_json().encode())
        return existing
    if committed:
        raise OutputError(f"OUTPUT {output.url} holds shard files but no _plan.json; use a new OUTPUT or {start_over}")
    opts = dict(config.storage_options)
    source = open_input(listing, opts, config.shard_by)
    passthrough_schema(source.schema, OUTPUT_NAMES)  # a clashing column stops the run before any work
    ensure_ray(config)
    lease.check()
    output.clear_shard_inputs()  # a grouping that stopped half way left files of no plan
    plan = dataclasses.replace(make_plan(source, config.shard_by, config.shard_size), identity=identity)
    group_shards(source, plan, output)
    lease.check()
    output.put(output.path("_plan.json"), plan.to_json().encode())
    return plan


def _previous_run(output: Output, committed: set[str]) -> str:
    if output.read_text("_SUCCESS") is not None:
        return f"a finished run ({len(committed)} committed shard(s), _SUCCESS)"
    return f"an unfinished run with {len(committed)} committed shard(s)"


def pending(output: Output, plan: Plan) -> tuple[list, frozenset[str], int]:
    """The shards still to run (those an earlier run committed as failed among them), the failed
    ones, and how many are committed already and skipped."""
    committed, failed = output.committed(), frozenset(output.failed())
    todo = [s for s in plan.shards if s.shard_id not in committed or s.shard_id in failed]
    return todo, failed, len(plan.shards) - len(todo)


def _on_done(progress: RunProgress | None):
    def done(outcome: ShardOutcome) -> None:
        if progress:
            progress.shard_done(outcome)  # an exception here stops the run, as a crash of the job would

    return done


def _committed_in_order(output: Output, plan: Plan) -> list[str]:
    committed = output.committed()
    missing = [s.shard_id for s in plan.shards if s.shard_id not in committed]
    if missing:
        raise OutputError(f"OUTPUT {output.url}: {len(missing)} shard(s) not committed (first {missing[0]}); rerun to resume")
    return [s.shard_id for s in plan.shards]


def summarize(url: str, plan: Plan, stats: list[ShardStats], report, skipped: int, work_s: float, wall_s: float,
              dropped_arms: tuple[str, ...] = (), prompt_format: str = "chat", prior_run: str | None = None,
              failed: set[str] = frozenset()) -> RunSummary:
    rows = sum(s.rows for s in stats)
    first_failed = next((s for s in stats if s.shard_id in failed), None)
    new_ids = {o.shard_id for o in report.outcomes} if report else set()
    new_tokens = sum(s.output_tokens for s in stats if s.shard_id in new_ids)
    total = speedup_total(stats)
    unmeasured = [s for s in stats if s.speculation_unmeasured]
    return RunSummary(
        output=url,
        rows=rows,
        error_rows=sum(s.error_rows for s in stats),
        shards=len(stats),
        shards_skipped=skipped,
        shards_failed=len(failed),
        failed_reason=f"{first_failed.shard_id}: {first_failed.note}" if first_failed else None,
        retries=report.retries if report else 0,
        output_tokens=sum(s.output_tokens for s in stats),
        wall_s=wall_s,
        tokens_per_s=new_tokens / work_s if work_s > 0 and new_tokens else 0.0,
        baseline_tokens_per_s=total.baseline_tokens_per_s,
        speedup=total.speedup,
        speedup_predicted_share=total.predicted_share,
        complete=rows == plan.rows and len(stats) == len(plan.shards),
        speculation_unmeasured=len(unmeasured),
        speculation_reason=f"{unmeasured[0].shard_id}: {unmeasured[0].speculation_unmeasured}" if unmeasured else None,
        builds=sum(s.builds for s in stats),
        build_s=sum(s.build_s for s in stats),
        dropped_arms=tuple(dropped_arms),
        prompt_format=prompt_format,
        empty_rows=sum(s.empty_rows for s in stats),
        prior_run=prior_run,
        decode_tokens_per_s=total.tokens_per_s,
    )


def write_manifest(output: Output, config: RunConfig, plan: Plan, summary: RunSummary) -> None:
    manifest = {
        "config": config.to_doc(),
        "versions": _versions(),
        "plan_fingerprint": plan.fingerprint,
        "run_identity": asdict(plan.identity) if plan.identity else None,
        "input": plan.input_url,
        "totals": asdict(summary),
        "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    output.put_json("_manifest.json", redact_strings(manifest))
    output.put(output.path("_SUCCESS"), b"")


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("batchspec", "ray", "torch", "transformers", "pyarrow", "fsspec"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out
