"""Smoke tests of the benchmark scripts: each runs end to end on tiny random models with a few
prompts and tokens and writes its JSON with the expected keys. No timing is asserted."""

from __future__ import annotations

import json
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
    """A held-out prompt Parquet (bench/peer_prompts.py's layout) of `rows` copy-heavy chat
    requests per task, tasks interleaved: held.parquet under `tmp_path`."""
    import peer_prompts

    path = tmp_path / "held.parquet"
    peer_prompts.write_parquet([peer_prompts.HeldOut(f"{task}-{i}", task, "here", tuple(SAY), (1, 2, 3))
                                for i in range(rows) for task in tasks], str(path))
    return path


def test_workloads_are_varied_chat_requests():
    import workloads

    for name in workloads.WORKLOADS:
        reqs = workloads.requests(name, 6, 16)
        assert len({r.messages[0]["content"] for r in reqs}) >= 3, name
        assert all(r.messages[0]["role"] == "user" and r.params.max_tokens == 16 for r in reqs)
    # Seeded, not random per call: the same seed gives the same prompts in another process (a string
    # seed hashes the same everywhere), a longer list extends a shorter one, another seed differs.
    import subprocess

    other = subprocess.run([sys.executable, "-c", "import sys, json; sys.path.insert(0, sys.argv[1]); import workloads; "
                            "print(json.dumps(workloads.prompts('edit', 4)))", str(BENCH)],
                           capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "123", "PATH": ""})
    assert json.loads(other.stdout) == workloads.prompts("edit", 4) == workloads.prompts("edit", 8)[:4]
    assert workloads.prompts("edit", 4, seed=1) != workloads.prompts("edit", 4)


def test_engine_bench_writes_comparisons(models, tmp_path):
    import engine

    target, draft = models
    data = engine.main(["--model", target, "--ngram-model", target, "--target", target, "--draft-model", draft,
                        "--quick", "--max-tokens", "6", "--threads", "1", "--out", str(tmp_path)])
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

    import oracle_chunks

    with pytest.raises(SystemExit):
        oracle_chunks.main(["--input", str(path), "--key-value", "rewrite", "--rows", "99", "--out", str(tmp_path)])
    out = oracle_chunks.main(["--input", str(path), "--key-value", "rewrite", "--model", target, "--rows", "4",
                              "--max-tokens", "4", "--batch-size", "2", "--k", "2", "--chunks", "2,4", "--repeats", "1", "--threads", "1",
                              "--out", str(tmp_path)])
    assert [(r["chunk"], sorted(r["speedup"])) for r in out["runs"]] == [(2, ["ngram:k=2"]), (4, ["ngram:k=2"])]
    assert all(r["speedup"]["ngram:k=2"] > 0 and r["plain_tok_s"] > 0 for r in out["runs"])
    assert "| 4 |" in (tmp_path / "oracle_chunks.md").read_text()

    import workloads

    groups, bad = workloads.from_input(str(path), "task", 7)
    assert [len(g) for g in groups.values()] == [9, 9] and bad == ["bad-0: prompt and messages are both null"]
    assert groups["rewrite"][0].messages == tuple(SAY) and groups["rewrite"][0].params.max_tokens == 7
    assert [r.id for r in groups["continue"][:2]] == ["continue-0", "continue-1"]


def test_the_settings_a_shard_ran_are_priced_chunk_by_chunk_on_the_interleaved_run():
    """Chunk 0's four rows ran half under each arm, chunk 1's all under "none": each chunk's
    time and tokens are the rows' shares of each arm's figures on that chunk."""
    import calibrate
    from engine import Measured

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
    from engine import Measured

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


def test_switch_bench_runs_the_changing_shard_against_plain(models, tmp_path):
    import switch

    target, _ = models
    data = switch.main(["--model", target, "--rows", "3", "--max-tokens", "4", "--repeats", "2", "--threads", "1",
                        "--dtype", "float32", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "switch.json").read_text())
    assert saved["speedup"] == data["speedup"] > 0 and len(saved["runs"]) == 2
    for run in saved["runs"]:
        cal = run["calibrated"]
        assert len(cal["row_settings"]) == 6 and run["identical_rows"] == 6  # greedy, lossless, float32
        assert run["plain"]["output_tokens"] == cal["output_tokens"]
    assert "| repeat |" in (tmp_path / "switch.md").read_text()


