"""The records of batchspec.stats: schemas derived from the dataclasses, nothing lost on the way
through Parquet, unknown fields refused, and the rules every reader shares."""

from __future__ import annotations

import dataclasses
import typing

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchspec.engine.base import NO_SPEC, Completion, SpecConfig
from batchspec.stats import (
    CANDIDATE_TYPE,
    EVENT_TYPE,
    OUTPUT_NAMES,
    STATS_SCHEMA,
    ArmResult,
    OutputRow,
    ShardStats,
    arrow_fields,
    chosen_arm,
    speedup_total,
    to_columns,
)
from batchspec.write import Output, output_schema, output_table, stats_table

# docs/architecture.md "Output layout", the contract with data teams: these columns come first, in this order.
DESIGN_OUTPUT = ["id", "shard_id", "text", "prompt_tokens", "output_tokens", "finish_reason", "error", "spec_method",
                 "draft_len", "draft_tokens", "accepted_tokens", "target_steps"]
DESIGN_STATS = ["shard_id", "shard_key", "rows", "error_rows", "spec_method", "draft_len", "acceptance_rate",
                "mean_accepted_len", "output_tokens", "decode_s", "prefill_s", "draft_s", "verify_s", "tokens_per_s",
                "baseline_tokens_per_s", "calibration_s", "wall_s", "engine", "model", "draft_model", "batch_size",
                "candidates"]


def test_schemas_are_the_dataclass_fields_design_columns_first():
    assert list(OUTPUT_NAMES) == [f.name for f in dataclasses.fields(OutputRow)] == DESIGN_OUTPUT
    assert STATS_SCHEMA.names == [f.name for f in dataclasses.fields(ShardStats)]
    assert STATS_SCHEMA.names[: len(DESIGN_STATS)] == DESIGN_STATS
    assert [f.name for f in CANDIDATE_TYPE] == ["label", *(f.name for f in dataclasses.fields(ArmResult))]
    assert STATS_SCHEMA.field("candidates").type == pa.list_(CANDIDATE_TYPE)
    kinds = {f.name: f.type for f in STATS_SCHEMA}
    assert (kinds["rows"], kinds["acceptance_rate"], kinds["shard_key"], kinds["speculation_unmeasured"]) == (
        pa.int64(), pa.float64(), pa.string(), pa.string())
    assert [f.name for f in EVENT_TYPE] == ["row", "kind", "arm", "predicted", "measured", "reason"]
    assert kinds["events"] == pa.list_(EVENT_TYPE)
    assert CANDIDATE_TYPE.field("tally_target_steps").type == pa.int64()


def test_adding_a_field_is_a_declaration():
    @dataclasses.dataclass(kw_only=True)
    class Wider(ShardStats):
        draft_overhead_s: float | None = None

    names = [f.name for f in arrow_fields(Wider)]
    assert names == [*STATS_SCHEMA.names, "draft_overhead_s"]
    assert arrow_fields(Wider)[-1].type == pa.float64()


def _full(record: type, seed: int = 0):
    """A record with every field set to a non-default value, whatever fields it has today."""
    hints = typing.get_type_hints(record)
    values = {}
    for i, f in enumerate(dataclasses.fields(record), start=seed):
        kind = hints[f.name]
        if type(None) in typing.get_args(kind):  # X | None
            [kind] = [a for a in typing.get_args(kind) if a is not type(None)]
        if kind is bool:
            values[f.name] = True
        elif kind is int:
            values[f.name] = 100 + i
        elif kind is float:
            values[f.name] = 0.5 + i
        elif kind is str:
            values[f.name] = f"{f.name}-{i}"
        elif typing.get_origin(kind) is list and typing.get_args(kind)[0] is int:
            values[f.name] = [i, i + 1, i + 2]
        elif typing.get_origin(kind) is list and typing.get_args(kind)[0] is ArmResult:
            values[f.name] = [_full(ArmResult, 10), _full(ArmResult, 40)]
        elif typing.get_origin(kind) is list and dataclasses.is_dataclass(typing.get_args(kind)[0]):
            values[f.name] = [_full(typing.get_args(kind)[0], 70), _full(typing.get_args(kind)[0], 90)]
        else:
            raise AssertionError(f"test has no value for {record.__name__}.{f.name}: {kind}")
    if record is ArmResult:
        values["method"] = "ngram"
    return record(**values)


def test_a_full_stats_row_round_trips_through_parquet_with_nothing_lost(tmp_path):
    stats = _full(ShardStats)
    assert stats.candidates[0].tokens_run and stats.candidates[0].tally_target_steps  # dropped before this record
    out = Output(str(tmp_path / "out"))
    completion = Completion("a", "hi", prompt_tokens=3, output_tokens=2, finish_reason="stop", draft_tokens=4,
                            accepted_tokens=3, target_steps=1)
    passthrough = pa.table({"task": ["code"]})
    outputs = output_table(stats.shard_id, [completion], [SpecConfig("ngram", 4)], passthrough, output_schema(passthrough.schema))
    out.commit_shard(stats.shard_id, outputs, stats_table(stats))
    [back] = out.read_stats([stats.shard_id])
    assert back == stats
    written = pq.read_table(out.stats_path(stats.shard_id)).to_pylist()[0]
    assert [c["label"] for c in written["candidates"]] == [f"ngram:k={c.draft_len}" for c in stats.candidates]
    row = outputs.to_pylist()[0]
    assert row == {**dataclasses.asdict(OutputRow.of(stats.shard_id, completion, SpecConfig("ngram", 4))), "task": "code"}


