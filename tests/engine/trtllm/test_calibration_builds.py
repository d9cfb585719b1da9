"""Calibration when an arm is a build (issue 13; DESIGN.md "Calibration" item 5), over the stand-in
whose LLM builds take simulated time: one live LLM per worker, build seconds counted as calibration
cost, a cap on builds per worker, later shards of a key reusing the decision. And a run where no
speculative arm could be measured says so (stats, summary, report, exit status)."""

from __future__ import annotations

import dataclasses
from importlib.resources import files

from click.testing import CliRunner

from batchspec.calibrate import CalibrationSettings
from batchspec.config.spec import load_spec_file, run_llm_options
from batchspec.engine.base import Request, SamplingParams
from batchspec.engine.trtllm.adapter import TrtllmEngine
from batchspec.shard import ShardInput, run_shard
from tests.engine.trtllm import fake_tensorrt_llm as fake
from tests.engine.trtllm.conftest import TARGET

CONFIGS = files("batchspec.data") / "trt_configs"
BUILD_S = 45.0  # simulated seconds per LLM build (an 8B load plus CUDA-graph capture)
TEXTS = {"code": "def add(a, b):\n    return a + b\n" * 3, "chat": "Tell me about the sea and the sky."}


def shard(i: int, key: str, n: int = 12) -> ShardInput:
    return ShardInput(f"s{i}", key, [Request(f"{key}{i}-{j}", f"{TEXTS[key]} #{j}", params=SamplingParams(max_tokens=48)) for j in range(n)])


def arms():
    ngram = load_spec_file(str(CONFIGS / "ngram.yaml")).spec
    eagle = load_spec_file(str(CONFIGS / "eagle3.yaml")).spec
    return [ngram.with_draft_len(2), ngram.with_draft_len(4), eagle.with_draft_len(2), eagle.with_draft_len(3)]


def test_builds_per_run_and_their_cost_share(monkeypatch):
    st = fake.install(monkeypatch, build_seconds=BUILD_S)
    candidates = arms()
    engine = TrtllmEngine(TARGET, run_llm_options({}, candidates), clock=st.clock)
    settings = CalibrationSettings(sample_size=8, max_tokens=32, min_rows=4, max_builds_per_worker=5)
    prior, results = {}, []
    for i, key in enumerate(["code", "code", "code", "chat", "chat"]):
        result = run_shard(engine, shard(i, key), candidates, True, 4, settings, prior.get(key))
        prior[key] = result.decision
        results.append(result.stats)
    engine.close()
    builds = [s.builds for s in results]
    share = sum(s.build_s for s in results) / sum(s.wall_s for s in results)
    print(f"builds per shard {builds}, total {sum(builds)}, build share of wall {share:.0%}")
    # key "code": none + one probe per method (ngram, eagle3) = 3 calibration builds, no confirmations
    first = results[0]
    assert first.decision_source == "calibrated" and 3 <= first.builds <= 4
    assert {c.label for c in first.candidates if c.measured} == {"none", "ngram:k=2", "eagle3:k=2"}
    assert first.calibration_s >= 3 * BUILD_S  # build seconds are calibration cost
    # later shards of the key reuse the decision: no calibration, at most the production build
    assert [s.decision_source for s in results[1:3]] == ["reused", "reused"] and builds[1:3] == [0, 0]
    # key "chat" on the same worker: the cap leaves room for none + one probe, and the decision says so
    assert results[3].decision_source == "calibrated" and "build cap" in results[3].decision_reason
    assert sum(builds) <= settings.max_builds_per_worker + 2  # the cap bounds calibration; production builds add
    assert st.max_live == 1 and sum(builds) == st.builds
    assert 0 < share < 1


def test_a_run_where_no_arm_could_be_measured_is_loud(monkeypatch, tmp_path):
    st = fake.install(monkeypatch)
    eagle = load_spec_file(str(CONFIGS / "eagle3.yaml")).spec
    broken = [dataclasses.replace(eagle, draft_model="nowhere/EAGLE3-head", draft_len=2)]  # a head that cannot load
    engine = TrtllmEngine(TARGET, run_llm_options({}, broken), clock=st.clock)
    stats = run_shard(engine, shard(0, "code"), broken, True, 4, CalibrationSettings(sample_size=8, max_tokens=16, min_rows=4)).stats
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

    monkeypatch.setattr(batchspec.pipeline, "run", lambda config, progress=None: summary)
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text("engine: torch\nstrict_speculation: true\n")
    strict = CliRunner().invoke(cli, ["run", "in.parquet", str(tmp_path / "out"), "--pipeline", str(pipeline)])
    assert strict.exit_code != 0 and "speculation could not be measured in 1 of 1 shard(s)" in strict.output
    pipeline.write_text("engine: torch\nstrict_speculation: false\n")
    lax = CliRunner().invoke(cli, ["run", "in.parquet", str(tmp_path / "out"), "--pipeline", str(pipeline)])
    assert lax.exit_code == 0 and "warning: speculation could not be measured" in lax.output
