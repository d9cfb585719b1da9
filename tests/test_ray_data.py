"""`batchspec.ray_data.generate`: a Ray Data stage with the per-row columns of a run, per-shard
calibration per key, error rows for bad rows, and a one-line error naming a missing column."""

from __future__ import annotations

import dataclasses

import pytest

from batchspec.config.run import build_config
from batchspec.errors import ConfigError, InputError
from batchspec.ray_data import generate
from batchspec.stats import OUTPUT_NAMES
from tests.data import prompts_table

FAST = {"window": 4, "measure_steps": 4}


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


def test_a_prompt_goes_through_the_chat_template_unless_the_format_is_raw(ray_session, tiny_model_dir, tiny_base_model_dir, smol_tokenizer):
    """As Ray Data LLM's chat-template stage before its engine: under chat (the default) a prompt is
    one user message through the template; raw keeps the text; a model without a template is
    refused under chat before any actor starts."""
    import ray

    from batchspec.errors import ConfigError

    rows = prompts_table(2).to_pylist()
    ds = ray.data.from_items(rows)
    chat = {r["id"]: r["prompt_tokens"] for r in generate(ds, config_for(tiny_model_dir, spec="none")).take_all()}
    raw = {r["id"]: r["prompt_tokens"] for r in generate(ds, config_for(tiny_model_dir, spec="none", prompt_format="raw")).take_all()}
    for r in rows:
        templated = smol_tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}], add_generation_prompt=True,
                                                       tokenize=False)
        assert chat[r["id"]] == len(smol_tokenizer(templated, add_special_tokens=False)["input_ids"])
        assert raw[r["id"]] == len(smol_tokenizer(r["prompt"])["input_ids"]) < chat[r["id"]]
    with pytest.raises(ConfigError, match=r"prompt_format: chat \(the default\) .* has none"):
        generate(ds, config_for(tiny_base_model_dir, spec="none"))


def test_a_missing_column_is_named_before_any_worker_starts_where_the_schema_is_known(ray_session, tiny_model_dir, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    config = config_for(tiny_model_dir, spec="none")
    with pytest.raises(InputError, match=r"batchspec\.ray_data\.generate: needs a 'prompt'.*found \['question', 'task'\]"):
        generate(ray.data.from_items([{"question": "hi", "task": "x"}]), config)
    pq.write_table(pa.table({"prompt": ["hi"], "text": ["x"]}), tmp_path / "p.parquet")
    with pytest.raises(InputError, match=r"generate: shard_by column 'task' is not in the dataset; found \['prompt', 'text'\]"):
        generate(ray.data.read_parquet(str(tmp_path / "p.parquet")), config)
    with pytest.raises(InputError, match=r"generate: column 'text' clashes with the output column"):
        generate(ray.data.read_parquet(str(tmp_path / "p.parquet")), dataclasses.replace(config, shard_by=None))
    # a prior run is read when the stage is built, as by `batchspec run`
    with pytest.raises(ConfigError, match=r"^prior_run: .*nowhere has no stats/\*\.parquet"):
        generate(ray.data.from_items([{"prompt": "hi", "task": "x"}]), config_for(tiny_model_dir, prior_run=str(tmp_path / "nowhere")))


def test_the_stage_names_a_missing_column_of_a_batch_when_the_schema_was_not_known(tiny_model_dir):
    """A dataset whose schema appears only when it runs (after a map) is checked batch by batch: the
    stage itself, as the actor runs it, on a batch without a prompt column."""
    import pyarrow as pa

    from batchspec.pipeline import row_defaults
    from batchspec.ray_data import GenerateStage
    from batchspec.workers import WorkerJob

    config = config_for(tiny_model_dir, spec="none")
    job = WorkerJob(output=None, passthrough=pa.schema([]), out_schema=pa.schema([]), engine=config.engine, model=config.model,
                    draft_model=None, dtype=config.dtype, device=None, arms=(), calibrate=False, batch_size=4,
                    calibration=config.calibration, defaults=row_defaults(config), worker=config.worker)
    stage = GenerateStage(job, "task")
    with pytest.raises(InputError, match=r"batchspec\.ray_data\.generate: needs a 'prompt'.*found \['question', 'task'\]"):
        stage(pa.table({"question": ["hi"], "task": ["x"]}))


def test_a_batch_with_bytes_that_are_not_utf8_fails_one_row_not_the_batch(tiny_model_dir):
    """As a run reads its input (batchspec.read, batchspec.parse): an id or a shard key with bytes
    that are not UTF-8 is read with U+FFFD, a prompt that is not UTF-8 is its row's one-line error;
    the batch's other rows run."""
    import pyarrow as pa

    from batchspec.ray_data import GenerateStage

    def invalid_utf8(values: list[bytes]) -> pa.Array:
        return pa.array(values, pa.binary()).view(pa.string())

    config = config_for(tiny_model_dir, spec="none")
    batch = pa.table({"id": invalid_utf8([b"ok", b"bad \xff id", b"bad-prompt"]),
                      "prompt": invalid_utf8([b"Say hi.", b"Say hello.", b"bad \xfe prompt"]),
                      "task": invalid_utf8([b"chat", b"ch\xffat", b"chat"])})
    stage = GenerateStage(preflight_job(config), "task")
    out = stage(batch)
    rows = {r["id"]: r for r in out.select(["id", "shard_id", "text", "error"]).to_pylist()}
    assert set(rows) == {"ok", "bad \ufffd id", "bad-prompt"}
    assert rows["bad-prompt"]["error"] == "prompt is not valid UTF-8"
    assert rows["ok"]["error"] is None and rows["bad \ufffd id"]["error"] is None and rows["ok"]["text"] is not None
    assert rows["bad \ufffd id"]["shard_id"].startswith("ch_at-")  # its own key, read as "ch\ufffdat"
    assert rows["ok"]["shard_id"] == rows["bad-prompt"]["shard_id"]


def preflight_job(config):
    from batchspec import preflight

    return preflight.prepare(config).worker_job()
