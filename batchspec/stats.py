"""The records a run writes and reads back: output rows, shard stats rows, calibration arms.

Each record is a dataclass declared here once; the Parquet schemas of OUTPUT/outputs and
OUTPUT/stats (docs/architecture.md "Records", the contract with data teams) are derived from the
dataclass fields in declaration order, so adding a column is adding one field. write.py, the
report and the CLI read the records from here; so do the few rules every reader shares (the
chosen arm of a shard, the run's speedup total).

Type hints map to Arrow as: int -> int64, float -> float64, str -> string, bool -> bool,
`X | None` -> X (every column is nullable), list[X] -> list<X>, a record -> struct<its columns>.
A record's `DERIVED` properties (ArmResult.label) are columns too, written first.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Iterable

import pyarrow as pa

from batchspec.engine.base import Completion, SpecConfig, StepCost, spec_label

_SCALARS = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_()}


def arrow_type(hint: Any) -> pa.DataType:
    """The Arrow type of one (evaluated) type hint; a hint with no mapping is our bug."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        kinds = [a for a in args if a is not type(None)]
        assert len(kinds) == 1, hint
        return arrow_type(kinds[0])
    if origin in (list, tuple):
        return pa.list_(arrow_type(args[0]))
    if dataclasses.is_dataclass(hint):
        return pa.struct(arrow_fields(hint))
    assert hint in _SCALARS, f"no Arrow type for {hint!r}"
    return _SCALARS[hint]


@functools.cache
def arrow_fields(record: type) -> tuple[pa.Field, ...]:
    """A record's columns: its DERIVED properties, then its dataclass fields, in order."""
    hints = typing.get_type_hints(record)
    derived = [(name, typing.get_type_hints(getattr(record, name).fget)["return"]) for name in getattr(record, "DERIVED", ())]
    fields = [(f.name, hints[f.name]) for f in dataclasses.fields(record)]
    return tuple(pa.field(name, arrow_type(hint)) for name, hint in derived + fields)


def to_columns(record: Any) -> dict[str, Any]:
    """A record as plain values keyed by column (nested records as dicts, derived columns included)."""
    row = {name: getattr(record, name) for name in getattr(type(record), "DERIVED", ())}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if isinstance(value, (list, tuple)):
            value = [to_columns(v) if dataclasses.is_dataclass(v) else v for v in value]
        row[f.name] = value
    return row


def from_columns(record: type, row: dict[str, Any]) -> Any:
    """A record from a row read back from Parquet (any version of it): columns this version does
    not know are ignored, missing or null ones take the field's default (None if it has none);
    nested records are rebuilt the same way. Writing is strict (a ShardStats has exactly its
    fields); reading is not, so `batchspec report` still reads runs written before a column was
    added or removed."""
    hints = typing.get_type_hints(record)
    values = {}
    for f in dataclasses.fields(record):
        value = row.get(f.name)
        if value is None:
            if f.default is not dataclasses.MISSING:
                value = f.default
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
        else:
            inner = _list_item(hints[f.name])
            if inner is not None and dataclasses.is_dataclass(inner):
                value = [from_columns(inner, v) for v in value]
        values[f.name] = value
    return record(**values)


def _list_item(hint: Any) -> Any:
    for h in [hint, *typing.get_args(hint)]:
        if typing.get_origin(h) in (list, tuple):
            return typing.get_args(h)[0]
    return None


def schema(record: type) -> pa.Schema:
    return pa.schema(arrow_fields(record))


def table(record: type, rows: Iterable[Any]) -> pa.Table:
    """Records as one Arrow table typed by `record`'s schema."""
    return pa.Table.from_pylist([to_columns(r) for r in rows], schema=schema(record))


# ---------------------------------------------------------------------------------------------
# OUTPUT/outputs: one row per input row (the input's passthrough columns follow these)


@dataclass
class OutputRow:
    id: str  # the input's `id`, or `<file>#<row>` where it has none
    shard_id: str  # the shard that made the row (`00003-code`)
    text: str | None  # the completion (null on error)
    prompt_tokens: int  # tokens in the prompt, after the chat template
    output_tokens: int  # tokens generated
    finish_reason: str  # stop | length | error
    error: str | None  # null, or a one-line reason
    spec_method: str  # the arm the row finished under: none | ngram | draft_target | eagle3 | mtp | suffix
    draft_len: int  # that arm's most drafts per step (0 for none)
    draft_tokens: int  # drafts proposed for the row
    accepted_tokens: int  # of those, accepted
    target_steps: int  # target forward passes in the row's decode (prefill excluded)

    @classmethod
    def of(cls, shard_id: str, c: Completion, spec: SpecConfig) -> "OutputRow":
        return cls(c.id, shard_id, c.text, c.prompt_tokens, c.output_tokens, c.finish_reason, c.error,
                   spec.method, spec.draft_len, c.draft_tokens, c.accepted_tokens, c.target_steps)


