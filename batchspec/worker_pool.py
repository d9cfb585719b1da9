"""Shard worker actors kept loaded across runs in one driver process (`WorkerPool`).

It knows actors only as Ray handles under a key (the worker class and `WorkerJob.load_key`);
`batchspec.workers.run_pool` takes actors from it, adopts them, and gives them back.
"""

from __future__ import annotations

from typing import Any


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


def stop_actors(actors: list[Any]) -> None:
    """Stop these Ray actors now (nothing to do once Ray is shut down)."""
    import ray

    if ray.is_initialized():
        for a in actors:
            ray.kill(a, no_restart=True)
