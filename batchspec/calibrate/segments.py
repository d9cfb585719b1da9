"""The controller on an engine that cannot switch arms between decode steps (TensorRT-LLM, where an
arm is an engine build): the shard runs in segments, one per arm, and a switch costs a build (the
engine's `switch_s`).

The engine streams a segment's rows (base.Engine.generate with `control`: TensorRT-LLM's adapter
keeps two batches submitted ahead of the rows finished) and calls the controller after every
batch of finished rows with their `Progress` (its decode steps from iteration statistics; else,
at the segment's end, its decode time spread evenly over the batch steps it took). Where the
controller returns another arm the engine submits no more rows; the rows submitted finish under
the arm they started with (one drain), and the rest of the shard continues under the new arm, a
build: a shard drains its batch once per arm, not once per fixed group of rows. An arm whose
build fails is dropped for the shard (`Controller.failed`) and its rows run under the arm before it.
"""

from __future__ import annotations

import math
from typing import Sequence

from batchspec.engine.base import Completion, Engine, GenerateResult, Progress, Request, Step, Timing
from batchspec.errors import one_line


def run_segments(engine: Engine, requests: Sequence[Request], control, batch_size: int) -> GenerateResult:
    completions: list[Completion | None] = [None] * len(requests)
    steps: list[Step] = []
    timing, caveats = Timing(), {}
    spec = control.start
    begin = 0
    while begin < len(requests):

        def local(progress: Progress):
            """The segment's progress in the shard's row indices, its steps after the shard's so far
            (called within this segment's generate: `begin`, `steps` and `timing` are its)."""
            for i in progress.done:
                completions[begin + i] = progress.completions[i]
            return control(Progress(progress.spec, [begin + i for i in progress.done], completions, {}, progress.queued,
                                    timing + progress.timing, steps + progress.steps))

        try:
            result = engine.generate(list(requests[begin:]), spec, batch_size, control=local)
        except Exception as exc:  # an arm that cannot be built: its rows run under the arm before it
            if spec.method == "none":
                raise
            spec = control.failed(spec, one_line(exc))
            continue
        if not result.completions:
            raise RuntimeError(f"{engine.name} returned no row of the {len(requests) - begin} it was given")
        for i, c in enumerate(result.completions):
            completions[begin + i] = c
        begin += len(result.completions)
        steps += result.steps or _spread(result, spec.method, batch_size)
        timing = timing + result.timing
        caveats.update(result.caveats)
        spec = control.running  # the arm the controller chose last, within the segment or before it
    return GenerateResult(completions, timing, caveats, steps)  # type: ignore[arg-type]


def _spread(result: GenerateResult, method: str, batch_size: int) -> list[Step]:
    """A segment's decode as evenly spread steps: its target steps shared by `batch_size` rows."""
    rows = min(batch_size, max(1, len(result.completions)))
    n = max(1, math.ceil(result.target_steps / rows))
    width = 1 + max((c.draft_tokens // c.target_steps for c in result.completions if c.target_steps), default=0)
    return [Step(rows, 0, width, result.decode_tokens // n, result.timing.decode_s / n, method)] * n
