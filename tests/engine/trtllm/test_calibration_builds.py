"""Calibration when an arm is a build (docs/calibration.md "Engines"), over the stand-in whose LLM
builds take simulated time: one live LLM per worker, build seconds counted as calibration cost, a
build run only where the rows left repay it, within a cap per worker, a key's later shard judging
on its last rows. And a run where no speculative arm could be measured says so (stats, summary,
report, exit status)."""

from __future__ import annotations

import dataclasses
from importlib.resources import files

from click.testing import CliRunner

from batchspec.calibrate import CalibrationSettings, Controller, WorkerState, run_segments
from batchspec.config.spec import load_spec_file, run_llm_options
from batchspec.engine.base import Request, SamplingParams
from batchspec.engine.trtllm.adapter import TrtllmEngine
from batchspec.shard import ShardInput, run_shard
from tests.engine.trtllm import fake_tensorrt_llm as fake
from tests.engine.trtllm.conftest import TARGET

CONFIGS = files("batchspec.data") / "trt_configs"
BUILD_S = 0.05  # simulated seconds per LLM build: small enough for a 48-row shard's rows to repay it
TEXTS = {"code": "def add(a, b):\n    return a + b\n" * 3, "chat": "Tell me about the sea and the sky."}


def shard(i: int, key: str, n: int = 12) -> ShardInput:
    return ShardInput(f"s{i}", key, [Request(f"{key}{i}-{j}", f"{TEXTS[key]} #{j}", params=SamplingParams(max_tokens=48)) for j in range(n)])


def arms():
    ngram = load_spec_file(str(CONFIGS / "ngram.yaml")).spec
    eagle = load_spec_file(str(CONFIGS / "eagle3.yaml")).spec
    return [ngram.with_draft_len(2), ngram.with_draft_len(4), eagle.with_draft_len(2), eagle.with_draft_len(3)]


def test_a_worker_calibrates_its_keys_by_running_each_method_once_within_its_build_cap(monkeypatch):
    """Over the stand-in, where an arm is a build: the controller runs each method at its longest
    draft once per key (its shorter drafts estimated from that run), only where the rows left
    repay the build, within the worker's cap; a key's later shard judges on its last rows, so it
    builds nothing to learn; every row comes back once."""
    st = fake.install(monkeypatch, build_seconds=BUILD_S)
    candidates = arms()
    engine = TrtllmEngine(TARGET, run_llm_options({}, candidates), clock=st.clock)
    settings = CalibrationSettings(max_builds_per_worker=5)
    worker = WorkerState()
    results = []
    for i, (key, horizon) in enumerate([("code", 96), ("code", 0), ("chat", 96), ("chat", 0)]):
        ran = run_shard(engine, shard(i, key, 96), candidates, True, 4, settings, worker=worker, horizon_rows=horizon)
        assert [c.id for c in ran.completions] == [r.id for r in shard(i, key, 96).requests]
        assert all(c.finish_reason != "error" for c in ran.completions)
        assert not ran.decision.exact  # EAGLE-3's tallies are measured, its shorter drafts estimated
        results.append(ran.stats)
    engine.close()
    measured = [[e.arm for e in s.events if e.kind == "measure"] for s in results]
    started = [s.events[0].arm for s in results]
    for first, later in ((0, 1), (2, 3)):  # per key: each method run once over its shards, the longest draft measured
        ran = measured[first] + measured[later]
        assert len(ran) == len(set(ran)) and set(ran) <= {"eagle3:k=3", "ngram:k=4"}, measured
        assert {a.split(":")[0] for a in ran + [started[first]]} >= {"eagle3", "ngram"}, (measured, started)
        assert all(c.predicted_speedup for c in results[later].candidates if c.method != "eagle3" or c.draft_len <= 3)
    assert sum(s.builds for s in results) == st.builds and st.max_live == 1
    assert st.builds <= settings.max_builds_per_worker + len(results)  # learning within the cap, switches beside
    assert results[0].calibration_s >= BUILD_S  # builds calibration caused are its cost


