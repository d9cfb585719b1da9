"""One preflight (batchspec.preflight.prepare) for `batchspec run`, `run --plan-only`, `batchspec
calibrate` and the Ray Data stage: each of them calls it before anything else, and what it hands on
is what the run used to assemble itself."""

from __future__ import annotations

import pytest

from batchspec import preflight
from batchspec.config.run import build_config
from batchspec.errors import ConfigError


class Called(Exception):
    pass


@pytest.fixture
def spy(monkeypatch):
    calls = []

    def prepare(config, where="run"):
        calls.append(where)
        raise Called

    monkeypatch.setattr(preflight, "prepare", prepare)
    return calls


def test_run_plan_calibrate_and_the_ray_data_stage_each_prepare_through_it(spy, tmp_path):
    from batchspec.calibrate_keys import calibrate_only
    from batchspec.pipeline import plan_run, run
    from batchspec.ray_data import generate

    config = build_config(str(tmp_path / "in.parquet"), str(tmp_path / "out"), spec="none")
    for call in (lambda: run(config), lambda: plan_run(config), lambda: calibrate_only(config), lambda: generate(object(), config)):
        with pytest.raises(Called):
            call()
    assert spy == ["run", "run", "run", "ray_data.generate"]
    assert not (tmp_path / "out").exists()


def test_prepare_checks_the_spec_and_hands_on_the_arms_defaults_and_worker_job(tmp_path):
    config = build_config("in", "out", spec="auto", max_tokens=5)
    job = preflight.prepare(config)
    assert job.calibrate and [a.label for a in job.arms] == ["ngram:k=2", "ngram:k=4", "ngram:k=6"]
    assert job.config.run_date is not None and job.defaults.max_tokens == 5 and job.llm_options == {}
    work = job.worker_job()
    assert (work.output, work.arms, work.calibrate, work.defaults) == (None, job.arms, True, job.defaults)
    bad = tmp_path / "bad.yaml"
    bad.write_text("speculative_config:\n  decoding_type: NGram\n  max_draft_len: 0\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: speculative_config\.max_draft_len: expected an integer >= 1, got 0"):
        preflight.prepare(build_config("in", "out", spec=str(bad)))
