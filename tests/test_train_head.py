"""train_head (batchspec.heads, workers.ShardWorker): each shard key's first shard records its
rows' hidden states as they decode and trains an EAGLE-3 head after them, written under
OUTPUT/heads/<key>/ (released format, training.json last); the key's later shards and a later
run with --prior-run take it among their arms without training again; a head without its mark
is never read."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import torch

from batchspec.config.run import build_config
from batchspec.engine.base import NO_SPEC, SpecConfig
from batchspec.engine.eagle3_format import is_head
from batchspec.errors import ConfigError
from batchspec.heads import MARK, HeadStore, head_name, with_head
from batchspec.pipeline import run
from batchspec.worker_pool import WorkerPool
from batchspec.write import Output
from tests.test_pipeline import input_dir, make_config  # noqa: F401  (input_dir: a fixture)


@pytest.mark.parametrize("options, message", [
    ({"spec": "none"}, "train_head: a trained head needs engine torch and spec auto, got engine torch and spec none"),
    ({"engine": "trtllm"}, "train_head: a trained head needs engine torch and spec auto, got engine trtllm"),
])
def test_train_head_needs_spec_auto_on_the_torch_engine(tmp_path, options, message):
    with pytest.raises(ConfigError, match=message) as caught:
        build_config("in", "out", train_head=True, **options)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("line, message", [
    ("train_head: 1", "train_head"), ("train_head_budget: 0", "train_head_budget"),
    ("train_head_budget: 1.5", "train_head_budget"), ("train_head_budget: '0.1'", "train_head_budget"),
])
def test_bad_train_head_keys_are_one_line_naming_the_key(tmp_path, line, message):
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(line + "\n")
    with pytest.raises(ConfigError, match=message) as caught:
        build_config("in", "out", str(pipeline))
    assert str(pipeline) in str(caught.value) and "\n" not in str(caught.value)


def test_the_budget_defaults_to_a_twentieth_and_the_flag_to_off():
    config = build_config("in", "out")
    assert (config.train_head, config.train_head_budget) == (False, 0.05)


def test_a_head_without_its_mark_is_not_found_and_names_are_file_names(tmp_path):
    store = HeadStore(Output(str(tmp_path)))
    folder = tmp_path / "heads" / "code"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert store.find("code") is None, "a head whose training.json was never written is half a head"
    (folder / MARK).write_text("{}")
    assert store.find("code") == str(folder)
    assert head_name(None) == "_all" and head_name("code") == "code"
    assert head_name("a/b") != head_name("a_b") and "/" not in head_name("a/b") and head_name("../x").startswith("x-")


def test_a_trained_head_joins_the_arms_once_per_draft_length_not_taken():
    arms = [SpecConfig("ngram", 2), SpecConfig("eagle3", 4, draft_model="published")]
    joined = with_head(arms, "/h")
    assert [a.label for a in joined] == [a.label for a in arms] + ["eagle3:k=2"]
    assert joined[-1].draft_model == "/h"


def _stats(out) -> list[dict]:
    return pl.read_parquet(f"{out}/stats/*.parquet").sort("shard_id").to_dicts()


def test_a_run_trains_one_head_per_key_that_later_shards_and_runs_reuse(ray_session, tiny_model_dir, input_dir, tmp_path):
    with WorkerPool() as pool:
        out = tmp_path / "out"
        run(make_config(input_dir, out, tiny_model_dir, train_head=True, train_head_budget=1.0), pool=pool)
        stats = _stats(out)
        trained = [s for s in stats if s["head_train_s"] is not None]
        assert sorted(s["shard_key"] for s in trained) == ["code", "prose"], "one training per key, on its first shard"
        later = [s for s in stats if s["head_train_s"] is None]
        assert sorted(s["shard_key"] for s in later) == ["code", "prose"]
        for s in later:  # the key's head among its arms: calibration priced it like any arm
            assert s["head"] == f"heads/{s['shard_key']}"
            assert {("eagle3", 2), ("eagle3", 4)} <= {(c["method"], c["draft_len"]) for c in s["candidates"]}
        for key in ("code", "prose"):
            folder = out / "heads" / key
            assert is_head(folder)
            doc = json.loads((folder / MARK).read_text())
            assert doc["shard_key"] == key and doc["rows"] >= 1 and doc["steps"] >= 1 and doc["tokens"] > 0
            assert doc["seconds"] <= doc["budget_s"] + 1.0 and set(doc["mean_accepted_len"]) <= {"2", "4"}

        again = tmp_path / "again"
        run(make_config(input_dir, again, tiny_model_dir, train_head=True, train_head_budget=1.0, prior_run=str(out)), pool=pool)
        assert not (again / "heads").exists(), "the prior run's heads were reused, none trained"
        assert all(s["head_train_s"] is None and s["head"] == str(out / "heads" / s["shard_key"]) for s in _stats(again))

    from batchspec.engine.torch.engine import TorchEngine
    from batchspec.pipeline import row_defaults
    from batchspec.parse import parse_rows

    engine = TorchEngine.load(str(tiny_model_dir), draft_model=str(out / "heads" / "code"))  # as --draft-model loads it
    table = pl.read_parquet(f"{input_dir}/*.parquet").to_arrow()
    defaults = row_defaults(make_config(input_dir, out, tiny_model_dir))
    requests = [p.request for p in parse_rows(table, table.column("id").to_pylist(), defaults) if p.error is None]
    plain = engine.generate(requests, NO_SPEC, 4)
    headed = engine.generate(requests, SpecConfig("eagle3", 3, draft_model=str(out / "heads" / "code")), 4)
    assert [c.token_ids for c in headed.completions] == [c.token_ids for c in plain.completions]


def test_a_key_starts_under_its_own_head_not_the_one_another_key_ended_under():
    from batchspec.calibrate import WorkerState

    state = WorkerState()
    state.remember("a", SpecConfig("eagle3", 2, draft_model="heads/a"), [])
    arms = [SpecConfig("ngram", 2), SpecConfig("eagle3", 2, draft_model="heads/b")]
    arm = state.start("b", None, arms).arm
    assert arm.label == "eagle3:k=2" and arm.draft_model == "heads/b"


def _head_files(folder) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes(name.encode())


def test_a_commit_that_dies_before_its_mark_leaves_no_head_and_a_store_head_is_copied_here(tmp_path, monkeypatch):
    local = tmp_path / "made"
    _head_files(local)
    output = Output(str(tmp_path / "out"))
    store = HeadStore(output)
    real = Output.put

    def dying(self, path, data):
        if path.endswith(MARK):
            raise OSError("killed")
        return real(self, path, data)

    monkeypatch.setattr(Output, "put", dying)
    with pytest.raises(OSError):
        store.commit("code", str(local), {"steps": 1})
    assert (tmp_path / "out" / "heads" / "code" / "model.safetensors").exists() and store.find("code") is None
    monkeypatch.setattr(Output, "put", real)
    assert store.commit("code", str(local), {"steps": 1}) == str(tmp_path / "out" / "heads" / "code")
    assert store.find("code") == str(tmp_path / "out" / "heads" / "code")

    remote = HeadStore(Output("memory://trainhead-store"), prior=None)
    assert remote.commit("prose", str(local), {"steps": 2}) == str(local)
    copied = HeadStore(Output("memory://elsewhere"), prior=Output("memory://trainhead-store")).find("prose")
    assert copied is not None and copied != str(local)
    assert {p.name: p.read_bytes() for p in Path(copied).iterdir()} == {
        "config.json": b"config.json", "model.safetensors": b"model.safetensors", MARK: b'{\n "steps": 2\n}\n'}


def test_a_head_whose_training_fails_leaves_the_shards_rows_as_they_are(tiny_model_dir, tmp_path, monkeypatch):
    """The head is an option: a training that raises costs the shard no row (the rows it decoded
    are its output, as without train_head), and the stats say why there is no head."""
    import pyarrow as pa

    from batchspec.engine.torch.engine import TorchEngine
    from batchspec.parse import parse_rows
    from batchspec.preflight import prepare
    from batchspec.workers import ShardWorker
    from tests.data import prompts_table

    config = make_config(tmp_path, tmp_path / "out", tiny_model_dir, train_head=True, train_head_budget=1.0)
    worker = ShardWorker(prepare(config).worker_job(Output(str(tmp_path / "out"))))
    worker.start()

    def broken(self, *args, **kwargs):
        raise RuntimeError("out of memory\nwhile training")

    monkeypatch.setattr(TorchEngine, "train_head", broken)
    table = prompts_table(4)
    parsed = parse_rows(table, table.column("id").to_pylist(), prepare(config).defaults)
    done = worker.generate("00000-code", "code", parsed, trains_head=True, key_rows=40)
    assert [c.error for c in done.completions] == [None] * 4 and all(c.token_ids for c in done.completions)
    assert done.stats.head is None and done.stats.head_train_s is not None
    assert "head: not trained (out of memory while training)" in done.stats.caveats
    assert not (tmp_path / "out" / "heads").exists()


def test_a_job_that_runs_a_published_head_trains_each_keys_head_from_it(tiny_model_dir, tmp_path):
    """A job whose arms run a published EAGLE-3 head (a candidates entry naming it, or
    `--draft-model` a head folder) and train a head per key: the key's head is that head trained further on the key's rows (its draft
    vocabulary kept), and training.json names where it started."""
    from batchspec.engine.torch.engine import TorchEngine
    from batchspec.engine.torch.eagle3_release import load_head
    from batchspec.parse import parse_rows
    from batchspec.preflight import prepare
    from batchspec.workers import ShardWorker
    from tests.data import prompts_table
    from tests.engine.torch.eagle3_heads import released, write

    target = TorchEngine.load(str(tiny_model_dir)).model
    vocab = target.config.vocab_size  # a draft vocabulary of all of it: the rows' tokens are in it
    config_doc, weights = released(target, draft_vocab=vocab)
    published = write(tmp_path / "published", config_doc, weights)
    configs = Path(__file__).resolve().parents[1] / "batchspec" / "data" / "trt_configs"
    candidates = tmp_path / "candidates.yaml"
    candidates.write_text(f"candidates:\n  - config: {configs / 'ngram.yaml'}\n    max_draft_len: [2]\n"
                          f"  - config: {configs / 'eagle3.yaml'}\n    max_draft_len: [2]\n    speculative_model_dir: {published}\n")
    config = make_config(tmp_path, tmp_path / "out", tiny_model_dir, train_head=True, train_head_budget=1.0,
                         candidates=str(candidates))
    job = prepare(config).worker_job(Output(str(tmp_path / "out")))
    assert [(a.label, a.draft_model) for a in job.arms if a.method == "eagle3"] == [("eagle3:k=2", str(published))]
    worker = ShardWorker(job)
    worker.start()
    table = prompts_table(4)
    parsed = parse_rows(table, table.column("id").to_pylist(), prepare(config).defaults)
    done = worker.generate("00000-code", "code", parsed, trains_head=True, key_rows=40)
    assert [c.error for c in done.completions] == [None] * 4 and done.stats.head == "heads/code"
    doc = json.loads((tmp_path / "out" / "heads" / "code" / MARK).read_text())
    assert doc["started_from"] == str(published) and doc["draft_vocab_size"] == vocab
    assert torch.equal(load_head(tmp_path / "out" / "heads" / "code", target).d2t, weights["d2t"])
