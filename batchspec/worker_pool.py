"""Shard worker actors kept loaded across runs in one driver process (`WorkerPool`).

It knows actors only as Ray handles under a key (the worker class and `WorkerJob.load_key`);
`batchspec.workers.run_pool` takes actors from it, adopts them, and gives them back.
"""

from __future__ import annotations

from typing import Any

from batchspec.errors import ConfigError


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
