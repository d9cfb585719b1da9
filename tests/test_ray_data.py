"""`batchspec.ray_data.generate`: a Ray Data stage with the per-row columns of a run, per-shard
calibration per key, error rows for bad rows, and a one-line error naming a missing column."""

from __future__ import annotations

import dataclasses

import pytest

from batchspec.config.run import build_config
from batchspec.ray_data import generate
from batchspec.stats import OUTPUT_NAMES
from tests.data import prompts_table

FAST = {"sample_size": 4, "max_tokens": 4, "min_rows": 2}


def config_for(model, **overrides):
    options = dict(model=str(model), shard_by="task", shard_size=6, batch_size=4, max_tokens=4, workers=1, num_cpus=0.5, torch_threads=1)
    return dataclasses.replace(build_config("", "", **{**options, **overrides}), calibration=tuple(FAST.items()))


def test_generate_adds_the_output_columns_to_every_row(ray_session, tiny_model_dir):
    import ray

    rows = prompts_table(8).to_pylist()
    rows[5]["prompt"] = ""  # a bad row comes back as an error row, not an exception
    out = generate(ray.data.from_items(rows), config_for(tiny_model_dir)).take_all()
    assert sorted(r["id"] for r in out) == [f"row-{i:04d}" for i in range(8)]
    assert list(out[0]) == [*OUTPUT_NAMES, "task", "source"]
    by_id = {r["id"]: r for r in out}
    assert by_id["row-0005"]["finish_reason"] == "error" and by_id["row-0005"]["error"] == "prompt is empty"
    ok = [r for r in out if r["id"] != "row-0005"]
    assert all(r["text"] is not None and r["output_tokens"] >= 1 for r in ok)
    # each key of a batch is its own shard, calibrated on its own
    shards = {r["task"]: set() for r in out}
    for r in out:
        shards[r["task"]].add(r["shard_id"])
    assert all(shards[t].isdisjoint(shards[u]) for t in shards for u in shards if t != u)
    assert all(r["shard_id"].startswith(r["task"] + "-") for r in out)
    assert {r["spec_method"] for r in ok} <= {"none", "ngram", "draft_target"}


def test_a_missing_prompt_column_names_the_stage_and_the_columns(ray_session, tiny_model_dir):
    import ray

    with pytest.raises(Exception, match=r"batchspec\.ray_data\.generate: needs a 'prompt'.*found \['question', 'task'\]"):
        generate(ray.data.from_items([{"question": "hi", "task": "x"}]), config_for(tiny_model_dir, spec="none")).take_all()
