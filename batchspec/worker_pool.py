"""Step 3, the driver side: a run's shards handed to shard worker actors (`run_pool`), and the
actors kept loaded across runs in one driver process (`WorkerPool`).

`run_pool` hands shards to idle actors (`batchspec.workers.ShardWorker`), passes each shard key's
calibration decision on to the next shard of that key, and reports every committed shard to a
callback (the progress bar).

Faults. A worker process that dies (OOM, segfault, a killed node) is replaced by a fresh actor and
its shard retried (actors start without blocking the loop, so a replacement waits for room on a
live node while the other workers go on); a shard whose work raises an unexpected exception is
retried on the same actor. After `worker.max_attempts` tries the shard's rows are written as error
rows naming the last failure, so nothing is lost and the run still accounts for every row. A
`BatchspecError` (bad model, bad config) is not retried: it affects every shard, so the run stops
with that one line.

Start: shards go to workers as they become ready (as in Ray Data's actor pool); with
`worker.wait_for_workers_s` the pool first waits, that long at most, for every worker to load its
engine, so each starts with a shard of its own.

Reuse across runs: `WorkerPool` keeps a run's actors loaded when it ends, for the next run in the
same driver process whose engine is the same (`WorkerJob.load_key`); such a run hands its job to
those actors (`ShardWorker.adopt`) instead of loading the model again. `batchspec run` does not
use one: a command's actors stop when it ends. `WorkerPool` knows actors only as Ray handles
under a key (the worker class and `WorkerJob.load_key`).

Resources: `worker.num_cpus` may be fractional so Ray keeps CPUs for reading; on a GPU cluster
`worker.num_gpus: 1` gives each actor its own GPU. Actors are placed with Ray's SPREAD strategy, so
shards spread over the nodes of a cluster. A worker of N > 1 GPUs (a TensorRT-LLM LLM across them)
gets a placement group of one bundle of N GPUs, STRICT_PACK (`start_actor`), and a run asking for
more GPUs per worker than any node has is refused before any actor starts.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from batchspec.engine.base import SpecConfig
from batchspec.errors import BatchspecError, ConfigError, one_line
from batchspec.plan import ShardPlan
from batchspec.prior import WHY as PRIOR_WHY
from batchspec.workers import ShardOutcome, ShardTask, ShardWorker, WorkerJob, commit_failed


class WorkerPool:
    """Shard worker actors kept loaded across runs in one driver process.

    A program that runs several jobs in one process (a notebook, an orchestrator task that runs
    several dates, the test suite) passes one pool to each `pipeline.run(config, pool=pool)`: a run
    takes the pool's idle actors of its engine (`WorkerJob.load_key`, and the same worker class)
    instead of loading another, and gives back the ones that are idle and healthy when it ends.
    A run that has to start actors first stops the pool's idle actors of other engines: the new
    ones may need their CPUs, GPUs or memory, and would otherwise wait for them for ever.
    A run that fails stops every actor it held, since one may be mid-shard. Actors hold their
    engine, and its memory (GPU memory included), until `close()` or the end of a `with` block.
    """

    def __init__(self) -> None:
        self._idle: dict[tuple[type, str], list[Any]] = {}

    def take(self, key: tuple[type, str], n: int) -> list[Any]:
        held = self._idle.get(key, [])
        taken, self._idle[key] = held[:n], held[n:]
        return taken

    def give(self, key: tuple[type, str], actors: list[Any]) -> None:
        self._idle.setdefault(key, []).extend(actors)

    def stop_others(self, key: tuple[type, str]) -> None:
        """Stop the idle actors of every other engine (their resources go to a run that needs them)."""
        stop_actors([a for k, held in self._idle.items() if k != key for a in held])
        self._idle = {key: self._idle[key]} if key in self._idle else {}

    def __len__(self) -> int:
        return sum(len(a) for a in self._idle.values())

    def close(self) -> None:
        stop_actors([a for held in self._idle.values() for a in held])
        self._idle.clear()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# The placement group of each actor started in one (`start_actor`), removed when the actor stops.
_PLACEMENT: dict[Any, Any] = {}


def start_actor(actor_cls: Any, options: dict[str, Any], *args: Any) -> Any:
    """Start one shard worker actor of `actor_cls` (a Ray actor class) with Ray `options`. An
    actor of several GPUs (a TensorRT-LLM LLM across them) is placed in a placement group of one
    bundle holding them all, STRICT_PACK: its GPUs come from one node, reserved together, and the
    processes the LLM starts see them as the actor's own (Ray sets CUDA_VISIBLE_DEVICES)."""
    gpus, cpus = options.get("num_gpus") or 0, options.get("num_cpus") or 0
    if gpus <= 1:
        return actor_cls.options(**options).remote(*args)
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = placement_group([{"GPU": gpus, **({"CPU": cpus} if cpus > 0 else {})}], strategy="STRICT_PACK")
    strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True)
    actor = actor_cls.options(**{**options, "scheduling_strategy": strategy}).remote(*args)
    _PLACEMENT[actor] = group
    return actor


