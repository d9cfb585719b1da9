"""Smoke tests of the maintained benches (bench/engine.py, calibrate.py, pipeline.py, scale.py;
peer.py in test_bench_peer.py): each has --help and runs end to end on tiny random models with a
few prompts and tokens, and the one record of figures (bench/common/results.py) appends only when
asked and makes docs/performance.md's table. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))


@pytest.fixture(scope="module")
def models(tiny_model_dir, tiny_draft_dir):
    return str(tiny_model_dir), str(tiny_draft_dir)

SAY = [{"role": "user", "content": "Continue the list: alpha, beta, gamma, delta, alpha, beta,"}]  # held_parquet's request


def held_parquet(tmp_path: Path, rows: int, tasks: tuple[str, ...] = ("continue",)) -> Path:
    """A held-out prompt Parquet (bench/common/peer_prompts.py's layout) of `rows` copy-heavy chat
    requests per task, tasks interleaved: held.parquet under `tmp_path`."""
    from common import peer_prompts

    path = tmp_path / "held.parquet"
    peer_prompts.write_parquet([peer_prompts.HeldOut(f"{task}-{i}", task, "here", tuple(SAY), (1, 2, 3))
                                for i in range(rows) for task in tasks], str(path))
    return path


@pytest.mark.parametrize("bench", ["engine", "calibrate", "pipeline", "peer", "scale"])
def test_every_bench_has_help_with_the_recording_options(bench):
    done = subprocess.run([sys.executable, str(BENCH / f"{bench}.py"), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {bench}.py") and "--record" in done.stdout and "--results FILE" in done.stdout


def test_workloads_are_varied_chat_requests():
    from common import workloads

    for name in workloads.WORKLOADS:
        reqs = workloads.requests(name, 6, 16)
        assert len({r.messages[0]["content"] for r in reqs}) >= 3, name
        assert all(r.messages[0]["role"] == "user" and r.params.max_tokens == 16 for r in reqs)
    # Seeded, not random per call: the same seed gives the same prompts in another process (a string
    # seed hashes the same everywhere), a longer list extends a shorter one, another seed differs.
    other = subprocess.run([sys.executable, "-c", "import sys, json; sys.path.insert(0, sys.argv[1]); from common import workloads; "
                            "print(json.dumps(workloads.prompts('edit', 4)))", str(BENCH)],
                           capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "123", "PATH": ""})
    assert json.loads(other.stdout) == workloads.prompts("edit", 4) == workloads.prompts("edit", 8)[:4]
    assert workloads.prompts("edit", 4, seed=1) != workloads.prompts("edit", 4)


def test_engine_bench_writes_comparisons_and_records_its_speedups_when_asked(models, tmp_path):
    import engine

    target, draft = models
    argv = ["--model", target, "--ngram-model", target, "--target", target, "--draft-model", draft,
            "--quick", "--max-tokens", "6", "--threads", "1", "--out", str(tmp_path)]
    data = engine.main([*argv, "--record", "--results", str(tmp_path / "r.jsonl")])
    (line,) = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert line == data["record"] and line["bench"] == "engine" and line["args"]["quick"] is True
    assert {"utc", "commit", "machine", "bench", "args", "metrics", "command"} == set(line)
    assert line["metrics"] == {engine.KEYS[c["name"]]: round(c["speedup"], 3) for c in data["comparisons"]}
    assert line["command"] == "python bench/engine.py " + " ".join(argv[:-2])  # the recording options left out
    saved = json.loads((tmp_path / "engine.json").read_text())
    assert saved["machine"]["torch_threads"] == 1 and saved["machine"]["dtype"] == "bfloat16"
    names = [c["name"] for c in saved["comparisons"]]
    assert names == ["plain batch 8 vs batch 1", "n-gram vs plain, batch 1", "draft model vs plain, batch 1"]
    for c in saved["comparisons"]:
        assert {"speedup", "speedup_wall", "met", "target"} <= set(c)
        assert c["baseline"]["rows"] == c["candidate"]["rows"] > 0
    assert saved["comparisons"][2]["candidate"]["draft_tokens"] > 0
    assert "| comparison |" in (tmp_path / "engine.md").read_text()
    assert data["comparisons"] == saved["comparisons"]


def test_engine_bench_structured_option_runs_the_extraction_arms_and_records_them(models, tmp_path):
    import engine

    target, _ = models
    argv = ["--structured", "--model", target, "--quick", "--max-tokens", "8", "--threads", "1", "--dtype", "float32"]
    data = engine.main([*argv, "--record", "--results", str(tmp_path / "r.jsonl")])
    (line,) = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert line == data["record"] and line["bench"] == "engine" and line["args"]["structured"] is True
    assert line["command"] == "python bench/engine.py " + " ".join(argv)
    assert set(line["metrics"]) == {"constrained_vs_free_per_token_b1", "constrained_vs_free_per_token_b8",
                                    "forced_ngram_vs_constrained_b1", "forced_share"}
    assert set(data["cost_per_token"]) == {1, 8}
    arms = data["speculation"]
    assert set(arms) == {"constrained plain", "forced+ngram k=4", "forced+ngram k=8", "forced alone k=8"}
    assert all(a["rows"] == 4 and a["errors"] == 0 for a in arms.values())
    assert arms["forced alone k=8"]["forced_tokens"] > 0  # the schema's opening bytes are forced
    assert line["metrics"]["forced_ngram_vs_constrained_b1"] == round(data["best_speedup"], 3)


def test_engine_bench_suffix_option_runs_the_shared_workloads_and_the_memory_check(models, tmp_path):
    """--suffix: n-gram and suffix side by side on every shared workload and prose (plain decoding
    too there), lossless in float32, every arm's counterfactual, the memory check; recorded only
    when asked, its details under --out."""
    import engine
    from common import workloads

    for name in workloads.SHARED_WORKLOADS:
        assert len(set(workloads.prompts(name, 6, seed=57))) == 6, name
    target, _ = models
    argv = ["--suffix", "--model", target, "--suffix-rows", "4", "--max-tokens", "6", "--suffix-memory-rows", "40", "--threads", "1"]
    data = engine.main([*argv, "--out", str(tmp_path), "--record", "--results", str(tmp_path / "r.jsonl")])
    (line,) = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert line == data["record"] and line["bench"] == "engine" and line["args"]["suffix"] is True
    assert line["command"] == "python bench/engine.py " + " ".join(argv)
    assert [w["workload"] for w in data["workloads"]] == [*workloads.SHARED_WORKLOADS, "prose"]
    for w in data["workloads"]:
        assert w["lossless"] and set(w["measured"]) >= {"ngram:k=8", "suffix:k=8"}
        assert set(w["counterfactual_tokens_per_step"]) == {"ngram:k=2", "ngram:k=4", "ngram:k=6", "ngram:k=8",
                                                            "suffix:k=4", "suffix:k=8", "suffix:k=16"}
        assert line["metrics"][f"suffix_vs_ngram_tokens_per_step@{w['workload']}"] == round(w["suffix_over_ngram_tokens_per_step"], 3)
    assert "none" in data["workloads"][-1]["measured"]  # prose runs plain decoding too
    memory = data["memory"]
    assert memory["random"]["rows"] == memory["structured"]["rows"] == 40 and memory["cap_8mb"]["held"]
    assert line["metrics"]["cap_8mb_held"] is True and line["metrics"]["tree_mb_counted@random"] > 0
    assert json.loads((tmp_path / "engine_suffix.json").read_text())["memory"]["random"]["rows"] == 40
    assert "| workload |" in (tmp_path / "engine_suffix.md").read_text()


def test_calibrate_bench_writes_every_shard(models, tmp_path):
    import calibrate

    target, draft = models
    calibrate.main(["--model", target, "--draft-model", draft, "--rows", "4", "--max-tokens", "4", "--batch-size", "2",
                    "--workloads", "edit,prose", "--threads", "1", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "calibrate.json").read_text())
    assert [s["shard"] for s in saved["shards"]] == ["edit", "prose"]
    assert any(a.startswith("draft_target") for a in saved["arms"])
    for s in saved["shards"]:
        assert {"chosen", "oracle", "vs_oracle", "vs_plain", "calibration_share", "calibration_arms"} <= set(s)
        assert len(s["oracle_arms"]) == 1 + len(saved["arms"])
        assert [a["arm"] for a in s["predicted_vs_measured"]] == saved["arms"]
        for a in s["predicted_vs_measured"]:  # the cost model's error, the sample's left out (None without a profile)
            assert {"predicted_from_whole_shard", "error_from_whole_shard", "chunk_errors", "measured_interval"} <= set(a)
            assert a["predicted_from_whole_shard"] is None or a["predicted_from_whole_shard"] > 0
            lo, hi = a["measured_interval"]  # the oracle's chunks redrawn: the measurement lies within its own interval
            assert lo <= a["measured_speedup"] * (1 + 1e-9) and a["measured_speedup"] <= hi * (1 + 1e-9)
    assert set(saved["met"]) == {"vs_oracle", "vs_plain", "calibration_share", "prediction_within_10pct"}


def test_calibrate_bench_in_flight_decides_as_the_pipeline_does(models, tmp_path):
    import calibrate

    target, _ = models
    with pytest.raises(SystemExit):  # not an arm of this bench: refused before a model loads
        calibrate.main(["--model", target, "--in-flight", "--later-shard", "--ended-under", "ngram:k=3", "--out", str(tmp_path)])
    calibrate.main(["--model", target, "--rows", "12", "--max-tokens", "4", "--batch-size", "2", "--workloads", "edit",
                    "--threads", "1", "--in-flight", "--later-shard", "--ended-under", "ngram:k=2", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "calibrate.json").read_text())
    from batchspec.calibrate import CalibrationSettings

    assert CalibrationSettings(min_rows=12).sample_rows(2, counterfactual=True) < 12  # rows beyond the sample: in flight
    (shard,) = saved["shards"]
    flight = shard["in_flight"]  # the shard ran once as the pipeline runs it, its rows under the settings it chose
    assert saved["in_flight"] and flight["wall_s"] == shard["shard_wall_s"] > 0
    assert sum(flight["rows_by_setting"].values()) == 12 and flight["goodput_vs_plain"] > 0
    # goodput as everywhere else: tokens committed by decode steps (each row's first is prefill's)
    assert flight["decode_tokens"] == flight["output_tokens"] - 12
    assert flight["goodput"] == pytest.approx(flight["decode_tokens"] / flight["decode_s"])
    assert "| rows per setting |" in (tmp_path / "calibrate.md").read_text()
    # --later-shard: the benched shard is its key's second on the worker; its sample ran under the
    # setting the first ended under, where the worker could price a run under it
    first = shard["key_first_shard"]  # --ended-under: taken to have ended under k=2, whatever it chose
    assert first["ended_under"] == "ngram:k=2" and first["ended_under_forced"]
    assert saved["later_shard"] and first["wall_s"] > 0 and flight["sample_under"] in {first["ended_under"], "none"}
    assert "| sample decoded under |" in (tmp_path / "calibrate.md").read_text()
    # the shard's figure against the oracle is the settings it ran, priced on the interleaved run
    assert shard["vs_oracle"] == pytest.approx(flight["settings_goodput"] / shard["oracle_tokens_per_s"])
    assert shard["decision_vs_oracle"] == pytest.approx(shard["calibrated_tokens_per_s"] / shard["oracle_tokens_per_s"])


def test_calibrate_bench_shards_a_prompt_parquet_it_did_not_write_by_a_column(models, tmp_path, capsys):
    """--input: prompts the project did not write (bench/peer_prompts.py writes such a Parquet),
    read as `batchspec run` reads them, one shard per value of --key; rows that cannot run are
    left out and counted, and a file that cannot make the shards asked for is refused in one line
    before a model loads."""
    import calibrate
    import pyarrow as pa
    import pyarrow.parquet as pq

    target, _ = models
    path = held_parquet(tmp_path, 9, ("rewrite", "continue"))
    table = pq.read_table(path)
    broken = pa.table({"id": ["bad-0"], "task": ["rewrite"], "source": ["here"],
                       "messages": pa.array([None], table.schema.field("messages").type), "prompt_tokens": [0]})
    pq.write_table(pa.concat_tables([table, broken]), path)

    for argv, words in ((["--key", "language"], "column 'language' is not in input"),
                        (["--rows", "5"], "needs 10 rows"),  # two shards of 5 per key, 9 rows each
                        (["--workloads", "poems"], "poems (0)")):
        with pytest.raises(SystemExit):
            calibrate.main(["--model", "not-a-model", "--input", str(path), "--rows", "4", "--in-flight", "--later-shard",
                            *argv, "--out", str(tmp_path)])
        assert words in capsys.readouterr().err
    calibrate.main(["--model", target, "--input", str(path), "--rows", "4", "--max-tokens", "4", "--batch-size", "2",
                    "--threads", "1", "--in-flight", "--later-shard", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "calibrate.json").read_text())
    assert saved["input"] == str(path) and saved["key"] == "task"
    assert [s["shard"] for s in saved["shards"]] == ["rewrite", "continue"]  # file order
    assert all(s["rows"] == 4 and sum(s["in_flight"]["rows_by_setting"].values()) == 4 for s in saved["shards"])
    assert all(s["key_first_shard"]["wall_s"] > 0 for s in saved["shards"])
    # a long job's steady state: the key's shards before the benched one, each recorded; the
    # oracle's calls as many rows as asked (the shard as one call)
    for argv in (["--earlier", "0"], ["--oracle-chunk", "0"]):
        with pytest.raises(SystemExit):
            calibrate.main(["--model", "not-a-model", "--input", str(path), "--rows", "3", "--in-flight", "--later-shard",
                            *argv, "--out", str(tmp_path)])
    calibrate.main(["--model", target, "--input", str(path), "--rows", "3", "--max-tokens", "4", "--batch-size", "2",
                    "--threads", "1", "--in-flight", "--later-shard", "--earlier", "2", "--oracle-chunk", "3",
                    "--workloads", "rewrite", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "calibrate.json").read_text())
    (shard,) = saved["shards"]
    assert saved["earlier"] == 2 and saved["oracle_chunk"] == 3 and len(shard["key_earlier_shards"]) == 2
    assert shard["key_first_shard"] == shard["key_earlier_shards"][-1] and all(e["reason"] for e in shard["key_earlier_shards"])
    assert all(len(a["chunk_errors"]) <= 1 for a in shard["predicted_vs_measured"])  # one call: one chunk at most
    assert "its key's shard 3 on this worker: 2 shards of other rows" in (tmp_path / "calibrate.md").read_text()

    from common import workloads

    groups, bad = workloads.from_input(str(path), "task", 7)
    assert [len(g) for g in groups.values()] == [9, 9] and bad == ["bad-0: prompt and messages are both null"]
    assert groups["rewrite"][0].messages == tuple(SAY) and groups["rewrite"][0].params.max_tokens == 7
    assert [r.id for r in groups["continue"][:2]] == ["continue-0", "continue-1"]


def test_the_settings_a_shard_ran_are_priced_chunk_by_chunk_on_the_interleaved_run():
    """Chunk 0's four rows ran half under each arm, chunk 1's all under "none": each chunk's
    time and tokens are the rows' shares of each arm's figures on that chunk."""
    import calibrate
    from common.measure import Measured

    from batchspec.engine.base import NO_SPEC, Completion, GenerateResult, SpecConfig, Timing

    def part(seconds: float, rows: int = 4, tokens: int = 11) -> GenerateResult:
        return GenerateResult([Completion(f"r{i}", "", output_tokens=tokens) for i in range(rows)], Timing(verify_s=seconds))

    arm = SpecConfig("ngram", 4)
    none, fast = Measured("none", NO_SPEC, 2), Measured(arm.label, arm, 2)
    for m, (a, b) in ((none, (4.0, 8.0)), (fast, (2.0, 1.0))):
        m.add(part(a))
        m.add(part(b))
    labels = ["none", arm.label, "none", arm.label] + ["none"] * 4
    got = calibrate._as_ran({"none": none, arm.label: fast}, labels, chunk=4)
    assert got == pytest.approx((40 * 0.5 + 40 * 0.5 + 40) / (0.5 * 4.0 + 0.5 * 2.0 + 8.0))


def test_prices_split_an_arms_cost_from_plain_decodings_anchor():
    """A profile that prices a forward at 1 ms per row and token; plain decoding measured at 2x it
    with 0.1 ms of bookkeeping per row and step; the arm's 3-token verifies at 1.5x their price with
    0.3 ms a row-step. `_prices` gives each ratio, and each run's steps priced as a prediction
    prices them (forwards from the profile, plain's bookkeeping), set against plain decoding's."""
    import calibrate
    from common.measure import Measured

    from batchspec.calibrate import WorkerCalibration
    from batchspec.engine.base import NO_SPEC, GenerateResult, SpecConfig, Step, StepCost, Timing
    from batchspec.predict.cost import CostProfile

    worker = WorkerCalibration()
    worker.profile = CostProfile([StepCost("target", "m", b, c, w, 0.001 * b * w)
                                  for b in (1, 2) for c in (10, 1000) for w in (1, 2, 3)])
    arm = SpecConfig("ngram", 2)
    plain_steps, arm_steps = [Step(2, 100, 1, 2)] * 10, [Step(2, 100, 3, 4)] * 5
    none, ran = Measured("none", NO_SPEC, 2), Measured(arm.label, arm, 2)
    none.add(GenerateResult([], Timing(verify_s=10 * 2 * 0.002, other_s=20 * 0.0001)))
    none.steps.append(plain_steps)
    ran.add(GenerateResult([], Timing(verify_s=5 * 1.5 * 0.006, other_s=10 * 0.0003, draft_s=0.01)))
    ran.steps.append(arm_steps)
    got = calibrate._prices({"none": none, arm.label: ran}, worker, None)
    assert got["none"]["forward_over_price"] == pytest.approx(2.0)
    assert got["plain_anchor"]["other_us_per_row_step"] == pytest.approx(100)
    assert got[arm.label]["forward_over_price"] == pytest.approx(1.5)
    assert got[arm.label]["other_us_per_row_step"] == pytest.approx(300) and got[arm.label]["draft_us_per_row_step"] == pytest.approx(1000)
    # priced as a prediction prices it: forwards from the profile plus plain's bookkeeping per row-step
    assert got["none"]["decode_over_its_price"] == pytest.approx((0.04 + 0.002) / (0.02 + 0.002))
    assert got[arm.label]["decode_over_its_price"] == pytest.approx((0.045 + 0.003) / (0.03 + 0.001))
    # against plain's: the arm costs 1.548 / 1.909 of what the model says, relative to plain decoding
    assert got[arm.label]["cost_vs_plain_over_model"] == pytest.approx((0.048 / 0.031) / (0.042 / 0.022))
    assert got["none"]["cost_vs_plain_over_model"] == pytest.approx(1.0)
    assert got["worker_anchor"] is None  # no decision anchored this worker


def test_pipeline_bench_sets_the_pipeline_beside_the_engine_on_the_same_rows(ray_session, tiny_model_dir, tmp_path):
    """Both sides generate the same rows greedily with the same model: the same tokens; the Ray
    session the test holds is left running."""
    import pipeline

    result = pipeline.main(["--model", str(tiny_model_dir), "--rows", "8", "--max-tokens", "4", "--batch-size", "4",
                            "--shard-size", "4", "--threads", "1", "--out", str(tmp_path / "p.json")])
    assert ray_session.is_initialized()
    assert result["pipeline"]["error_rows"] == 0 and result["pipeline"]["output_tokens"] == result["engine"]["output_tokens"] > 0
    assert result["ratio_work"] > 0 and result["prompt_format"] == "chat"
    assert json.loads((tmp_path / "p.json").read_text())["rows"] == 8
    assert set(result["record"]["metrics"]) == {"ratio_work", "ratio_end_to_end", "overhead_s", "engine_tokens_per_s"}


def test_scale_bench_plans_groups_and_reads_back_every_shard(tmp_path):
    import scale

    doc = scale.main(["--rows", "300", "--files", "2", "--keys", "2", "--prompt-bytes", "100", "--shard-size", "64",
                      "--num-cpus", "1", "--work", str(tmp_path / "work"), "--record", "--results", str(tmp_path / "r.jsonl")])
    (row,) = doc["results"]
    assert row["shards"] == 2 * 3 and row["plan_json_bytes"] > 0  # 150 rows of each key, at most 64 a shard
    assert row["worker_read_bytes"] > 0 and row["driver_peak_mb"] > 0
    (line,) = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert line["metrics"]["plan_group_s@300"] == row["plan_group_s"] and line["args"]["rows"] == [300]


def test_results_report_keeps_the_latest_line_per_figure_and_rewrites_only_its_block(tmp_path):
    from common import results

    def line(utc, value, **args):
        return {"utc": utc, "commit": "abc1234", "machine": "m", "bench": "engine", "args": {"quick": False, "threads": 1, **args},
                "metrics": {"plain_b8_vs_b1": value}, "command": "python bench/engine.py"}

    lines = [line("2026-12-01T00:00:00+00:00", 4.0), line("2026-12-02T00:00:00+00:00", 5.0, threads=2),
             line("2026-12-01T00:00:00+00:00", 3.0, quick=True),
             {**line("2026-11-01T00:00:00+00:00", 2.0), "bench": "peer", "metrics": {"ratio": 1.5, "source": "README"}}]
    assert [(x["bench"], x["metrics"]) for x in results.latest(lines)] == [
        ("engine", {"plain_b8_vs_b1": 3.0}), ("engine", {"plain_b8_vs_b1": 5.0}), ("peer", {"ratio": 1.5, "source": "README"})]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    doc = tmp_path / "performance.md"
    doc.write_text(f"# Performance\n\nprose\n\n{results.BEGIN}\nold table\n{results.END}\n\nmore prose\n")
    results.main(["--results", str(tmp_path / "r.jsonl"), "--doc", str(doc)])
    text = doc.read_text()
    assert text.startswith("# Performance\n\nprose\n\n") and text.endswith(f"{results.END}\n\nmore prose\n")
    assert "old table" not in text and "| engine | plain_b8_vs_b1 5 | m | abc1234 | 2026-12-02 |" in text
    assert "| peer | ratio 1.5 (from the README) |" in text
    doc.write_text("no markers\n")
    with pytest.raises(SystemExit, match="expected one"):
        results.update_doc(doc, tmp_path / "r.jsonl")


def test_docs_performance_shows_the_table_of_bench_results():
    """`make bench-report` was run after the last recorded figure, and every recorded line has the
    keys of a record (the seeded ones say so)."""
    from common import results

    lines = results.read()
    assert lines and all({"utc", "commit", "machine", "bench", "args", "metrics", "command"} <= set(x) for x in lines)
    assert all(x["bench"] in results.BENCHES for x in lines)
    text = results.DOC.read_text()
    block = text.split(results.BEGIN)[1].split(results.END)[0].strip()
    assert block == results.table(lines), "run `make bench-report`"
