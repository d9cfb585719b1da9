"""The controller on an engine that cannot switch arms between decode steps (TensorRT-LLM, where an
arm is an engine build): the shard is generated in chunks of rows, the controller chooses each
chunk's arm after the last, and a switch costs a build (the controller's `switch_s`).

Each chunk reaches the controller as the `Progress` of an in-flight call would: the rows it
finished, and its decode steps (the engine's, from iteration statistics; else the chunk's decode
time spread evenly over the batch steps it took). A chunk is a window's rows, and at least four
batches (a chunk drains its batch at its end). An arm whose build fails is dropped for the shard
(`Controller.failed`) and the chunk runs under the arm before it.
"""

from __future__ import annotations

import math
from typing import Sequence

from batchspec.engine.base import Completion, Engine, GenerateResult, Progress, Request, Step, Timing
from batchspec.errors import one_line


def run_chunked(engine: Engine, requests: Sequence[Request], control, batch_size: int, chunk: int) -> GenerateResult:
    completions: list[Completion | None] = [None] * len(requests)
    steps: list[Step] = []
    timing, caveats = Timing(), {}
    spec = control.start
    for begin in range(0, len(requests), chunk):
        part = list(range(begin, min(begin + chunk, len(requests))))
        try:
            result = engine.generate([requests[i] for i in part], spec, batch_size)
        except Exception as exc:  # an arm that cannot be built: the chunk runs under the arm before it
            if spec.method == "none":
                raise
            spec = control.failed(spec, one_line(exc))
            result = engine.generate([requests[i] for i in part], spec, batch_size)
        for i, c in zip(part, result.completions):
            completions[i] = c
        steps += result.steps or _spread(result, spec.method, batch_size)
        timing = timing + result.timing
        caveats.update(result.caveats)
        queued = len(requests) - part[-1] - 1
        new = control(Progress(spec, part, completions, {}, queued, timing, steps))
        spec = new or spec
    return GenerateResult(completions, timing, caveats, steps)  # type: ignore[arg-type]


def _spread(result: GenerateResult, method: str, batch_size: int) -> list[Step]:
    """A chunk's decode as evenly spread steps: its target steps shared by `batch_size` rows."""
    rows = min(batch_size, max(1, len(result.completions)))
    n = max(1, math.ceil(result.target_steps / rows))
    width = 1 + max((c.draft_tokens // c.target_steps for c in result.completions if c.target_steps), default=0)
    return [Step(rows, 0, width, result.decode_tokens // n, result.timing.decode_s / n, method)] * n
