"""Plan and group with Ray Data: shard assignment in input order per key, OUTPUT/_shards/ written
once per shard, the small _plan.json, duplicate ids, S3, and a half-done group redone.
(`--plan-only` and a resume that never reads the input again: tests/cli/test_run.py.)"""

from __future__ import annotations

import json

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchspec.errors import InputError
from batchspec.group import ID, POS, group_shards
from batchspec.plan import Plan, make_plan
from batchspec.read import open_input
from batchspec.workers import read_shard_input
from batchspec.write import Output
from tests.data import prompts_table, write_parquet


def shard_ids_of(output: Output, plan: Plan) -> dict[str, list[str]]:
    return {s.shard_id: read_shard_input(output, s).column(ID).to_pylist() for s in plan.shards}


def test_plan_groups_by_key_in_input_order_and_materializes_each_shard_once(ray_session, folder, tmp_path, monkeypatch):
    """With Ray Data, under the shuffle a small job gets (the pull-based sort shuffle) and the one a
    large job gets (Ray Data's default), and in-process (small inputs): one plan, each shard's rows
    its key's in input order, the same shard files every way. (The default shuffle's plan and group
    take about 15-30 s on 2 cores, most of it starting its aggregator actors.)"""
    from batchspec import group as group_module
    from batchspec import plan as plan_module

    source = open_input(str(folder), shard_by="task")
    plans = [make_plan(source, "task", 3, local=local) for local in (False, True, True)]
    with monkeypatch.context() as m:
        m.setattr(plan_module, "SORT_SHUFFLE_ROWS", -1)  # every job is large
        plans.append(make_plan(source, "task", 3, local=False))
    assert plans[0] == plans[1] == plans[2] == plans[3]
    plan = plans[0]
    assert [(s.shard_id, s.shard_key, s.rows) for s in plan.shards] == [
        ("00000-code", "code", 3), ("00001-code", "code", 2), ("00002-prose", "prose", 3), ("00003-prose", "prose", 2)
    ]
    names = ("ray-data", "in-process", "ray-data-default-shuffle")
    outs = [Output(str(tmp_path / name)) for name in names]
    group_shards(source, plan, outs[0], local=False)
    group_shards(source, plan, outs[1], local=True)
    with monkeypatch.context() as m:
        m.setattr(group_module, "SORT_SHUFFLE_BYTES", -1)
        group_shards(source, plan, outs[2], local=False)
    # code rows are the even rows, in input order across both files
    expected = {
        "00000-code": ["row-0000", "row-0002", "row-0004"], "00001-code": ["row-0006", "row-0008"],
        "00002-prose": ["row-0001", "row-0003", "row-0005"], "00003-prose": ["row-0007", "row-0009"],
    }
    assert all(shard_ids_of(out, plan) == expected for out in outs)
    for s in plan.shards:
        assert read_shard_input(outs[0], s).equals(read_shard_input(outs[1], s)), s.shard_id
        assert read_shard_input(outs[2], s).equals(read_shard_input(outs[1], s)), s.shard_id
    table = read_shard_input(outs[0], plan.shards[2])
    assert table.column("prompt").to_pylist()[0] == "Write item 1 about prose: the quick brown fox 1"
    assert set(table.column_names) >= {"id", "prompt", "task", "source", POS, ID}
    for name in names:
        assert sorted(p.name for p in (tmp_path / name / "_shards").iterdir()) == [f"{s.shard_id}.parquet" for s in plan.shards]
    assert make_plan(source, "task", 4).fingerprint != plan.fingerprint


def test_the_sort_shuffle_is_used_where_asked_unless_the_user_chose_one(ray_session, monkeypatch):
    import ray.data

    from batchspec.plan import shuffle_for

    ctx = ray.data.DataContext.get_current()
    monkeypatch.delenv("RAY_DATA_DEFAULT_SHUFFLE_STRATEGY", raising=False)
    monkeypatch.setattr(ctx, "shuffle_strategy", "shuffle_v2")
    with shuffle_for(sort=True) as strategy:
        assert strategy == ctx.shuffle_strategy == "sort_shuffle_pull_based"
        ds = ray.data.range(3)
    assert ctx.shuffle_strategy == "shuffle_v2" and ds.context.shuffle_strategy == "sort_shuffle_pull_based"  # kept by the dataset
    with shuffle_for(sort=False) as strategy:
        assert strategy == "shuffle_v2"
    monkeypatch.setenv("RAY_DATA_DEFAULT_SHUFFLE_STRATEGY", "shuffle_v2")
    with shuffle_for(sort=True) as strategy:
        assert strategy == "shuffle_v2"


def test_plan_json_holds_per_shard_counts_and_fingerprints_not_rows(ray_session, folder):
    source = open_input(str(folder), shard_by="task")
    plan = make_plan(source, "task", 3)
    doc = json.loads(plan.to_json())
    assert set(doc["shards"][0]) == {"shard_id", "shard_key", "rows", "start", "fingerprint"}
    assert "row-0000" not in plan.to_json()
    assert Plan.from_json(plan.to_json()) == plan


def test_without_id_column_ids_are_file_and_row_and_without_shard_by_one_key(ray_session, tmp_path):
    pq.write_table(prompts_table(5, with_id=False), tmp_path / "noid.parquet", row_group_size=2)
    source = open_input(str(tmp_path / "noid.parquet"))
    plan = make_plan(source, None, 2)
    assert [(s.shard_id, s.shard_key, s.rows) for s in plan.shards] == [("00000", None, 2), ("00001", None, 2), ("00002", None, 1)]
    out = Output(str(tmp_path / "out"))
    group_shards(source, plan, out)
    assert sum(shard_ids_of(out, plan).values(), []) == [f"noid.parquet#{i}" for i in range(5)]