def test_a_build_the_rows_cannot_repay_is_not_run(monkeypatch):
    """An hour's build repays nothing in 48 rows: the worker's one build is its first engine. With
    n-gram arms that is the longest n-gram draft (its greedy tokens price plain decoding and the
    shorter drafts); with only EAGLE-3 arms plain decoding, and the stats say no arm was measured."""
    for candidates, method, draft_len in ((arms(), "ngram", 4), (arms()[2:], "none", 0)):
        st = fake.install(monkeypatch, build_seconds=3600.0)
        engine = TrtllmEngine(TARGET, run_llm_options({}, candidates), clock=st.clock)
        ran = run_shard(engine, shard(0, "code", 48), candidates, True, 4, CalibrationSettings(), worker=WorkerState())
        engine.close()
        assert st.builds == 1 and (ran.stats.spec_method, ran.stats.draft_len) == (method, draft_len)
        assert [e.kind for e in ran.stats.events if e.kind != "profile"] == ["start"]
        assert len(ran.completions) == 48 and all(c.finish_reason != "error" for c in ran.completions)
        if method == "none":
            assert "did not repay" in ran.stats.speculation_unmeasured
        else:
            assert ran.stats.speculation_unmeasured is None
            assert all(c.predicted_speedup for c in ran.stats.candidates if c.method == "ngram")


def test_a_run_where_no_arm_could_be_measured_is_loud(monkeypatch, tmp_path):
    st = fake.install(monkeypatch)
    eagle = load_spec_file(str(CONFIGS / "eagle3.yaml")).spec
    broken = [dataclasses.replace(eagle, draft_model="nowhere/EAGLE3-head", draft_len=2)]  # a head that cannot load
    engine = TrtllmEngine(TARGET, run_llm_options({}, broken), clock=st.clock)
    stats = run_shard(engine, shard(0, "code", 48), broken, True, 4, CalibrationSettings(), horizon_rows=96).stats
    engine.close()
    assert stats.spec_method == "none" and "eagle3:k=2" in stats.speculation_unmeasured
    assert "huggingface.co" in stats.speculation_unmeasured  # the build's own reason, in one line

    from batchspec.pipeline import RunSummary
    from batchspec.report.load import _warnings, _shard

    warnings = _warnings("out", [_shard(stats.to_row(), None)], 1, True, None)
    assert any("speculation could not be measured in 1 of 1" in w for w in warnings)

    summary = RunSummary(output="out", rows=12, error_rows=0, shards=1, shards_skipped=0, shards_failed=0, retries=0,
                         output_tokens=100, wall_s=1.0, tokens_per_s=1.0, baseline_tokens_per_s=None, speedup=None,
                         complete=True, speculation_unmeasured=1, speculation_reason=f"s0: {stats.speculation_unmeasured}")
    import batchspec.pipeline
    from batchspec.cli import cli

    monkeypatch.setattr(batchspec.pipeline, "run", lambda config, progress=None, force=False: summary)
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text("engine: torch\nstrict_speculation: true\n")
    strict = CliRunner().invoke(cli, ["run", "in.parquet", str(tmp_path / "out"), "--pipeline", str(pipeline)])
    assert strict.exit_code != 0 and "speculation could not be measured in 1 of 1 shard(s)" in strict.output
    pipeline.write_text("engine: torch\nstrict_speculation: false\n")
    lax = CliRunner().invoke(cli, ["run", "in.parquet", str(tmp_path / "out"), "--pipeline", str(pipeline)])
    assert lax.exit_code == 0 and "warning: speculation could not be measured" in lax.output


def test_ngram_lengths_are_priced_from_tokens_by_replaying_the_pool_not_by_building_them(monkeypatch):
    """The worker's first build is the longest n-gram draft; every shorter n-gram draft's
    acceptance comes from the rows' tokens through TensorRT-LLM's pool rules (private pool, as
    ngram.yaml ships: exact for greedy rows), equal step for step to what building it measures."""
    st = fake.install(monkeypatch, build_seconds=3600.0)
    ngram = load_spec_file(str(CONFIGS / "ngram.yaml")).spec
    candidates = [ngram.with_draft_len(2), ngram.with_draft_len(4)]
    engine = TrtllmEngine(TARGET, run_llm_options({}, candidates), clock=st.clock)
    rows = shard(0, "code", 24)
    ran = run_shard(engine, rows, candidates, True, 4, CalibrationSettings(), worker=WorkerState())
    assert st.builds == 1 and ran.stats.events[0].arm == "ngram:k=4"
    built = engine.generate(rows.requests, candidates[0], 4)  # k=2 built and run: what the replay predicted
    engine.close()
    k2 = next(a for a in ran.decision.arms if a.label == "ngram:k=2")
    assert k2.tally_target_steps == sum(c.target_steps for c in built.completions) > 0
    assert k2.tally_accepted_tokens == sum(c.accepted_tokens for c in built.completions) > 0
    assert ran.decision.exact and k2.predicted_speedup