def check_gpus_fit(num_gpus: float) -> None:
    """Refuse, in one line, a worker of more GPUs than any node of the Ray cluster has: its actor
    would wait for ever (a placement group of one bundle never spans nodes)."""
    import ray

    if num_gpus <= 1:
        return
    most = max((n["Resources"].get("GPU", 0) for n in ray.nodes() if n.get("Alive")), default=0)
    if num_gpus > most:
        raise ConfigError(f"worker.num_gpus: {num_gpus:g} GPUs per worker, but the largest node of the Ray cluster has {most:g}; "
                          "a worker's LLM runs on one node")


def stop_actors(actors: list[Any]) -> None:
    """Stop these Ray actors now, and give back their placement groups (nothing to do once Ray is
    shut down)."""
    import ray

    if ray.is_initialized():
        for a in actors:
            ray.kill(a, no_restart=True)
            group = _PLACEMENT.pop(a, None)
            if group is not None:
                ray.util.remove_placement_group(group)


# ---- the driver side -------------------------------------------------------------------------


@dataclass
class PoolReport:
    outcomes: list[ShardOutcome]
    retries: int
    failed_shards: list[str]


def run_pool(job: WorkerJob, plans: list[ShardPlan], workers: int, on_done: Callable[[ShardOutcome], None],
             worker_cls: type[ShardWorker] = ShardWorker, pool: WorkerPool | None = None,
             seeds: Mapping[str | None, SpecConfig] | None = None, failed: frozenset[str] = frozenset()) -> PoolReport:
    """Run every shard on `workers` actors of `worker_cls` (a subclass may wrap `process`, as the
    fault tests do), taken from `pool` where it holds some of this engine, started otherwise;
    returns once each shard is committed. A shard starts under the arm its key's last shard ended
    under, else its key's arm in `seeds` (a prior run's: batchspec.prior). `failed`: shards an
    earlier run committed as error rows after every attempt failed, retried here."""
    import ray

    check_gpus_fit(job.worker.num_gpus)
    actor_cls = ray.remote(worker_cls)
    options = dict(num_cpus=job.worker.num_cpus, num_gpus=job.worker.num_gpus, max_restarts=0, max_task_retries=0,
                   scheduling_strategy="SPREAD")
    key = (worker_cls, job.load_key())
    actors: list[Any] = []  # every actor this run held, to stop (or give back) at the end
    starting: dict[Any, Any] = {}  # start() or adopt() ref -> actor not ready yet
    lost = 0  # actors whose process or node died before they were ready

    def start() -> None:
        if pool is not None:  # idle workers of other engines may hold what this one needs
            pool.stop_others(key)
        actor = start_actor(actor_cls, options, job)
        actors.append(actor)
        starting[actor.start.remote()] = actor

    idle: list[Any] = []
    key_rows = collections.Counter()
    for p in plans:
        key_rows[p.shard_key] += p.rows
    first = {p.shard_key: p.shard_id for p in reversed(plans)}  # each key's first shard: the one that trains its head (train_head)
    queue = collections.deque(ShardTask(p, horizon_rows=h, was_failed=p.shard_id in failed, key_rows=key_rows[p.shard_key],
                                        trains_head=job.train_head and first[p.shard_key] == p.shard_id)
                              for p, h in zip(plans, horizons(plans, workers)))
    decisions: dict[str | None, Any] = {}
    in_flight: dict[Any, tuple[Any, ShardTask]] = {}
    report = PoolReport([], 0, [])
    gate = time.monotonic() + job.worker.wait_for_workers_s  # no shard handed out before every first actor is ready
    kept: list[Any] = []  # idle and healthy at the end: given back to `pool`
    try:
        wanted = min(workers, len(plans))
        for actor in pool.take(key, wanted) if pool is not None else []:
            actors.append(actor)
            starting[actor.adopt.remote(job)] = actor  # a dead one fails here and is replaced like a failed start
        for _ in range(wanted - len(actors)):
            start()
        while queue or in_flight:
            held = bool(starting) and time.monotonic() < gate
            while queue and idle and not held:
                actor, task = idle.pop(), queue.popleft()
                shard_key = task.plan.shard_key  # (`key` is the pool's)
                if decisions.get(shard_key) is None and seeds and shard_key in seeds:
                    task = replace(task, prior=seeds[shard_key], prior_why=PRIOR_WHY)
                else:
                    task = replace(task, prior=decisions.get(shard_key))
                in_flight[actor.process.remote(task)] = (actor, task)
            ready, _ = ray.wait([*in_flight, *starting], num_returns=1, timeout=max(0.0, gate - time.monotonic()) if held else None)
            if not ready:  # the wait for the pool ran out: hand out shards to the workers that are ready
                continue
            if ready[0] in starting:
                actor = starting.pop(ready[0])
                try:
                    ray.get(ready[0])
                except ray.exceptions.RayActorError as exc:
                    stop_actors([actor])
                    lost += 1
                    if lost > workers * job.worker.max_attempts:
                        raise RuntimeError(f"{lost} shard workers died while starting; last: {_cause(exc)}") from None
                    start()
                except ray.exceptions.RayTaskError as exc:
                    stop_actors([actor])
                    if isinstance(exc.cause, BatchspecError):
                        raise exc.cause from None
                    raise
                else:
                    idle.append(actor)
                continue
            actor, task = in_flight.pop(ready[0])
            try:
                outcome = ray.get(ready[0])
            except ray.exceptions.RayActorError as exc:  # the process or its node died: a fresh actor takes over
                stop_actors([actor])
                start()
                _retry(job, task, queue, report, on_done, f"worker died: {_cause(exc)}")
                continue
            except ray.exceptions.RayTaskError as exc:
                if isinstance(exc.cause, BatchspecError):
                    raise exc.cause from None
                _retry(job, task, queue, report, on_done, _cause(exc))
            else:
                if outcome.decision is not None:
                    decisions[outcome.shard_key] = outcome.decision
                report.outcomes.append(outcome)
                on_done(outcome)
            idle.append(actor)
        if pool is not None:
            kept = idle
            pool.give(key, kept)
    finally:
        stop_actors([a for a in actors if not any(a is k for k in kept)])
    return report


def horizons(plans: list[ShardPlan], workers: int) -> list[int]:
    """Per shard, in plan order, its key's rows in the shards after it, over the workers that share
    them: what a worker can expect to run of the key after this shard."""
    left: dict[str | None, int] = {}
    for p in plans:
        left[p.shard_key] = left.get(p.shard_key, 0) + p.rows
    out = []
    for p in plans:
        left[p.shard_key] -= p.rows
        out.append(left[p.shard_key] // max(1, workers))
    return out


def _retry(job: WorkerJob, task: ShardTask, queue, report: PoolReport, on_done, reason: str) -> None:
    if task.attempt < job.worker.max_attempts:
        report.retries += 1
        queue.appendleft(replace(task, attempt=task.attempt + 1, failures=task.failures + (reason,)))
        return
    outcome = commit_failed(job, task.plan, reason, task.attempt)
    report.failed_shards.append(task.plan.shard_id)
    report.outcomes.append(outcome)
    on_done(outcome)


def _cause(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None) or exc
    text = str(cause).strip().splitlines()
    return one_line(f"{type(cause).__name__}: {text[-1]}" if text else type(cause).__name__)