@pytest.mark.parametrize("local", [False, True], ids=["ray-data", "in-process"])
def test_duplicate_ids_are_refused_naming_the_id(ray_session, tmp_path, local):
    table = prompts_table(6).set_column(0, "id", pa.array(["a", "b", "c", "d", "e", "c"]))
    pq.write_table(table.slice(0, 3), tmp_path / "x.parquet")
    pq.write_table(table.slice(3), tmp_path / "y.parquet")
    with pytest.raises(InputError, match=r"duplicate id 'c'; ids must be unique"):
        make_plan(open_input(str(tmp_path)), None, 4, local=local)


def test_null_keys_go_last_and_numeric_keys_group_by_their_string(ray_session, tmp_path):
    pq.write_table(pa.table({"prompt": ["p"] * 5, "tier": pa.array([2, None, 10, 2, None], pa.int64())}), tmp_path / "t.parquet")
    plan = make_plan(open_input(str(tmp_path / "t.parquet"), shard_by="tier"), "tier", 8)
    assert [(s.shard_key, s.rows) for s in plan.shards] == [("10", 1), ("2", 2), (None, 2)]


def test_plan_and_group_over_s3(ray_session, s3):
    url, options, _ = s3
    fs = fsspec.filesystem("s3", **options)
    write_parquet(fs, f"{url}/in/part-0.parquet", prompts_table(5))
    write_parquet(fs, f"{url}/in/part-1.parquet", prompts_table(9).slice(5))
    source = open_input(f"{url}/in/", options, shard_by="task")
    plan = make_plan(source, "task", 2)
    out = Output(f"{url}/out", tuple(options.items()))
    group_shards(source, plan, out)
    got = shard_ids_of(out, plan)
    assert sorted(sum(got.values(), [])) == [f"row-{i:04d}" for i in range(9)]
    assert len(fs.ls(f"{url}/out/_shards")) == len(plan.shards)


def test_a_partial_group_without_plan_json_is_redone(ray_session, folder, tmp_path):
    from batchspec.pipeline import plan_run
    from batchspec.config.run import build_config

    out = tmp_path / "out"
    (out / "_shards").mkdir(parents=True)
    (out / "_shards" / "00000-code.parquet").write_bytes(b"half a file")
    (out / "_shards" / "99999-stale.parquet").write_bytes(b"from another plan")
    plan = plan_run(build_config(str(folder), str(out), shard_by="task", shard_size=3)).plan
    assert sorted(p.name for p in (out / "_shards").iterdir()) == [f"{s.shard_id}.parquet" for s in plan.shards]
    assert read_shard_input(Output(str(out)), plan.shards[0]).num_rows == 3


def test_an_input_small_on_disk_but_large_uncompressed_is_planned_with_ray_data(tmp_path):
    """zstd makes 40 MB of repetitive prompts a few KB: the footers' uncompressed sizes decide."""
    from batchspec.plan import LOCAL_BYTES, plan_locally
    from batchspec.read import open_input

    filler = "the quick brown fox jumps over the lazy dog; " * 4500  # ~200k characters
    pq.write_table(pa.table({"prompt": [f"row {i}: {filler}" for i in range(200)]}), tmp_path / "p.parquet", compression="zstd")
    source = open_input(str(tmp_path / "p.parquet"))
    assert (tmp_path / "p.parquet").stat().st_size < LOCAL_BYTES // 100 < LOCAL_BYTES < sum(b for f in source.files for _, b in f.row_groups)
    assert not plan_locally(source)


def test_the_in_process_group_reads_repeated_long_prompts_a_few_rows_at_a_time(tmp_path):
    """Identical prompts are small even uncompressed (Parquet's dictionary), so they are grouped in
    this process: by pieces, never the whole input decoded at once, and to the same shard files."""
    from batchspec import read
    from batchspec.plan import make_plan, plan_locally

    filler = "the quick brown fox jumps over the lazy dog; " * 4500
    table = pa.table({"id": [f"r{i:03d}" for i in range(200)], "task": ["a", "b"] * 100, "prompt": [filler] * 200})
    pq.write_table(table, tmp_path / "p.parquet", compression="zstd")
    source = open_input(str(tmp_path / "p.parquet"), shard_by="task")
    assert plan_locally(source) and source.files[0].row_groups[0][1] < 1 << 20 < 200 * len(filler)
    pieces = [t.num_rows for c in read.chunks(source, 1 << 30) for _, t in read.read_pieces(source, c, 4 << 20)]
    assert sum(pieces) == 200 and max(pieces) <= 4 * read.PIECE_ROWS, pieces
    plan = make_plan(source, "task", 64)
    out = Output(str(tmp_path / "out"))
    group_shards(source, plan, out, local=True)
    expected = {}
    for key in ("a", "b"):  # each key's rows in input order, cut into shards of 64
        ids = [f"r{i:03d}" for i in range(200) if table.column("task")[i].as_py() == key]
        for s, j in zip([s for s in plan.shards if s.shard_key == key], range(0, len(ids), 64)):
            expected[s.shard_id] = ids[j : j + 64]
    assert shard_ids_of(out, plan) == expected and len(expected) == 4