def test_run_all_writes_peers_sweep_limit_and_plot(models, tmp_path):
    import run_all

    target, draft = models
    data = run_all.main(["--model", target, "--target", target, "--draft-model", draft, "--ngram-model", target,
                         "--quick", "--max-tokens", "4", "--sweep-rows", "4", "--batches", "1,2", "--skip", "engine,calibrate", "--threads", "1", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "run_all.json").read_text())
    assert [p["batch_size"] for p in saved["sweep"]] == [1, 2]
    assert len(saved["peers"]) == 2
    for p in saved["peers"]:
        labels = [r["label"] for r in p["rows"]]
        assert labels[:2] == ["transformers plain", "transformers assisted"]
        assert all(0.0 <= r["match_prompts"] <= 1.0 for r in p["rows"])
    assert all("measured_over_predicted" in row for row in saved["limit"])
    assert (tmp_path / "sweep.png").stat().st_size > 1000
    assert "## Batch-size sweep" in (tmp_path / "README.md").read_text()
    assert data["sweep"] == saved["sweep"]


def test_shapes_bench_prices_every_shape_from_the_profile_points(models, tmp_path):
    import shapes

    target, _ = models
    data = shapes.main(["--model", target, "--batch-size", "2", "--widths", "3", "--context", "8", "--repeats", "1",
                        "--threads", "1", "--out", str(tmp_path)])
    cells = {(c["batch"], c["tokens"]): c for c in data["cells"]}
    assert set(cells) == {(b, w) for b in (1, 2) for w in (1, 2, 3)} and all(c["ms"] > 0 for c in cells.values())
    assert cells[(1, 1)]["measured_point"] and cells[(1, 1)]["over_tokens_price"] == pytest.approx(1.0)
    assert set(data["summary"]) == {"tokens", "rows"}
    assert "| rows \\ tokens per row |" in (tmp_path / "shapes.md").read_text()


def test_bench_rows_from_a_prompt_parquet_are_calibration_s_own():
    """bench/step_prices.py --input: a task's rows of a prompt Parquet, or exactly the rows a
    shard's calibration samples and confirms on."""
    import workloads

    from batchspec.calibrate.decision import CalibrationSettings, pick_sample

    examples = str(Path(__file__).resolve().parent.parent / "examples" / "prompts.parquet")
    head = workloads.from_parquet(examples, "prose", 5, 24, "head")
    sample = workloads.from_parquet(examples, "prose", 8, 24, "sample")
    confirm = workloads.from_parquet(examples, "prose", 8, 24, "confirm")
    assert len(head) == 5 and len(sample) == 8 and len(confirm) == 8
    assert not {r.id for r in sample} & {r.id for r in confirm}
    every = workloads.from_parquet(examples, "prose", 10**6, 24, "head")
    assert sample == pick_sample(every, CalibrationSettings().sample_rows(8, counterfactual=True), CalibrationSettings().max_tokens)
    assert all(r.prompt is not None and r.params.max_tokens == 24 for r in every)


def test_inflight_bench_runs_every_shard_both_ways_with_the_same_tokens(models, tmp_path):
    """bench/inflight.py: each of make run's shard keys through run_shard with calibration in the
    shard's batch and apart; greedy, so both ways must give the same tokens."""
    import inflight

    target, _ = models
    result = inflight.main(["--model", target, "--rows", "20", "--batch-size", "4", "--max-tokens", "6", "--rounds", "1",
                            "--threads", "1", "--out", str(tmp_path)])
    assert [s["task"] for s in result["shards"]] == list(inflight.TASKS)
    assert all(s["same_tokens"] for s in result["shards"])
    assert all(s["in_flight"]["wall_s"] > 0 and s["apart"]["wall_s"] > 0 for s in result["shards"])
    assert "the sample decoded in the shard's batch" in result["shards"][0]["in_flight"]["reason"]
    assert "the sample decoded in the shard's batch" not in result["shards"][0]["apart"]["reason"]
    assert json.loads((tmp_path / "inflight.json").read_text())["total"]["in_flight"]["wall_s"] > 0
    generated = inflight.main(["--model", target, "--source", "workloads", "--tasks", "edit", "--rows", "20", "--batch-size", "4",
                               "--max-tokens", "4", "--rounds", "1", "--threads", "1", "--out", str(tmp_path), "--name", "generated"])
    assert [(s["task"], s["rows"], s["same_tokens"]) for s in generated["shards"]] == [("edit", 20, True)]
    assert generated["source"] == "workloads"