OUTPUT_FIELDS = arrow_fields(OutputRow)
OUTPUT_NAMES = tuple(f.name for f in OUTPUT_FIELDS)


# ---------------------------------------------------------------------------------------------
# A calibration arm: one struct of OUTPUT/stats' `candidates`


@dataclass
class ArmResult:
    """One calibration arm of a shard, in two parts that count different rows:
    - what the arm ran in this shard (`measured`, `rows_run`, `tokens_run`, `tokens_per_s`): the
      decode steps it ran and the rows that finished under it (zero for an arm that never ran);
    - what calibration priced it at (`predicted_speedup`, acceptance, `tally_*`): its
      counterfactual tally over the shard's finished rows (docs/calibration.md, concept 2), the
      same rows for every arm, whichever arm decoded them."""

    DERIVED: typing.ClassVar[tuple[str, ...]] = ("label",)

    method: str  # none | ngram | draft_target | eagle3 | mtp | suffix
    draft_len: int  # the arm's most drafts per step (0 for none)
    measured: bool = False  # the arm ran decode steps in this shard
    rows_run: int = 0  # rows that finished under the arm
    tokens_run: int = 0  # tokens committed by the decode steps it ran (every row's in flight)
    tokens_per_s: float | None = None  # tokens_run per second of those steps (null: it ran none)
    predicted_speedup: float | None = None  # its goodput over plain decoding's on the shard's rows, drain included: from its tally and the worker's cost table
    acceptance_rate: float | None = None  # tally_accepted_tokens / tally_draft_tokens
    mean_accepted_len: float | None = None  # committed tokens per target step in the tally, the bonus token included
    acceptance_exact: bool | None = None  # the tally is exact (greedy rows), not an expectation (sampled)
    tally_rows: int = 0  # finished rows the tally covers (where acceptance is measured by running the arm: the rows it ran)
    tally_target_steps: int = 0  # target steps those rows take under the arm
    tally_draft_tokens: int = 0  # drafts the arm proposes on those rows
    tally_accepted_tokens: int = 0  # of those, accepted
    error: str | None = None  # why the arm could not run (its build failed)

    @property
    def label(self) -> str:
        """The arm's name: `none`, or `method:k=N` (`ngram:k=4`)."""
        return spec_label(self.method, self.draft_len)


def chosen_arm(arms: Iterable[ArmResult], chosen: SpecConfig | str) -> ArmResult | None:
    """The arm a shard runs with: the measured or predicted arm whose label is the chosen setting's
    (None when the setting was fixed, or reused, without measuring or predicting it)."""
    label = chosen if isinstance(chosen, str) else chosen.label
    return next((a for a in arms if (a.measured or a.predicted_speedup is not None) and a.label == label), None)


CANDIDATE_TYPE = arrow_type(ArmResult)


# ---------------------------------------------------------------------------------------------
# A calibration event: one struct of OUTPUT/stats' `events`


@dataclass
class Event:
    """What calibration decided, or what happened, while a shard ran (batchspec.calibrate)."""

    row: int  # rows of the shard finished when it happened
    kind: str  # start | profile | measure | measured | switch | failed (docs/calibration.md, "Event")
    arm: str  # the arm concerned (its label)
    predicted: float | None = None  # the arm's predicted speedup over plain decoding, where the rule used one
    measured: float | None = None  # measured: the arm's speedup priced from its own steps; profile: its seconds
    reason: str = ""  # one short line


EVENT_TYPE = arrow_type(Event)


# ---------------------------------------------------------------------------------------------
# OUTPUT/stats: one row per shard


