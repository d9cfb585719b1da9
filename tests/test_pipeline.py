"""`pipeline.run` end to end on real local Ray and the torch engine with a tiny random model:
exactly one output row per input row, resume after a crash, a killed worker, refused OUTPUTs."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import fsspec
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchspec.config.run import build_config
from batchspec.errors import InputError, OutputError
from batchspec.errors import ConfigError
from batchspec.pipeline import row_defaults, run
from batchspec.stats import OUTPUT_NAMES
from batchspec.worker_pool import WorkerPool
from batchspec.workers import ShardWorker
from tests.data import prompts_table, write_parquet

FAST = {"window": 4, "measure_steps": 4}


def make_config(input, output, model, **overrides):
    options = dict(model=str(model), shard_by="task", shard_size=4, batch_size=4, max_tokens=6, workers=1, num_cpus=0.5, torch_threads=1)
    options.update(overrides)
    config = build_config(str(input), str(output), **options)
    import dataclasses

    return dataclasses.replace(config, calibration=tuple(FAST.items()))


@pytest.fixture(scope="module")
def pool(ray_session):
    """One pool for the module: the runs below that use the same engine share one loaded worker,
    as a program running several jobs in one process would (a fault test's worker class gets its own)."""
    with WorkerPool() as p:
        yield p


@pytest.fixture
def input_dir(tmp_path):
    table = prompts_table(12)
    # two bad rows: they must come out as error rows, not vanish
    prompts = table.column("prompt").to_pylist()
    prompts[3] = ""
    prompts[8] = "lorem ipsum " * 400  # longer than the tiny model's 512-token context
    temps = [None] * 12
    temps[5] = -1.0
    table = table.set_column(table.schema.get_field_index("prompt"), "prompt", pa.array(prompts))
    table = table.append_column("temperature", pa.array(temps, pa.float64()))
    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(table.slice(0, 7), folder / "part-0.parquet")
    pq.write_table(table.slice(7), folder / "part-1.parquet")
    return folder


def snapshot(out) -> dict[str, bytes]:
    """Every file a run wrote under OUTPUT, by relative path (the lease, which only says who writes, aside)."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and "_lease" not in p.parts}


def read_outputs(output, storage_options=None) -> pl.DataFrame:
    return pl.scan_parquet(f"{output}/outputs/*.parquet", storage_options=storage_options).collect()


def test_every_input_row_gets_exactly_one_output_row(pool, tiny_model_dir, input_dir, tmp_path):
    out = tmp_path / "out"
    summary = run(make_config(input_dir, out, tiny_model_dir), pool=pool)
    df = read_outputs(out)
    assert sorted(df["id"].to_list()) == [f"row-{i:04d}" for i in range(12)]
    assert df.columns == [*OUTPUT_NAMES, "task", "source"]
    errors = dict(zip(*df.filter(pl.col("finish_reason") == "error").select("id", "error").to_dict(as_series=False).values()))
    assert "context" in errors.pop("row-0008")
    assert errors == {"row-0003": "prompt is empty", "row-0005": "temperature must be a finite number >= 0, got -1.0"}
    ok = df.filter(pl.col("finish_reason") != "error")
    assert ok["text"].null_count() == 0 and (ok["output_tokens"] >= 1).all()
    assert set(df["source"].to_list()) == {f"src-{i}" for i in range(12)}
    stats = pl.read_parquet(f"{out}/stats/*.parquet")
    assert sorted(stats["shard_key"].to_list()) == ["code", "code", "prose", "prose"]
    assert stats["rows"].sum() == 12 and stats["error_rows"].sum() == 3
    assert (out / "_SUCCESS").exists()
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["totals"]["rows"] == 12 and manifest["plan_fingerprint"] == json.loads((out / "_plan.json").read_text())["fingerprint"]
    assert manifest["config"]["prompt_format"] == "chat" and set(stats["prompt_format"]) == {"chat"}, "the default, recorded"
    assert summary.complete and summary.rows == 12 and summary.error_rows == 3 and summary.shards == 4


def test_s3_input_and_output_read_back_with_polars(ray_session, tiny_model_dir, s3):
    url, options, polars_options = s3
    fs = fsspec.filesystem("s3", **options)
    write_parquet(fs, f"{url}/prompts/a.parquet", prompts_table(6, with_id=False))
    config = make_config(f"{url}/prompts/", f"{url}/runs/{{date}}", tiny_model_dir, shard_by=None, shard_size=3,
                         storage_options=options, run_date="2026-01-02", spec="none")
    summary = run(config)
    df = read_outputs(f"{url}/runs/2026-01-02", polars_options)
    assert sorted(df["id"].to_list()) == [f"a.parquet#{i}" for i in range(6)]
    assert fs.exists(f"{url}/runs/2026-01-02/_SUCCESS")
    assert fs.exists(f"{url}/runs/2026-01-02/_plan.json") and not fs.exists(f"{url}/runs/2026-01-02/_shards"), "removed after _SUCCESS"
    assert summary.shards == 2 and set(df["spec_method"].to_list()) == {"none"}


class AbortAfter:
    """A progress listener that crashes the driver after `n` committed shards."""

    def __init__(self, n: int):
        self.n, self.seen = n, 0

    def planned(self, shards: int, rows: int, skipped: int) -> None:
        pass

    def shard_done(self, outcome) -> None:
        self.seen += 1
        if self.seen >= self.n:
            raise RuntimeError(f"test: run aborted after {self.seen} committed shards")


def killing_worker(shard_ids: set[str], attempts: int, then_raise: int = 0) -> type[ShardWorker]:
    """A worker whose process dies (os._exit) mid-shard on the first `attempts` tries of these
    shards, and whose work raises on the `then_raise` tries after those."""

    class KillingWorker(ShardWorker):
        def process(self, task):
            if task.plan.shard_id in shard_ids and task.attempt <= attempts:
                os._exit(1)
            if task.plan.shard_id in shard_ids and task.attempt <= attempts + then_raise:
                raise RuntimeError(f"test: attempt {task.attempt} raised")
            return super().process(task)

    return KillingWorker


def test_crash_after_some_shards_then_resume_recomputes_nothing_committed(pool, tiny_model_dir, input_dir, tmp_path):
    out = tmp_path / "out"
    config = make_config(input_dir, out, tiny_model_dir)
    with pytest.raises(RuntimeError, match="aborted after 2"):
        run(config, progress=AbortAfter(2), pool=pool)
    assert not (out / "_SUCCESS").exists()
    done = {p.name: p.stat().st_mtime_ns for p in (out / "stats").glob("*.parquet")}
    assert len(done) == 2
    summary = run(config, pool=pool)
    assert summary.shards_skipped == 2 and summary.complete
    assert {p.name: p.stat().st_mtime_ns for p in (out / "stats").glob("*.parquet") if p.name in done} == done
    ids = read_outputs(out)["id"].to_list()
    assert len(ids) == len(set(ids)) == 12


def test_shards_are_removed_after_success_unless_kept_and_a_rerun_needs_none(pool, tiny_model_dir, input_dir, tmp_path):
    """_shards/ is intermediate: gone after _SUCCESS; --keep-shards keeps it, which is also what a
    crash between _SUCCESS and the removal leaves; the next run removes it and recomputes nothing."""
    out = tmp_path / "out"
    config = make_config(input_dir, out, tiny_model_dir, spec="none")
    kept = run(dataclasses.replace(config, keep_shards=True), pool=pool)
    assert kept.complete and (out / "_SUCCESS").exists() and len(list((out / "_shards").glob("*.parquet"))) == 4
    committed = {p.name: p.stat().st_mtime_ns for p in [*(out / "stats").iterdir(), *(out / "outputs").iterdir()]}
    for _ in range(2):  # the run that removes _shards/, then one that finds none: both resume every shard
        summary = run(config)
        assert summary.complete and summary.shards_skipped == 4 and not (out / "_shards").exists()
        assert {p.name: p.stat().st_mtime_ns for p in [*(out / "stats").iterdir(), *(out / "outputs").iterdir()]} == committed
    assert sorted(read_outputs(out)["id"].to_list()) == [f"row-{i:04d}" for i in range(12)]
    assert (out / "_SUCCESS").exists() and (out / "_plan.json").exists()


def test_worker_killed_mid_shard_is_replaced_and_the_shard_retried(ray_session, tiny_model_dir, input_dir, tmp_path):
    out = tmp_path / "out"
    summary = run(make_config(input_dir, out, tiny_model_dir), worker_cls=killing_worker({"00000-code"}, attempts=1))
    assert summary.retries == 1 and summary.shards_failed == 0
    df = read_outputs(out)
    assert sorted(df["id"].to_list()) == [f"row-{i:04d}" for i in range(12)]
    stats = pl.read_parquet(out / "stats" / "00000-code.parquet")
    assert stats["attempts"].to_list() == [2]
    assert stats["note"][0].startswith("attempt 1 failed: worker died")  # a retry that succeeds still says why it was needed
    assert pl.read_parquet(out / "stats" / "00001-code.parquet")["note"].to_list() == [None]


def test_a_shard_that_keeps_failing_is_written_as_error_rows_and_retried_by_the_next_run(ray_session, tiny_model_dir, input_dir, tmp_path):
    """A shard fails as a whole only when its engine does: its rows are error rows (nothing lost),
    the run writes no _SUCCESS (the CLI exits non-zero: tests/cli/test_run.py), and the next run
    retries that shard alone."""
    out = tmp_path / "out"
    config = make_config(input_dir, out, tiny_model_dir, max_attempts=3, workers=1)
    # a death, then work that raises twice (retried on the replacement): both kinds of failure count
    summary = run(config, worker_cls=killing_worker({"00001-code"}, attempts=1, then_raise=2))
    assert summary.shards_failed == 1 and summary.retries == 2 and summary.complete
    assert summary.failed_reason == "00001-code: shard failed 3 times: RuntimeError: test: attempt 3 raised"
    assert not (out / "_SUCCESS").exists() and not (out / "_manifest.json").exists()
    failed = read_outputs(out).filter(pl.col("shard_id") == "00001-code")
    assert failed.height == 2 and set(failed["finish_reason"]) == {"error"}
    assert failed["error"].str.starts_with("shard failed 3 times: RuntimeError: test: attempt 3 raised").all()
    stats = pl.read_parquet(out / "stats" / "00001-code.parquet")
    assert stats["note"][0] == failed["error"][0] and stats["attempts"].to_list() == [3]
    others = {p.name: p.stat().st_mtime_ns for p in (out / "stats").iterdir() if p.name != "00001-code.parquet"}
    again = run(config)
    assert again.shards_failed == 0 and again.shards_skipped == 3 and (out / "_SUCCESS").exists()
    assert not list((out / "_failed").iterdir()), "the retry that succeeded removed the mark"
    assert {p.name: p.stat().st_mtime_ns for p in (out / "stats").iterdir() if p.name != "00001-code.parquet"} == others
    retried = read_outputs(out).filter(pl.col("shard_id") == "00001-code")
    assert retried.height == 2 and "shard failed" not in str(retried["error"].to_list())


def test_a_different_plan_in_output_is_refused_and_no_resume_deletes_a_finished_run_only_when_forced(pool, tiny_model_dir, input_dir, tmp_path):
    out = tmp_path / "out"
    run(make_config(input_dir, out, tiny_model_dir, spec="none"), pool=pool)
    before = snapshot(out)
    with pytest.raises(OutputError, match=r"OUTPUT holds a run of a different input/plan \(fingerprint \w+ != \w+\); use a new OUTPUT "
                                          r"or --no-resume --force \(deleting its 4 committed shard\(s\)\)$"):
        run(make_config(input_dir, out, tiny_model_dir, spec="none", shard_size=6))
    with pytest.raises(OutputError, match=r"^OUTPUT .* holds a finished run \(4 committed shard\(s\), _SUCCESS\); --no-resume deletes it: "
                                          r"add --force to delete it and start over, or use another OUTPUT$"):
        run(make_config(input_dir, out, tiny_model_dir, spec="none", shard_size=6, resume=False), pool=pool)
    assert snapshot(out) == before, "refused: nothing written, nothing deleted"
    summary = run(make_config(input_dir, out, tiny_model_dir, spec="none", shard_size=6, resume=False), pool=pool, force=True)
    assert summary.shards == 2 and len(list((out / "outputs").glob("*.parquet"))) == 2


class Seen:
    """A progress listener that notes which actor committed each shard."""

    def __init__(self):
        self.actors = []

    def planned(self, shards: int, rows: int, skipped: int) -> None:
        pass

    def shard_done(self, outcome) -> None:
        self.actors.append(outcome.actor_id)


def test_a_pool_keeps_its_worker_loaded_for_the_next_run_which_runs_under_its_own_settings(pool, tiny_model_dir, input_dir, tmp_path):
    seen = Seen()
    first = run(make_config(input_dir, tmp_path / "a", tiny_model_dir, spec="none"), progress=seen, pool=pool)
    held = len(pool)
    assert first.complete and held >= 1
    second = run(make_config(input_dir, tmp_path / "b", tiny_model_dir, spec="none", max_tokens=2, shard_size=6), progress=seen, pool=pool)
    assert second.complete and second.shards == 2 and len(pool) == held
    assert len(seen.actors) == 6 and len(set(seen.actors)) == 1 and seen.actors[0], "one worker, loaded once, ran both runs"
    a, b = read_outputs(tmp_path / "a"), read_outputs(tmp_path / "b")
    assert sorted(b["id"].to_list()) == sorted(a["id"].to_list())
    ok = b.filter(pl.col("finish_reason") != "error")
    assert ok.height == 9 and ok["output_tokens"].max() <= 2 < a["output_tokens"].max(), "the second run's max_tokens, not the first's"
    # A run of another engine (two threads) stops the idle worker above to make room for its own,
    # and, failing, stops its own too: one may be mid-shard.
    with pytest.raises(RuntimeError, match="aborted after 1"):
        run(make_config(input_dir, tmp_path / "c", tiny_model_dir, spec="none", torch_threads=2), progress=AbortAfter(1), pool=pool)
    assert len(pool) == 0


def test_workers_are_shared_only_by_jobs_that_load_the_same_engine(tmp_path):
    from batchspec.workers import WorkerJob

    def job(output, **more):
        config = dataclasses.replace(make_config(tmp_path, output, "m"), **more)
        return WorkerJob(output=output, passthrough=pa.schema([]), out_schema=pa.schema([]), engine=config.engine,
                         model=config.model, draft_model=config.draft_model, dtype=config.dtype, device=config.device,
                         arms=(), calibrate=False, batch_size=config.batch_size, calibration=config.calibration,
                         defaults=row_defaults(config), worker=config.worker,
                         storage_options=tuple(config.storage_options))

    base = job("a").load_key()
    assert job("a", max_tokens=1).defaults != job("a").defaults
    assert job("b", max_tokens=1, batch_size=2, temperature=0.5).load_key() == base, "output and per-run settings do not matter"
    assert job("b", worker=dataclasses.replace(make_config(tmp_path, "b", "m").worker, max_attempts=9)).load_key() == base
    worker = make_config(tmp_path, "b", "m").worker
    for other in (dict(model="n"), dict(dtype="bfloat16"), dict(draft_model="d"), dict(device="cpu"), dict(engine="trtllm"),
                  dict(storage_options=(("key", "k"),)), dict(worker=dataclasses.replace(worker, num_cpus=1.0)),
                  dict(worker=dataclasses.replace(worker, torch_threads=2)), dict(worker=dataclasses.replace(worker, num_gpus=1.0))):
        assert job("a", **other).load_key() != base, other
    assert dataclasses.replace(job("a"), llm_options=(("max_batch_size", 8),)).load_key() != base

    # An adopted worker keeps its engine's cost table, not the last run's keys (their arms and rows).
    from types import SimpleNamespace

    from batchspec.calibrate import WorkerState
    from batchspec.engine.base import SpecConfig

    worker = ShardWorker(job("a"))
    worker.engine = SimpleNamespace(model_name="m")
    worker.calibration = WorkerState(last={"code": SpecConfig("ngram", 4)}, history={"code": [{}]})
    costs = worker.calibration.costs
    assert worker.adopt(job("b", max_tokens=1)) == "m" and worker.job.output == "b"
    assert worker.calibration.costs is costs and not worker.calibration.last and not worker.calibration.history
    with pytest.raises(AssertionError, match="only a job of its own engine"):
        worker.adopt(job("c", model="n"))


def test_input_and_output_problems_stop_before_any_work(ray_session, tiny_model_dir, tmp_path, s3):
    url, options, _ = s3
    pq.write_table(pa.table({"question": ["hi"]}), tmp_path / "q.parquet")
    with pytest.raises(InputError, match=r"needs a 'prompt'.*found \['question'\]"):
        run(make_config(tmp_path / "q.parquet", tmp_path / "out1", tiny_model_dir))
    assert not (tmp_path / "out1" / "_plan.json").exists()
    pq.write_table(prompts_table(3), tmp_path / "p.parquet")
    with pytest.raises(OutputError, match=r"cannot write OUTPUT s3://missing-bucket/out"):
        run(make_config(tmp_path / "p.parquet", "s3://missing-bucket/out", tiny_model_dir, storage_options=options))


def test_a_model_without_a_chat_template_is_refused_under_chat_before_any_work_and_runs_raw(pool, tiny_base_model_dir, input_dir, tmp_path):
    """prompt_format chat (the default) needs a chat template, as a chat endpoint does: a base model
    stops the run before anything is written, in one line naming the key; raw runs it, and the
    manifest and every stats row say which format ran."""
    with pytest.raises(ConfigError, match=r"^prompt_format: chat \(the default\) .* has none; set prompt_format: raw \(--prompt-format raw\)"):
        run(make_config(input_dir, tmp_path / "chat", tiny_base_model_dir), pool=pool)
    assert not (tmp_path / "chat").exists()
    out = tmp_path / "raw"
    summary = run(make_config(input_dir, out, tiny_base_model_dir, prompt_format="raw", spec="none"), pool=pool)
    assert summary.complete and summary.prompt_format == "raw"
    assert set(pl.read_parquet(f"{out}/stats/*.parquet")["prompt_format"]) == {"raw"}
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["config"]["prompt_format"] == "raw" and manifest["totals"]["prompt_format"] == "raw"


def test_the_empty_text_warning_needs_a_tenth_of_the_rows_that_ran():
    from batchspec.pipeline import RunSummary

    def summary(rows, errors, empty, fmt="chat"):
        return RunSummary("out", rows, errors, 1, 0, 0, 0, 10, 1.0, 1.0, None, None, True, prompt_format=fmt, empty_rows=empty)

    assert summary(20, 0, 1).empty_text_warning is None and summary(12, 2, 0).empty_text_warning is None
    assert summary(20, 0, 2).empty_text_warning.startswith("2 of 20 rows returned an empty text")
    assert "of 10 rows" in summary(12, 2, 1).empty_text_warning, "error rows did not run"
    assert "try --prompt-format chat" in summary(20, 0, 20, "raw").empty_text_warning


def test_a_worker_refuses_a_model_without_a_chat_template_once_it_has_it(tmp_path, tiny_base_model_dir):
    """A model given by URL reaches the machine only in the worker: the worker checks it there, and
    the one line stops the run (a BatchspecError is not retried)."""
    from batchspec.workers import WorkerJob

    config = make_config(tmp_path, tmp_path / "out", tiny_base_model_dir)
    job = WorkerJob(output=None, passthrough=pa.schema([]), out_schema=pa.schema([]), engine="torch", model=str(tiny_base_model_dir),
                    draft_model=None, dtype="float32", device="cpu", arms=(), calibrate=False, batch_size=1, calibration=(),
                    defaults=row_defaults(config), worker=config.worker)
    with pytest.raises(ConfigError, match=r"model '.*tiny-base.*' has none; set prompt_format: raw"):
        ShardWorker(job).start()


# ---- `batchspec calibrate`'s sample: the run's plan, each key's first shard read alone ---------------


def first_rows_per_key(tables: list[pa.Table], shard_size: int) -> list[tuple[str | None, int, list[str]]]:
    """The reference, from every row in memory: per key (sorted, null last), its row count and the
    ids of its first `shard_size` rows in input order."""
    rows = [r for t in tables for r in t.to_pylist()]
    keys = sorted({r["task"] for r in rows}, key=lambda k: (k is None, k or ""))
    return [(k, sum(r["task"] == k for r in rows), [r["id"] for r in rows if r["task"] == k][:shard_size]) for k in keys]


def test_calibration_samples_of_the_examples_are_each_keys_first_rows():
    from batchspec.calibrate_keys import calibration_samples

    examples = pq.read_table("examples/prompts.parquet")
    config = build_config("examples/prompts.parquet", "", shard_by="task", shard_size=5)
    samples = calibration_samples(config)
    assert [(s.shard_key, s.rows, [p.request.id for p in s.parsed]) for s in samples] == first_rows_per_key([examples], 5)
    prompts = dict(zip(examples.column("id").to_pylist(), examples.column("prompt").to_pylist()))
    assert all(p.request.messages == ({"role": "user", "content": prompts[p.request.id]},) for s in samples for p in s.parsed)


@pytest.mark.parametrize("path", ["in-process", "ray-data"])
def test_calibration_samples_span_files_and_row_groups_with_a_null_key(request, tmp_path, monkeypatch, path):
    """Two files of several row groups, interleaved keys, a null key, a key whose first shard spans both files."""
    from batchspec import plan
    from batchspec.calibrate_keys import calibration_samples

    if path == "ray-data":
        request.getfixturevalue("ray_session")
        monkeypatch.setattr(plan, "LOCAL_BYTES", 0)  # plan with Ray Data whatever the input's size
    table = prompts_table(14, tasks=("a", "b", None, "b", "c"))
    (tmp_path / "in").mkdir()
    pq.write_table(table.slice(0, 8), tmp_path / "in" / "p0.parquet", row_group_size=3)
    pq.write_table(table.slice(8), tmp_path / "in" / "p1.parquet", row_group_size=2)
    config = build_config(str(tmp_path / "in"), "", shard_by="task", shard_size=4, max_tokens=3)
    samples = calibration_samples(config)
    assert [(s.shard_key, s.rows, [p.request.id for p in s.parsed]) for s in samples] == first_rows_per_key([table], 4)
    assert samples[-1].shard_key is None and all(p.request.params.max_tokens == 3 for s in samples for p in s.parsed)


# ---- a run is bound to its options ---------------------------------------------------------------


def test_a_resume_or_rerun_with_other_options_is_refused_and_the_output_stays_as_it_was(pool, tiny_model_dir, input_dir, tmp_path):
    """Killed half-way, resumed with another max_tokens and temperature: refused in one line naming
    both, nothing written; resumed as it was: finished; rerun with other options: refused, the
    manifest byte for byte as it was. Calibration settings and the batch size may differ."""
    out = tmp_path / "out"
    config = make_config(input_dir, out, tiny_model_dir, spec="none")
    with pytest.raises(RuntimeError, match="aborted after 2"):
        run(config, progress=AbortAfter(2), pool=pool)
    before = snapshot(out)
    other = dataclasses.replace(config, max_tokens=8, temperature=0.7)
    with pytest.raises(OutputError) as refused:
        run(other, pool=pool)
    assert str(refused.value) == ("OUTPUT holds 2 shard(s) made with other options (max_tokens: 6 != 8; temperature: 0.0 != 0.7); "
                                  "use another OUTPUT, or --no-resume --force (deleting its 2 committed shard(s)) to start over")
    assert snapshot(out) == before
    summary = run(config, pool=pool)
    assert summary.complete and summary.shards_skipped == 2 and (out / "_SUCCESS").exists()
    finished = snapshot(out)
    for changed, named in [(dict(prompt_format="raw"), "prompt_format: chat != raw"), (dict(seed=1), "seed: 0 != 1"),
                           (dict(spec="auto"), 'arms: ["none"] != ["ngram:k='), (dict(model=str(input_dir)), "model: ")]:
        with pytest.raises(OutputError, match=re.escape(named)):
            run(dataclasses.replace(config, **changed), pool=pool)
        assert snapshot(out) == finished, changed
    same = dataclasses.replace(config, batch_size=2, calibration=(("window", 8),), workers=2)
    assert run(same, pool=pool).shards_skipped == 4
    assert snapshot(out) == finished, "a rerun with nothing to do leaves the manifest as it was"
    manifest = json.loads((out / "_manifest.json").read_text())
    plan = json.loads((out / "_plan.json").read_text())
    assert manifest["run_identity"] == plan["identity"] and plan["identity"]["options"]["max_tokens"] == 6
    assert plan["identity"]["options"]["model_fingerprint"].startswith("files:")


def test_a_planned_output_with_nothing_committed_takes_the_options_of_the_run_that_uses_it(pool, tiny_model_dir, input_dir, tmp_path):
    """--plan-only fixes the plan, not the options: with no shard committed nothing can mix, so the
    run that follows binds the plan to its own options."""
    from batchspec.pipeline import plan_run

    out = tmp_path / "out"
    planned = plan_run(make_config(input_dir, out, tmp_path / "no-model-yet", spec="none"))
    assert planned.plan.identity.options["model_fingerprint"] is None
    summary = run(make_config(input_dir, out, tiny_model_dir, spec="none", max_tokens=3), pool=pool)
    assert summary.complete and summary.shards_skipped == 0
    assert json.loads((out / "_plan.json").read_text())["identity"]["options"]["max_tokens"] == 3