def test_profile_noise_bench_sets_each_estimator_against_the_mean_ratio(models, tmp_path):
    import profile_noise

    target, _ = models
    data = profile_noise.main(["--model", target, "--batch-sizes", "1,2", "--context", "8", "--widths", "1,3",
                               "--profiles", "4", "--rounds", "3", "--pause", "0", "--pooled", "2",
                               "--threads", "1", "--out", str(tmp_path)])
    assert [(p["batch"], p["width"]) for p in data["points"]] == [(1, 3), (2, 3)]
    for p in data["points"]:
        assert p["mean_ratio"] == pytest.approx(p["mean_ms"] / p["plain_ms"])
        errors = p["errors"]
        assert {"as calibration (one profile)", "fastest of all rounds", "as calibration, mean of 2 profiles"} <= set(errors)
        assert errors["as calibration (one profile)"]["n"] == 4 and errors["as calibration, mean of 2 profiles"]["n"] == 2
        assert all(e["p10"] <= e["median"] <= e["p90"] for e in errors.values())
    assert all(len(ts) == 3 for run in data["tries_ms"] for ts in run.values())  # the warm-up forward is not a try
    assert "| batch | context | tokens per row |" in (tmp_path / "profile_noise.md").read_text()


def test_profile_noise_reads_one_profile_as_the_profile_keeps_it(tiny_engine, monkeypatch):
    """`as_calibration` on the tries `measure.profile` ran gives the figures it kept: the bench's
    `as calibration` estimator is the profile's own rule (`measure.settled`), not a copy of it."""
    import collections

    import profile_noise

    from batchspec.engine.torch import measure

    assert profile_noise.as_calibration({1: [1.0, 1.1, 0.5], 3: [2.0, 2.1, 9.0]}) == {1: 1.0, 3: 2.0}  # settled at two
    assert profile_noise.as_calibration({1: [1.0, 1.5, 0.9], 3: [2.0, 2.1, 1.0]}) == {1: 0.9, 3: 1.0}  # one point was not
    assert profile_noise.as_calibration({1: [1.0, 1.5, 0.9, 0.1], 3: [2.0, 2.1, 1.0, 0.2]}) == {1: 0.9, 3: 1.0}  # at most REPS
    tries, time_forward = collections.defaultdict(lambda: collections.defaultdict(list)), measure.time_forward

    def recorded(batch, model, kind, tokens, b, *rest):
        group = tries[(b, batch.slots)]
        slow = 0.02 if b == 2 and not group[len(tokens)] else 0.0  # batch 2's first round: it cannot settle at two
        seconds = time_forward(batch, model, kind, tokens, b, *rest) + 0.01 + slow
        group[len(tokens)].append(seconds)
        return seconds

    monkeypatch.setattr(measure, "time_forward", recorded)
    tiny_engine.probe_seeds.clear()  # the engine's first profile, before it decoded: it warms the model up
    monkeypatch.setattr(tiny_engine, "warmed", False)
    kept = measure.profile(tiny_engine, [(1, 6, 1), (1, 6, 3), (2, 6, 1), (2, 6, 3)])
    first = min(tries)
    tries[first][1] = tries[first][1][1:]  # the model's warm-up forward
    assert [len(ts) for ts in tries[(2, 6)].values()] == [3, 3]
    for p in kept:
        assert profile_noise.as_calibration(tries[(p.batch, p.context)])[p.tokens] == p.seconds