@dataclass(kw_only=True)
class ShardStats:
    """One row of OUTPUT/stats, in column order: the contract's stats columns first, then the rest.
    Rates are None where nothing was drafted; measurements are None where the shard had no row
    that could run (every row an error row)."""

    shard_id: str  # the shard (`00003-code`)
    shard_key: str | None  # its --shard-by value
    rows: int  # rows written
    error_rows: int  # rows with finish_reason error
    spec_method: str = "none"  # the arm most of the shard's rows finished under (each output row names its own)
    draft_len: int = 0  # that arm's most drafts per step (0 for none)
    acceptance_rate: float | None = None  # accepted_tokens / draft_tokens (null where nothing was drafted)
    mean_accepted_len: float | None = None  # tokens committed per target step, the bonus token included
    output_tokens: int = 0  # tokens generated, all rows
    decode_s: float | None = None  # decode seconds: draft_s + verify_s + other_s
    prefill_s: float | None = None  # the target's prefill of the rows (its first token each)
    draft_s: float | None = None  # drafting, a draft model's prefill of the rows it admits included (null: not measured, see caveats)
    verify_s: float | None = None  # the target's verify forwards and the accept rule (null: not measured, see caveats)
    tokens_per_s: float | None = None  # goodput: tokens committed by decode steps per decode second
    baseline_tokens_per_s: float | None = None  # plain decoding's goodput for the same tokens, priced by the worker's cost table
    calibration_s: float | None = None  # seconds calibration added: the controller's own work (a fixed arm's: its pricing's re-timed forward), builds of arms the shard did not end on (the worker's cost profile is profile_s)
    wall_s: float | None = None  # the shard's wall time, calibration included
    engine: str  # torch | trtllm
    model: str  # the target model as configured
    draft_model: str | None = None  # the chosen arm's draft model (draft_target, eagle3)
    batch_size: int  # most rows in flight
    candidates: list[ArmResult] = field(default_factory=list)  # every arm calibration weighed, run or only priced (docs/schema.md, "candidates")
    draft_tokens: int | None = None  # drafts proposed, all rows
    accepted_tokens: int | None = None  # drafts accepted, all rows
    target_steps: int | None = None  # target forward passes in decode, all rows
    other_s: float | None = None  # the decode loop's own work between forwards (committing tokens, stop strings, cache upkeep)
    speedup: float | None = None  # the shard's decode steps against plain decoding's price for the same tokens
    # (the worker's cost table); plain decoding fixed: 1.0; null where the table cannot price plain decoding
    decision_source: str | None = None  # calibrated | fixed
    decision_reason: str | None = None  # one short line; the whole story is `events`
    attempts: int = 1  # tries the shard took (a worker death or an exception is retried)
    note: str | None = None  # why every attempt failed (rows written as errors), or why the attempts before the last did
    builds: int = 0  # engine builds while the shard ran (TensorRT-LLM: one per arm switched to)
    build_s: float = 0.0  # their seconds, part of calibration_s where calibration caused them
    speculation_unmeasured: str | None = None  # why no speculative arm could be priced or run, where none could
    caveats: str | None = None  # figures that are estimates or were not measured, and why
    predicted_speedup: float | None = None  # the chosen arm's, over the shard's rows (its candidates entry)
    profile_s: float = 0.0  # the worker's cost profile, timed once per worker and batch size while this shard ran (0: the worker had one); the worker's seconds, in none of the shard's calibration figures
    cost_profile: list[StepCost] = field(default_factory=list)  # that profile's forwards, where this shard timed it
    node_id: str | None = None  # the Ray node whose worker ran the shard (null: written by the driver)
    gpus: float = 0.0  # GPUs the shard's worker held (worker.num_gpus; TensorRT-LLM: one LLM spans them all)
    gpu_memory_per_gpu: int | None = None  # bytes: the most device memory seen in use on one of them (null: a CPU)
    prompt_format: str | None = None  # how text prompts reached the model: chat (its chat template) or raw
    empty_rows: int = 0  # rows that ran and returned an empty text (many: a likely prompt-format mismatch)
    constrained_rows: int = 0  # rows with a response_format (structured output)
    forced_tokens: int = 0  # of accepted_tokens: drafts the row's grammar forced
    tree_bytes: int | None = None  # suffix drafting: bytes of the shard key's tree on the worker when the shard ended (null without one)
    tree_rows: int | None = None  # rows in that tree
    tree_hit_rate: float | None = None  # share of the suffix drafter's lookups in the shard that other rows' outputs answered
    events: list[Event] = field(default_factory=list)  # what calibration decided and what happened, in order (docs/schema.md, "events")
    plain_decode_s: float | None = None  # what plain decoding would have taken for the shard's decode: decode_s x speedup (the
    # worker's cost table's price), decode_s itself where plain decoding ran every step (null: the table cannot price it)
    plain_decode_u: float | None = None  # plain_decode_s's relative uncertainty: its prices' `u`, weighted by price (0: plain decoding ran)
    device: str | None = None  # what gpu_s counts: gpu (the worker's GPUs) | cpu (a CPU worker's torch threads: CPU-seconds)
    devices: float | None = None  # how many: worker.num_gpus, or on a CPU worker its torch threads
    gpu_s: float | None = None  # device-seconds the shard used: (prefill_s + decode_s + calibration_s + profile_s + head_train_s) x devices, the worker's profile counted once (null: not measured)
    plain_gpu_s: float | None = None  # the same rows as plain decoding: (prefill_s + plain_decode_s) x devices, no calibration
    plain_gpu_s_err: float | None = None  # plain_gpu_s's uncertainty, device-seconds: plain_decode_s x plain_decode_u x devices
    plain_estimated: bool | None = None  # plain_gpu_s is the cost table's price (plain decoding did not run every step), not a measurement
    head: str | None = None  # train_head: the key's trained EAGLE-3 head among the shard's arms (heads/<name>, or the prior run's), or the one it trained
    head_train_s: float | None = None  # train_head: seconds the shard spent training its key's head on its rows (null: it trained none)

    @property
    def chosen(self) -> ArmResult | None:
        return chosen_arm(self.candidates, spec_label(self.spec_method, self.draft_len))

    def to_row(self) -> dict:
        return to_columns(self)

    @classmethod
    def from_row(cls, row: dict) -> "ShardStats":
        return from_columns(cls, row)


