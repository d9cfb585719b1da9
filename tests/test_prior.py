"""A previous run's choices as this run's starting points (`prior_run`, batchspec.prior): each key's
first shard starts under the arm that run predicted best for it, only from shards of the same
engine, model and batch size; where an arm is a build, only a worker's first engine; a path with no
run's stats is refused before any work; a templated prior_run is the newest earlier run it names
(local and on S3), none a cold start; end to end over two runs of the tiny model."""

from __future__ import annotations

import dataclasses
import datetime as dt

import polars as pl
import pytest

from batchspec.calibrate import WorkerState
from batchspec.engine.base import NO_SPEC, SpecConfig
from batchspec.errors import ConfigError
from batchspec.pipeline import run
from batchspec.prior import LOOKBACK_DAYS, WHY, best_arms, find_prior, prior_of, prior_seeds
from batchspec.stats import ArmResult, ShardStats
from batchspec.worker_pool import WorkerPool
from tests.test_pipeline import input_dir, make_config  # noqa: F401  (input_dir: a fixture)

ARMS = [SpecConfig("ngram", k) for k in (2, 4, 8)]


def shard(key, predicted: dict[int, float], rows=10, engine="torch", model="m", batch=8, source="calibrated"):
    candidates = [ArmResult("none", 0, predicted_speedup=1.0)]
    candidates += [ArmResult("ngram", k, predicted_speedup=s) for k, s in predicted.items()]
    return ShardStats(shard_id=f"{key}-{rows}", shard_key=key, rows=rows, error_rows=0, engine=engine, model=model,
                      batch_size=batch, candidates=candidates, decision_source=source)


def test_each_key_gets_its_arm_predicted_best_weighted_by_rows_over_matching_shards():
    stats = [
        shard("code", {2: 1.3, 4: 1.5}, rows=30), shard("code", {2: 1.4, 4: 1.0}, rows=10),  # k=4: 1.375, k=2: 1.325
        shard("prose", {2: 0.9, 4: 0.8}),  # nothing above plain decoding
        shard("edit", {8: 3.0, 6: 4.0}),  # k=6 is not an arm of this run
        shard("extract", {2: 2.0}, batch=32), shard("extract", {2: 2.0}, engine="trtllm"),
        shard("extract", {2: 2.0}, model="other"), shard("extract", {2: 2.0}, source="fixed"),
    ]
    assert best_arms(stats, "torch", "m", 8, ARMS) == {"code": ARMS[1], "prose": NO_SPEC, "edit": ARMS[2]}


def test_where_an_arm_is_a_build_every_key_starts_from_the_jobs_best_weighted_by_all_its_rows(monkeypatch):
    """A TensorRT-LLM worker's first engine runs every key the worker meets (no build repays on a
    short job), so the prior picks it by the whole job: code's k=2 edge of 1% over k=4 on 10 rows
    does not make k=2 the engine of a worker that meets code first, where prose's 90 rows gain 10%
    under k=4. Read from a run's stats, `prior_seeds` does this for trtllm, whose arms are builds."""
    stats = [shard("code", {2: 1.41, 4: 1.40}, rows=10, engine="trtllm"), shard("prose", {2: 1.3, 4: 1.43}, rows=90, engine="trtllm"),
             shard("edit", {2: 2.0, 4: 9.0}, rows=500, engine="torch")]  # another engine's: not counted
    assert best_arms(stats, "trtllm", "m", 8, ARMS) == {"code": ARMS[0], "prose": ARMS[1]}
    assert best_arms(stats, "trtllm", "m", 8, ARMS, one_engine=True) == {"code": ARMS[1], "prose": ARMS[1]}
    assert best_arms([shard("code", {2: 0.9}, engine="trtllm")], "trtllm", "m", 8, ARMS, one_engine=True) == {"code": NO_SPEC}
    assert best_arms([], "trtllm", "m", 8, ARMS, one_engine=True) == {}

    class Run:  # a run's OUTPUT holding these stats
        def __init__(self, url, options):
            pass

        def committed(self):
            return ["s0"]

        def read_stats(self, shard_ids):
            return [dataclasses.replace(s, engine=e) for s in stats[:2] for e in ("torch", "trtllm")]

    monkeypatch.setattr("batchspec.prior.Output", Run)
    assert prior_seeds("run", {}, "trtllm", "m", 8, ARMS) == {"code": ARMS[1], "prose": ARMS[1]}
    assert prior_seeds("run", {}, "torch", "m", 8, ARMS) == {"code": ARMS[0], "prose": ARMS[1]}


def test_which_engines_arms_are_builds_is_the_engine_classes_own():
    from batchspec.engine.factory import ENGINES, arms_are_builds
    from batchspec.engine.torch.engine import TorchEngine
    from batchspec.engine.trtllm.adapter import TrtllmEngine

    classes = {"torch": TorchEngine, "trtllm": TrtllmEngine}
    assert set(classes) == set(ENGINES)
    assert all(arms_are_builds(name) is cls.arms_are_builds for name, cls in classes.items())