def test_profile_age_prices_each_round_on_the_first_and_a_fresh_profile(models, tmp_path):
    """bench/profile_age.py: every round has both settings' measured-over-priced figures on every
    profile (the first, a fresh one, the first re-timed round by round), and the bias is the arm's
    figure over plain decoding's."""
    import profile_age

    target, _ = models
    data = profile_age.main(["--model", target, "--workload", "edit", "--rows", "4", "--batch-size", "2",
                             "--k", "2", "--max-tokens", "6", "--rounds", "2", "--threads", "1", "--out", str(tmp_path)])
    assert [r["round"] for r in data["rounds"]] == [0, 1]
    assert all(p[0] == 2 for p in data["grid"])  # the production batch's points only
    for r in data["rounds"]:
        for label in ("none", "ngram:k=2"):
            assert r[label]["steps"] > 0 and all(r[label][name] > 0 for name in profile_age.PROFILES)
        for name in ("first", "fresh", "retimed"):
            assert r[f"bias_{name}"] == pytest.approx(r["ngram:k=2"][name] / r["none"][name])
    assert data["bias"]["first"]["min"] <= data["bias"]["first"]["median"] <= data["bias"]["first"]["max"]
    assert data["rounds"][1]["ngram:k=2"]["retimed"] != data["rounds"][1]["ngram:k=2"]["first"]  # its curve re-timed
    assert "| round | at s |" in (tmp_path / "profile_age.md").read_text()


def test_acceptance_spread_bench_predicts_a_shard_from_its_sample_and_the_keys_other_rows(models, tmp_path, capsys):
    """bench/acceptance_spread.py: every row decoded once, shards drawn from each key, every arm
    predicted on the sample and the key's other rows against the same price on the whole shard. A
    sample that is the whole shard (batch 4, 4 rows) with no history predicts it exactly; a file
    without two shards' rows of any key is refused in one line before a model loads."""
    import acceptance_spread

    target, _ = models
    path = held_parquet(tmp_path, 9, ("rewrite", "continue"))
    with pytest.raises(SystemExit):
        acceptance_spread.main(["--model", "not-a-model", "--input", str(path), "--shard-rows", "5", "--out", str(tmp_path)])
    assert "a key needs two shards of 5 rows" in capsys.readouterr().err
    data = acceptance_spread.main(["--model", target, "--input", str(path), "--shard-rows", "4", "--batch-size", "1", "4",
                                   "--history", "0", "4", "--max-tokens", "6", "--draws", "3", "--threads", "1",
                                   "--out", str(tmp_path)])
    runs = {(r["batch"], r["history"]): r for r in data["runs"]}
    assert set(runs) == {(1, 0), (1, 4), (4, 0), (4, 4)}
    assert runs[(4, 0)]["within_10pct"] == 1.0 and runs[(4, 0)]["median_abs_error"] == 0.0  # the whole shard
    assert [r["pipeline"] for r in data["runs"]] == [False, True, False, True]  # the drift window, 16 or 32, capped at 4
    assert all(r["arms"] == 2 * 3 * 4 for r in data["runs"])  # two keys, three draws, four arms
    assert "| batch | shard rows | sample rows |" in (tmp_path / "acceptance_spread.md").read_text()
    data = acceptance_spread.main(["--model", target, "--input", str(path), "--shard-rows", "4", "--batch-size", "4",
                                   "--history", "0", "4", "8", "--max-tokens", "6", "--in-file-order", "--threads", "1",
                                   "--out", str(tmp_path)])
    assert list(acceptance_spread.pairs(9, 4, 3, None, True)) == [([0, 1, 2, 3], [4, 5, 6, 7])]  # the 9th row: no block
    assert list(acceptance_spread.pairs(12, 4, 3, None, True))[-1] == (list(range(8)), [8, 9, 10, 11])  # all rows before
    assert [(r["history"], r["arms"]) for r in data["runs"]] == [(0, 8), (4, 8), (8, 8)]  # one block per key, four arms
    assert data["runs"][0]["within_10pct"] == 1.0  # the sample is the whole block
    assert data["runs"][1] == {**data["runs"][2], "history": 4}  # 8 asked, the 4 rows before the block there are