def suffix_columns(completions: Iterable[Completion], usage: tuple[int, int] | None) -> dict[str, Any]:
    """ShardStats' tree columns from a shard's completions and its key's tree `usage` (bytes, rows:
    the torch engine's `trees.usage(key)`; None for an engine without trees)."""
    completions = list(completions)
    lookups = sum(c.tree_lookups for c in completions)
    hits = sum(c.tree_drafts for c in completions)
    tree_bytes, tree_rows = usage if usage is not None else (None, None)
    return {"tree_bytes": tree_bytes, "tree_rows": tree_rows, "tree_hit_rate": hits / lookups if lookups else None}


def device_seconds(stats: ShardStats, gpus: float, cpus: float) -> dict[str, Any]:
    """ShardStats' device columns for a worker of `gpus` GPUs (0: a CPU worker of `cpus` threads):
    the seconds it measured and plain decoding's price of the same rows, each times the devices."""
    device, devices = ("gpu", gpus) if gpus > 0 else ("cpu", cpus)
    out: dict[str, Any] = {"device": device, "devices": devices}
    if stats.decode_s is None or stats.prefill_s is None:
        return out
    out["gpu_s"] = (stats.prefill_s + stats.decode_s + (stats.calibration_s or 0.0) + stats.profile_s + (stats.head_train_s or 0.0)) * devices
    if stats.plain_decode_s is not None:
        u = stats.plain_decode_u or 0.0
        out.update(plain_gpu_s=(stats.prefill_s + stats.plain_decode_s) * devices,
                   plain_gpu_s_err=stats.plain_decode_s * u * devices, plain_estimated=u > 0)
    return out


STATS_FIELDS = arrow_fields(ShardStats)
STATS_SCHEMA = pa.schema(STATS_FIELDS)


# ---------------------------------------------------------------------------------------------
# Totals over shards (pipeline.summarize prints them, report/load.py shows them)


@dataclass(frozen=True)
class Speedup:
    speedup: float | None  # sum(decode_s x speedup) / sum(decode_s)
    baseline_tokens_per_s: float | None  # the same shards' tokens over what plain decoding would have taken
    predicted_share: float = 0.0  # share of that decode time priced by a predicted ratio, not a measured one
    tokens_per_s: float | None = None  # the same shards' tokens over their decode time: baseline x speedup


def shard_speedup(s: ShardStats) -> tuple[float | None, bool]:
    """A shard's ratio over plain decoding and whether it is predicted: its goodput against the
    cost table's price of plain decoding for the same tokens (`speedup`), else the chosen arm's
    prediction. Both are estimates where plain decoding did not run every row."""
    if s.speedup:
        return s.speedup, s.spec_method != "none"
    return (s.predicted_speedup, True) if s.predicted_speedup else (None, False)


def speedup_total(shards: Iterable[ShardStats]) -> Speedup:
    """The run's speedup over plain decoding: every shard with a ratio (`shard_speedup`) weighs it
    by its decode time; sum(decode_s x speedup) is what plain decoding would have taken for the
    same tokens. Leaving out the shards whose ratio is predicted would count only the confirmed
    ones (the first of each key on a worker, and close calls): a biased total."""
    timed = [(s, *shard_speedup(s)) for s in shards if s.decode_s and s.tokens_per_s]
    timed = [(s, x, predicted) for s, x, predicted in timed if x]
    plain_s = sum(s.decode_s * x for s, x, _ in timed)
    decode_s = sum(s.decode_s for s, _, _ in timed)
    tokens = sum(s.tokens_per_s * s.decode_s for s, _, _ in timed)
    predicted_s = sum(s.decode_s for s, _, predicted in timed if predicted)
    return Speedup(plain_s / decode_s if decode_s else None, tokens / plain_s if plain_s else None,
                   predicted_s / decode_s if decode_s else 0.0, tokens / decode_s if decode_s else None)