def test_unknown_fields_are_refused_and_only_records_are_written():
    with pytest.raises(TypeError, match="wall_tokens_per_s"):
        ShardStats(shard_id="s", shard_key=None, rows=1, error_rows=0, engine="torch", model="m", batch_size=1,
                   wall_tokens_per_s=3.0)
    with pytest.raises(AssertionError):
        stats_table({"shard_id": "s", "rows": 1})


def test_rows_written_by_older_versions_still_read():
    row = {**to_columns(_full(ShardStats)), "wall_tokens_per_s": 12.0, "attempts": None}
    for c in row["candidates"]:
        del c["tokens_run"], c["tally_target_steps"]
        c["decode_tokens"] = 7  # a field this version no longer has
    back = ShardStats.from_row(row)
    assert back.attempts == 1 and back.candidates[0].tokens_run == 0 and back.candidates[0].tally_target_steps == 0
    assert back.speedup == row["speedup"]


def test_the_chosen_arm_is_the_measured_arm_with_the_chosen_label():
    unpriced = ArmResult("ngram", 4)
    measured = [ArmResult("none", 0, tokens_per_s=10.0, measured=True), ArmResult("ngram", 2, tokens_per_s=20.0, measured=True)]
    assert chosen_arm(measured + [unpriced], SpecConfig("ngram", 2)) is measured[1]
    assert chosen_arm(measured + [unpriced], "ngram:k=4") is None  # neither run nor priced: never chosen
    assert chosen_arm(measured, NO_SPEC) is measured[0]
    shard = ShardStats(shard_id="s", shard_key=None, rows=1, error_rows=0, engine="torch", model="m", batch_size=1,
                       spec_method="ngram", draft_len=2, candidates=measured)
    assert shard.chosen is measured[1]


def test_the_speedup_total_weighs_each_shard_by_its_decode_time():
    def shard(decode_s, speedup, tokens_per_s, predicted=None):
        return ShardStats(shard_id="s", shard_key=None, rows=1, error_rows=0, engine="torch", model="m", batch_size=1,
                          decode_s=decode_s, speedup=speedup, tokens_per_s=tokens_per_s, predicted_speedup=predicted)

    shards = [shard(2.0, 1.5, 30.0), shard(1.0, 1.0, 10.0), shard(5.0, None, 99.0), shard(None, None, None)]
    total = speedup_total(shards)
    plain_s = 2.0 * 1.5 + 1.0 * 1.0  # what plain decoding would have taken for the timed shards' tokens
    assert total.speedup == pytest.approx(plain_s / 3.0)
    assert total.baseline_tokens_per_s == pytest.approx((30.0 * 2.0 + 10.0 * 1.0) / plain_s)
    assert total.predicted_share == 0.0
    assert speedup_total([shard(5.0, None, 99.0)]).speedup is None
    # a shard chosen on prediction alone counts with its predicted ratio, and the total says how much
    # of it is predicted; a measured ratio wins over a predicted one
    both = speedup_total([shard(2.0, 1.5, 30.0, predicted=9.0), shard(6.0, None, 20.0, predicted=2.0)])
    assert both.speedup == pytest.approx((2.0 * 1.5 + 6.0 * 2.0) / 8.0)
    assert both.predicted_share == pytest.approx(6.0 / 8.0)


def test_the_suffix_tree_columns_come_from_completions_and_the_keys_tree():
    from batchspec.engine.base import Completion
    from batchspec.stats import STATS_SCHEMA, suffix_columns

    done = [Completion("a", "x", tree_lookups=10, tree_drafts=4), Completion("b", "y", tree_lookups=6, tree_drafts=0)]
    assert suffix_columns(done, (4096, 12)) == {"tree_bytes": 4096, "tree_rows": 12, "tree_hit_rate": 0.25}
    assert suffix_columns([Completion("c", "z")], None) == {"tree_bytes": None, "tree_rows": None, "tree_hit_rate": None}
    assert {"tree_bytes", "tree_rows", "tree_hit_rate"} <= set(STATS_SCHEMA.names)


def _timed(**more) -> ShardStats:
    return ShardStats(shard_id="00000-a", shard_key="a", rows=4, error_rows=0, engine="torch", model="m", batch_size=4,
                      prefill_s=2.0, decode_s=10.0, calibration_s=1.5, **more)


def test_device_seconds_count_gpus_or_a_cpu_workers_threads_and_price_plain_decoding_without_calibration():
    from batchspec.stats import device_seconds

    estimated = device_seconds(_timed(speedup=1.5, plain_decode_s=15.0, plain_decode_u=0.04), gpus=2.0, cpus=8)
    assert estimated == {"device": "gpu", "devices": 2.0, "gpu_s": (2.0 + 10.0 + 1.5) * 2, "plain_gpu_s": (2.0 + 15.0) * 2,
                         "plain_gpu_s_err": 15.0 * 0.04 * 2, "plain_estimated": True}
    ran_plain = device_seconds(_timed(plain_decode_s=10.0, plain_decode_u=0.0), gpus=0.0, cpus=3)
    assert ran_plain == {"device": "cpu", "devices": 3, "gpu_s": 13.5 * 3, "plain_gpu_s": 12.0 * 3, "plain_gpu_s_err": 0.0,
                         "plain_estimated": False}
    assert ran_plain["plain_gpu_s"] - ran_plain["gpu_s"] == -1.5 * 3  # plain decoding throughout: saved minus calibration
    unpriced = device_seconds(_timed(), gpus=1.0, cpus=1)
    assert unpriced == {"device": "gpu", "devices": 1.0, "gpu_s": 13.5}  # the table could not price plain decoding
    unrun = ShardStats(shard_id="00001-a", shard_key="a", rows=2, error_rows=2, engine="torch", model="m", batch_size=4)
    assert device_seconds(unrun, gpus=1.0, cpus=1) == {"device": "gpu", "devices": 1.0}  # nothing measured: no seconds claimed