def test_fast_model_writes_a_model_the_engine_loads_with_smollm2s_tokenizer(smol_tokenizer, tmp_path):
    """bench/fast_model.py: a random Llama of SmolLM2's config shrunk, with its tokenizer and chat
    template, seeded (the same weights twice), that the torch engine loads from the folder and
    decodes greedily with the same prompt ids as SmolLM2."""
    import fast_model

    from batchspec.engine.base import Request, SamplingParams, SpecConfig
    from batchspec.engine.torch.engine import TorchEngine

    params = fast_model.write(tmp_path / "a", hidden=16, layers=1)
    assert params == fast_model.write(tmp_path / "b", hidden=16, layers=1)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    engine = TorchEngine.load(str(tmp_path / "a"))
    chat = Request("c", messages=({"role": "user", "content": "Say hi"},), params=SamplingParams(max_tokens=6))
    assert engine.encode(chat) == list(smol_tokenizer.apply_chat_template(list(chat.messages), add_generation_prompt=True,
                                                                          tokenize=True, return_dict=True)["input_ids"])
    a, b = (engine.generate([chat], SpecConfig(), 1).completions[0] for _ in range(2))
    assert a.error is None and a.output_tokens == 6 and a.token_ids == b.token_ids


def test_argmax_bench_sets_torchs_pick_beside_the_engines_with_the_same_tokens(models, tmp_path):
    """bench/argmax.py: the pick alone over each shape, and whole decodes with either pick in
    every place the engine picks, alternating; greedy, so the tokens must be the same both ways,
    and the engine's own pick is back in place afterwards."""
    import argmax

    from batchspec.engine import sampling
    from batchspec.engine.torch import decode

    target, _ = models
    path = held_parquet(tmp_path, 5)
    with pytest.raises(SystemExit):
        argmax.main(["--model", target, "--input", str(path), "--workload", "nothing", "--out", str(tmp_path)])
    out = argmax.main(["--model", target, "--input", str(path), "--workload", "continue", "--rows", "5", "--max-tokens", "5",
                       "--batch-size", "2", "--k", "2", "--rounds", "2", "--reps", "2", "--threads", "1", "--out", str(tmp_path)])
    assert [d["arm"] for d in out["decodes"]] == ["none", "ngram:k=2"]
    assert all(d["same_tokens"] and len(d["torch_s"]) == len(d["blocked_s"]) == 2 for d in out["decodes"])
    assert len(out["picks"]) == 10 and all(p["equal"] and p["torch_ms"] > 0 for p in out["picks"])
    assert sampling.argmax is decode.argmax and sampling.argmax is not argmax.torch_argmax
    assert "| ngram:k=2 |" in (tmp_path / "argmax.md").read_text()


def test_interfere_runs_the_command_beside_bursts_and_keeps_its_status(capsys):
    """bench/interfere.py: the command runs while a process spins in bursts, its exit status is
    the script's, the bursts are counted, and no burner outlives the command; no command is an
    error."""
    import multiprocessing

    import interfere

    script = "import time; time.sleep(1.5); raise SystemExit(3)"
    assert interfere.main(["--burst-ms", "10", "--every-ms", "20", "--", sys.executable, "-c", script]) == 3
    said = capsys.readouterr().err
    bursts = int(said.split("interfere: ")[1].split(" bursts")[0])
    assert bursts >= 1 and "of the wall per process" in said
    assert not multiprocessing.active_children()
    with pytest.raises(SystemExit):
        interfere.main(["--burst-ms", "10"])


def test_confirm_window_bench_sets_the_steps_after_a_switch_beside_the_arms_later_ones(models, tmp_path):
    """bench/confirm_window.py: the shard switched from plain decoding to the arm after its
    sample, the whole shard under the arm, and plainly; each part's steps at the batch size, their
    price ratio and cache length; the window is the first arm steps after the switch."""
    import confirm_window

    target, _ = models
    path = held_parquet(tmp_path, 12)
    out = confirm_window.main(["--model", target, "--input", str(path), "--workload", "continue", "--rows", "12",
                               "--max-tokens", "8", "--batch-size", "2", "--sample", "2", "--window", "3", "--rounds", "1",
                               "--threads", "1", "--out", str(tmp_path)])
    r = out["rounds"][0]
    assert set(r) == set(confirm_window.PARTS) and out["sample"] == 2
    assert r["window"]["steps"] == 3 and r["later"]["steps"] > 0 and r["sample"]["steps"] > 0
    assert all(r[p]["over_price"] > 0 and r[p]["slots"] > 0 for p in ("window", "arm", "plain"))
    assert "| 1 | window | 3 |" in (tmp_path / "confirm_window.md").read_text()


