"""Engines whose arms are builds (TensorRT-LLM; docs/calibration.md, docs/engines/trtllm.md).
Kept apart from the calibration rule: these only decide which arms a worker can afford to build
and account for what the builds cost; the arms themselves are calibrated by running
(batchspec.calibrate.measured).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from batchspec.calibrate.decision import CalibrationSettings
from batchspec.calibrate.measured import probe_arm
from batchspec.engine.base import Engine, SpecConfig


def arms_are_builds(engine: Engine) -> bool:
    """True for engines where switching arms builds a new model instance (one live per worker)."""
    return bool(getattr(engine, "arms_are_builds", False))


def plan_builds(engine: Engine, arms: Sequence[SpecConfig], settings: CalibrationSettings) -> tuple[list[SpecConfig], CalibrationSettings, str]:
    """The arms a build engine calibrates, the settings it calibrates with, and a note.

    Each arm measured is one build (model load, CUDA-graph capture), and so is every return to
    "none": so one round (none, then one probe per method), no confirmation runs (each would be
    another build), and at most `max_builds_per_worker` builds over the worker's life. Arms that
    do not fit in what is left are dropped, last methods first, and the note says so."""
    one_round = replace(settings, rounds=1, confirm=False)
    left = settings.max_builds_per_worker - len(getattr(engine, "builds", ()))
    probes = [probe_arm([a for a in arms if a.method == m]) for m in dict.fromkeys(a.method for a in arms)]
    affordable = max(0, left - 1)  # "none" is built too
    kept = probes[:affordable]
    note = ""
    if len(kept) < len(probes):
        dropped = ", ".join(a.label for a in probes[len(kept):])
        note = f"build cap: {len(getattr(engine, 'builds', ()))} of max_builds_per_worker {settings.max_builds_per_worker} builds used on this worker; not calibrated: {dropped}"
    return kept, one_round, note


@dataclass(frozen=True)
class BuildCost:
    """Builds made while a shard ran, and their seconds (calibration cost on a build engine)."""

    builds: int = 0
    seconds: float = 0.0


def build_cost(engine: Engine, since: int) -> BuildCost:
    """The builds `engine` made after its first `since` (engine.builds records, seconds each)."""
    records = list(getattr(engine, "builds", ()))[since:]
    return BuildCost(len(records), sum(r.seconds for r in records))
