"""The records a run writes and reads back: output rows, shard stats rows, calibration arms.

Each is declared here once; the Parquet schemas of OUTPUT/outputs and OUTPUT/stats (DESIGN.md
"Output layout") are defined beside them, and write.py, report/ and the CLI read them from here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pyarrow as pa

from batchspec.engine.base import GenerateResult

OUTPUT_FIELDS = (
    pa.field("id", pa.string()),
    pa.field("shard_id", pa.string()),
    pa.field("text", pa.string()),
    pa.field("prompt_tokens", pa.int64()),
    pa.field("output_tokens", pa.int64()),
    pa.field("finish_reason", pa.string()),
    pa.field("error", pa.string()),
    pa.field("spec_method", pa.string()),
    pa.field("draft_len", pa.int64()),
    pa.field("draft_tokens", pa.int64()),
    pa.field("accepted_tokens", pa.int64()),
    pa.field("target_steps", pa.int64()),
)
OUTPUT_NAMES = tuple(f.name for f in OUTPUT_FIELDS)

F64, I64, STR = pa.float64(), pa.int64(), pa.string()
# One calibrated arm (batchspec.calibrate.ArmResult.to_struct()).
CANDIDATE_TYPE = pa.struct([
    ("label", STR), ("method", STR), ("draft_len", I64), ("tokens_per_s", F64), ("speedup", F64), ("predicted_tokens_per_s", F64),
    ("acceptance_rate", F64), ("mean_accepted_len", F64), ("output_tokens", I64), ("rows", I64),
    ("target_steps", I64), ("draft_tokens", I64), ("accepted_tokens", I64), ("draft_s", F64), ("verify_s", F64),
    ("other_s", F64), ("prefill_s", F64), ("measured", pa.bool_()), ("error", STR),
])
# DESIGN.md's stats columns first, then the rest of batchspec.shard.ShardStats, then ours.
STATS_FIELDS = tuple(pa.field(name, kind) for name, kind in [
    ("shard_id", STR), ("shard_key", STR), ("rows", I64), ("error_rows", I64), ("spec_method", STR),
    ("draft_len", I64), ("acceptance_rate", F64), ("mean_accepted_len", F64), ("output_tokens", I64),
    ("decode_s", F64), ("prefill_s", F64), ("draft_s", F64), ("verify_s", F64), ("tokens_per_s", F64),
    ("baseline_tokens_per_s", F64), ("calibration_s", F64), ("wall_s", F64), ("engine", STR), ("model", STR),
    ("draft_model", STR), ("batch_size", I64), ("candidates", pa.list_(CANDIDATE_TYPE)),
    ("draft_tokens", I64), ("accepted_tokens", I64), ("target_steps", I64), ("other_s", F64),
    ("wall_tokens_per_s", F64), ("speedup", F64), ("calibration_capped", pa.bool_()), ("calibration_rows_kept", I64),
    ("calibration_overhead_s", F64),
    ("decision_source", STR),
    ("decision_reason", STR), ("drift_fallback_row", I64), ("attempts", I64), ("note", STR),
    ("builds", I64), ("build_s", F64), ("speculation_unmeasured", STR), ("caveats", STR),
])
STATS_SCHEMA = pa.schema(STATS_FIELDS)


@dataclass
class ArmResult:
    """One calibration arm: its settings and what was measured (or predicted) for it."""

    method: str
    draft_len: int
    tokens_per_s: float | None = None  # measured goodput (committed tokens / decode s)
    speedup: float | None = None  # goodput over plain decoding's on the same rows, run back to back
    predicted_tokens_per_s: float | None = None
    acceptance_rate: float | None = None
    mean_accepted_len: float | None = None
    output_tokens: int = 0
    decode_tokens: int = 0  # committed by decode steps (the first token of a row comes from prefill)
    rows: int = 0
    target_steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    prefill_s: float = 0.0
    accepted_at: list[int] = field(default_factory=list)  # by draft position: see Completion
    measured: bool = False
    error: str | None = None

    @property
    def label(self) -> str:
        return "none" if self.method == "none" else f"{self.method}:k={self.draft_len}"

    @property
    def decode_s(self) -> float:
        return self.draft_s + self.verify_s + self.other_s

    def vs_none(self, baseline_tokens_per_s: float | None) -> float | None:
        """Speedup over plain decoding: the paired figure when calibration recorded one, else this
        arm's goodput over the baseline's."""
        if self.speedup is not None:
            return self.speedup
        return self.tokens_per_s / baseline_tokens_per_s if self.tokens_per_s and baseline_tokens_per_s else None

    def to_struct(self) -> dict:
        return {"label": self.label, **asdict(self)}

    def add(self, result: GenerateResult) -> None:
        t = result.timing
        self.output_tokens += result.output_tokens
        self.decode_tokens += result.decode_tokens
        self.rows += sum(c.finish_reason != "error" for c in result.completions)
        self.draft_tokens += result.draft_tokens
        self.accepted_tokens += result.accepted_tokens
        self.target_steps += result.target_steps
        self.draft_s += t.draft_s
        self.verify_s += t.verify_s
        self.other_s += t.other_s
        self.prefill_s += t.prefill_s
        for c in result.completions:
            _add_into(self.accepted_at, c.accepted_at)
        decode = self.decode_s
        self.tokens_per_s = self.decode_tokens / decode if decode > 0 and self.decode_tokens else None
        self.acceptance_rate = self.accepted_tokens / self.draft_tokens if self.draft_tokens else None
        self.mean_accepted_len = 1 + self.accepted_tokens / self.target_steps if self.target_steps else None
        self.measured = True


def _add_into(total: list[int], more: list[int]) -> None:
    total.extend([0] * (len(more) - len(total)))
    for j, x in enumerate(more):
        total[j] += x


@dataclass
class ShardStats:
    """One row of OUTPUT/stats. Rates are None where nothing was drafted."""

    shard_id: str
    shard_key: str | None
    rows: int
    error_rows: int
    spec_method: str
    draft_len: int
    acceptance_rate: float | None
    mean_accepted_len: float | None
    output_tokens: int
    draft_tokens: int
    accepted_tokens: int
    target_steps: int
    decode_s: float
    prefill_s: float
    draft_s: float | None  # None: not measured (see caveats)
    verify_s: float | None
    other_s: float
    tokens_per_s: float  # committed tokens per decode second (the calibration goodput measure),
    # over the rows generated after calibration (kept calibration rows were timed there)
    wall_tokens_per_s: float  # the same rows' tokens per second of generation, prefill included
    baseline_tokens_per_s: float | None  # "none" measured in calibration, same measure
    speedup: float | None  # chosen arm vs none, both measured in calibration (see _measured_speedup)
    calibration_s: float
    calibration_overhead_s: float  # calibration time whose work was not kept as output
    calibration_capped: bool
    calibration_rows_kept: int  # sample rows calibration generated to their end, kept as outputs
    decision_source: str  # calibrated | reused | fixed | too_small
    decision_reason: str
    drift_fallback_row: int | None  # row index where the shard fell back to "none", if it did
    wall_s: float
    engine: str
    model: str
    draft_model: str | None
    batch_size: int
    candidates: list[dict] = field(default_factory=list)
    builds: int = 0  # engine builds while this shard ran (TensorRT-LLM: one per arm switched to)
    build_s: float = 0.0  # their seconds, part of calibration_s when calibration caused them
    speculation_unmeasured: str | None = None  # why no speculative arm could be measured, if none could
    caveats: str | None = None  # figures that are estimates or were not measured, and why

    def to_row(self) -> dict:
        return asdict(self)