def test_first_shard_bench_runs_each_length_on_a_fresh_worker(models, tmp_path):
    """bench/first_shard.py: one shard per key and output length, side by side, each on a fresh
    worker (no profile carried from the shard before it), its shares of its own wall."""
    import first_shard

    target, _ = models
    path = held_parquet(tmp_path, 12, ("continue", "extract"))
    out = first_shard.main(["--model", target, "--input", str(path), "--rows", "12", "--max-tokens", "4,8",
                            "--batch-size", "2", "--threads", "1", "--out", str(tmp_path)])
    assert [(r["shard"], r["max_tokens"]) for r in out["shards"]] == [("continue", 4), ("continue", 8), ("extract", 4), ("extract", 8)]
    for r in out["shards"]:
        assert r["rows"] == 12 and 0 < r["output_tokens"] <= 12 * r["max_tokens"]
        assert r["overhead_share"] == pytest.approx(r["calibration_overhead_s"] / r["wall_s"])
        assert r["profile_share"] == pytest.approx(r["profile_s"] / r["wall_s"])
        assert sum(r["rows_by_setting"].values()) == 12
    assert "| extract | 8 |" in (tmp_path / "first_shard.md").read_text()


def test_slot_bloat_bench_sets_one_call_beside_short_calls_and_times_a_compaction(models, tmp_path):
    """bench/slot_bloat.py: each round decodes the rows in one call and in short calls, with the
    slots a step read; the compaction squeezes a batch to its longest row and is set against a
    plain step's price at both lengths."""
    import slot_bloat

    target, _ = models
    path = held_parquet(tmp_path, 8)
    out = slot_bloat.main(["--model", target, "--input", str(path), "--workload", "continue", "--rows", "8",
                           "--max-tokens", "6", "--batch-size", "2", "--chunk", "2", "--rounds", "1",
                           "--threads", "1", "--out", str(tmp_path)])
    assert [r["chunk"] for r in out["runs"]] == [8, 2]
    assert all(r["steps"] > 0 and r["mean_slots"] > 0 and r["goodput"] > 0 for r in out["runs"])
    c = out["compaction"]
    assert c["longest"] < c["slots"] and c["compact_s"] > 0 and c["step_s_at_slots"] > 0
    assert "| 0 | 8 |" in (tmp_path / "slot_bloat.md").read_text()


def test_engine_bench_suffix_runs_the_shared_workloads_and_the_memory_check(models, tmp_path):
    import engine
    import workloads

    for name in workloads.SHARED_WORKLOADS:
        assert len(set(workloads.prompts(name, 6, seed=57))) == 6, name
    target, _ = models
    engine.main(["--suffix", "--model", target, "--suffix-rows", "4", "--max-tokens", "6", "--suffix-memory-rows", "40",
                 "--threads", "1", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "suffix.json").read_text())
    assert [w["workload"] for w in saved["workloads"]] == [*workloads.SHARED_WORKLOADS, "prose"]
    for w in saved["workloads"]:
        assert w["lossless"] and set(w["measured"]) >= {"ngram:k=8", "suffix:k=8"}
        assert set(w["counterfactual_tokens_per_step"]) == {"ngram:k=2", "ngram:k=4", "ngram:k=6", "ngram:k=8",
                                                            "suffix:k=4", "suffix:k=8", "suffix:k=16"}
    assert "none" in saved["workloads"][-1]["measured"]  # prose runs plain decoding too
    memory = saved["memory"]
    assert memory["random"]["rows"] == memory["structured"]["rows"] == 40 and memory["cap_8mb"]["held"]
    assert "| workload |" in (tmp_path / "suffix.md").read_text()