def test_a_prior_starts_a_key_new_to_the_worker_and_rebuilds_no_live_engine():
    worker = WorkerState()
    assert worker.start("code", ARMS[0], ARMS, prior_why=WHY) == (ARMS[0], WHY, True)
    # where arms are builds: a worker with no engine yet builds the prior's arm first ...
    assert worker.start("code", ARMS[0], ARMS, builds=True, prior_why=WHY) == (ARMS[0], WHY, True)
    worker.remember("code", ARMS[2], [])
    # ... and one with a live engine starts a new key under it: the rule prices a rebuild
    assert worker.start("prose", ARMS[0], ARMS, builds=True, prior_why=WHY)[0] == ARMS[2]
    assert worker.start("prose", ARMS[0], ARMS, prior_why=WHY) == (ARMS[0], WHY, True)  # free switches: the prior
    assert worker.start("code", ARMS[0], ARMS, prior_why=WHY)[0] == ARMS[2]  # the key's own last shard first


def test_a_prior_run_without_stats_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^prior_run: .*nowhere has no stats/\*\.parquet \(expected the OUTPUT of a batchspec run\)$"):
        prior_seeds(str(tmp_path / "nowhere"), {}, "torch", "m", 8, ARMS)


def committed_run(fs_root, name: str, fs=None) -> None:
    """A run's OUTPUT as `find_prior` sees it: one committed shard's stats object."""
    if fs is None:
        (fs_root / name / "stats").mkdir(parents=True)
        (fs_root / name / "stats" / "s0.parquet").write_bytes(b"")
    else:
        fs.pipe(f"{fs_root}/{name}/stats/s0.parquet", b"")


TODAY = dt.date(2026, 12, 6)


def test_a_templated_prior_run_is_the_newest_earlier_run_it_names(tmp_path):
    for name in ("2026-12-06", "2026-12-03", "2026-11-20"):  # this run's own folder is never its prior
        committed_run(tmp_path, name)
    (tmp_path / "2026-12-05").mkdir()  # a night that planned and committed nothing
    template = str(tmp_path / "{date}")
    assert find_prior(template, {}, TODAY) == str(tmp_path / "2026-12-03")
    assert find_prior(template, {}, dt.date(2026, 12, 3)) == str(tmp_path / "2026-11-20")
    assert find_prior(template, {}, dt.date(2026, 11, 20)) is None
    assert find_prior(template, {}, TODAY + dt.timedelta(days=LOOKBACK_DAYS + 3)) is None  # beyond the look-back
    committed_run(tmp_path, "2026-11")
    assert find_prior(str(tmp_path / "{yyyy}-{mm}"), {}, TODAY) == str(tmp_path / "2026-11")  # a monthly job: last month
    assert find_prior(str(tmp_path / "fixed"), {}, TODAY) == str(tmp_path / "fixed")  # no template: the path as given
    with pytest.raises(ConfigError, match=r"^prior_run: path .*unknown template field"):
        find_prior(str(tmp_path / "{day}"), {}, TODAY)


def test_a_templated_prior_run_on_s3(s3):
    import s3fs

    bucket, options, _ = s3
    committed_run(f"{bucket}/runs", "2026-12-04", s3fs.S3FileSystem(**options))
    assert find_prior(f"{bucket}/runs/{{date}}", options, TODAY) == f"{bucket}/runs/2026-12-04"
    assert find_prior(f"{bucket}/other/{{date}}", options, TODAY) is None


def test_no_earlier_run_is_a_cold_start_said_in_one_line(tmp_path):
    config = dataclasses.replace(make_config(tmp_path, tmp_path / "out", "m"), prior_run=str(tmp_path / "{date}"),
                                 run_date=TODAY)
    prior = prior_of(config, ARMS, calibrate=True)
    assert prior.seeds == {} and prior.note == (f"none: no run of {tmp_path}/{{date}} in the {LOOKBACK_DAYS} days "
                                                "before this one (a cold start)")
    assert prior_of(config, ARMS, calibrate=False).note is None  # a fixed arm: no prior read


@pytest.fixture(scope="module")
def pool(ray_session):
    with WorkerPool() as p:
        yield p


def test_a_run_starts_each_key_where_the_prior_run_predicted_best(pool, tiny_model_dir, input_dir, tmp_path):  # noqa: F811
    # a nightly job: OUTPUT and prior_run one template; the second night reads the first (a night skipped)
    template = str(tmp_path / "runs" / "{date}")
    first = dataclasses.replace(make_config(input_dir, template, tiny_model_dir), run_date=TODAY - dt.timedelta(days=2))
    assert run(first, pool=pool).complete
    first_out = str(tmp_path / "runs" / "2026-12-04")
    before = [ShardStats.from_row(r) for r in pl.read_parquet(f"{first_out}/stats/*.parquet").to_dicts()]
    arms = [SpecConfig(a.method, a.draft_len) for a in before[0].candidates if a.method != "none"]
    expected = best_arms(before, "torch", first.model, first.batch_size, arms)
    assert set(expected) == {"code", "prose"}
    second = dataclasses.replace(make_config(input_dir, template, tiny_model_dir), prior_run=template, run_date=TODAY)
    summary = run(second, pool=pool)
    assert summary.complete and summary.rows == 12 and summary.prior_run == first_out
    after = pl.read_parquet(f"{tmp_path / 'runs' / '2026-12-06'}/stats/*.parquet").sort("shard_id")
    firsts = {}
    for row in after.to_dicts():
        firsts.setdefault(row["shard_key"], row["events"][0])
    assert {k: (e["arm"], e["reason"]) for k, e in firsts.items()} == {k: (a.label, WHY) for k, a in expected.items()}
    with pytest.raises(ConfigError, match="prior_run: .*has no stats"):
        run(dataclasses.replace(second, output=str(tmp_path / "third"), prior_run=str(tmp_path / "empty")), pool=pool)
    assert not (tmp_path / "third").exists(), "refused before any work"