def test_at_a_shards_end_the_rule_chooses_where_the_keys_next_shard_starts(monkeypatch):
    """A shard of one batch (the controller first hears of its rows when all have finished) has no
    rows left to switch for, but the key's next shard on the worker does: at the end the rule (the
    same, repaid over the key's rows to come) picks its start, and that shard pays the build. A
    key's last shard leaves the engine as it is."""
    st = fake.install(monkeypatch, build_seconds=0.005)
    ngram = load_spec_file(str(CONFIGS / "ngram.yaml")).spec
    candidates = [ngram.with_draft_len(2), ngram.with_draft_len(4)]
    engine = TrtllmEngine(TARGET, run_llm_options({}, candidates), clock=st.clock)
    worker, settings = WorkerState(), CalibrationSettings()
    first = run_shard(engine, shard(0, "code", 16), candidates, True, 16, settings, prior=candidates[0], worker=worker,
                      horizon_rows=16)
    assert first.stats.events[0].arm == "ngram:k=2" and len(first.completions) == 16  # the driver's prior
    switch = [e for e in first.stats.events if e.kind == "switch"]
    assert [e.arm for e in switch] == ["ngram:k=4"] and "next shard" in switch[0].reason
    assert set(first.row_specs) == {candidates[0]}  # its own rows all ran under k=2
    last = run_shard(engine, shard(1, "code", 16), candidates, True, 16, settings, worker=worker)
    assert last.stats.events[0].arm == "ngram:k=4" and last.stats.builds == 1
    assert not [e for e in last.stats.events if e.kind == "switch"]  # no rows of the key to come: nothing to build for
    assert st.builds == 2
    engine.close()


def test_every_tally_commits_its_steps_and_accepted_drafts_the_end_token_included(monkeypatch):
    """TensorRT-LLM leaves a row's end token out of its output ids and counts, yet a step commits
    it: each arm's tally (plain decoding's, the NGram replay's, a built arm's as measured) counts
    it, so a step commits its accepted drafts plus one token for every arm alike."""
    from batchspec.calibrate.counterfactual import end_step, measured_tallies, tallies
    from batchspec.engine.acceptance import PlainRow

    st = fake.install(monkeypatch)
    ngram = load_spec_file(str(CONFIGS / "ngram.yaml")).spec
    arms = [ngram.with_draft_len(2), ngram.with_draft_len(4)]
    engine = TrtllmEngine(TARGET, run_llm_options({}, arms), clock=st.clock)
    requests = shard(0, "chat", 12).requests
    built = engine.generate(requests, arms[1], 4).completions
    assert any(c.finish_reason == "stop" and c.output_tokens < 48 for c in built)  # rows that end on the end token
    rows = [PlainRow(engine.encode(r), c.token_ids, r.params.max_tokens) for r, c in zip(requests, built)]
    computed, _ = tallies(engine, rows, arms, requests)
    for c, plain, row in zip(built, rows, computed):
        measured = measured_tallies(c, arms[1], arms, end_step(engine, plain))
        for t in [*row.values(), *measured.values()]:
            assert t.tokens == t.steps + t.accepted
        assert row["ngram:k=4"].steps == measured["ngram:k=4"].steps == c.target_steps
    engine.close()


def test_a_shard_streams_its_rows_and_drains_its_batch_only_where_its_arm_changes(monkeypatch):
    """The controller hears of every batch of finished rows, yet the engine's batch stays full
    between its calls: a shard that keeps its arm drains once, at its end (the iteration stats'
    rows per step fall below the batch once and never rise again); a build is only ever after a
    drain."""
    st = fake.install(monkeypatch, build_seconds=3600.0)  # no switch repays: one arm throughout
    ngram = load_spec_file(str(CONFIGS / "ngram.yaml")).spec
    candidates = [ngram.with_draft_len(2), ngram.with_draft_len(4)]
    engine = TrtllmEngine(TARGET, run_llm_options({}, candidates), clock=st.clock)
    requests = shard(0, "code", 64).requests
    control = Controller(engine, requests, candidates, 4, CalibrationSettings(), WorkerState(), "code")
    result = run_segments(engine, requests, control, 4)
    engine.close()
    assert [c.id for c in result.completions] == [r.id for r in requests] and st.builds == 1
    rows = [s.rows for s in result.steps]
    first_short = next(i for i, r in enumerate(rows) if r < 4)
    assert first_short > 0 and all(r == 4 for r in rows[:first_short])
    assert all(a >= b for a, b in zip(rows[first_short:], rows[first_short + 1:])), rows  # one drain
    assert len(rows) - first_short < len(rows) // 4  # and a short one: the last rows only
