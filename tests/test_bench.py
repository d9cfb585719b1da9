"""Smoke tests of the maintained benches (bench/engine.py, calibrate.py, pipeline.py, scale.py, sim.py;
peer.py in test_bench_peer.py): each has --help and runs end to end on tiny random models with a
few prompts and tokens, and the one record of figures (bench/common/results.py) appends only when
asked and makes docs/performance.md's table. No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
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


@pytest.mark.parametrize("bench", ["engine", "calibrate", "pipeline", "peer", "scale", "sim"])
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


def line_dtype(path) -> str:
    return json.loads(path.read_text().splitlines()[-1])["args"]["dtype"]


def test_engine_bench_structured_option_runs_the_extraction_arms_and_records_them(models, tmp_path):
    import engine

    target, _ = models
    argv = ["--structured", "--model", target, "--quick", "--max-tokens", "8", "--threads", "1"]
    data = engine.main([*argv, "--record", "--results", str(tmp_path / "r.jsonl")])
    assert data["machine"]["dtype"] == "float32" == line_dtype(tmp_path / "r.jsonl")  # where its equality check holds
    with pytest.raises(SystemExit):
        engine.main([*argv, "--dtype", "bfloat16"])  # refused in one line, before any model loads
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
    # the best cap against the best n-gram length, on chosen workloads
    one = engine.main([*argv, "--suffix-k", "16", "--suffix-ngram-k", "4", "--suffix-workloads", "templated",
                       "--suffix-memory-rows", "8"])
    assert [w["workload"] for w in one["workloads"]] == ["templated"]
    assert set(one["workloads"][0]["measured"]) == {"ngram:k=4", "suffix:k=16"}
    assert line["metrics"]["cap_8mb_held"] is True and line["metrics"]["tree_mb_counted@random"] > 0
    assert json.loads((tmp_path / "engine_suffix.json").read_text())["memory"]["random"]["rows"] == 40
    assert "| workload |" in (tmp_path / "engine_suffix.md").read_text()


def test_calibrate_bench_sets_each_calibrated_shard_beside_its_oracle_and_records_when_asked(models, tmp_path):
    import calibrate

    target, draft = models
    data = calibrate.main(["--model", target, "--draft-model", draft, "--rows", "6", "--max-tokens", "6", "--batch-size", "2",
                           "--workloads", "edit,prose", "--threads", "1", "--later-shard",
                           "--record", "--results", str(tmp_path / "r.jsonl")])
    assert [s["key"] for s in data["shards"]] == ["edit", "prose"]
    for s in data["shards"]:
        assert s["rows"] == 6 and s["vs_oracle"] == pytest.approx(s["goodput"] / s["oracle_goodput"])
        assert set(s["measured_speedups"]) == {"none", *s["predicted_speedups"]} and s["measured_speedups"]["none"] == 1.0
        assert sum(s["ran"].values()) == 6 and s["events"][0].split(":")[1] == "start"
    (line,) = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert line["bench"] == "calibrate" and line["metrics"] == data["metrics"]


def test_calibrate_bench_shards_a_prompt_parquet_it_did_not_write_by_a_column(models, tmp_path):
    import calibrate

    path = held_parquet(tmp_path, 4, tasks=("continue", "summarize"))
    data = calibrate.main(["--model", models[0], "--input", str(path), "--rows", "4", "--max-tokens", "4", "--batch-size", "2",
                           "--threads", "1"])
    assert [s["key"] for s in data["shards"]] == ["continue", "summarize"]


def test_sim_bench_replays_every_shard_against_its_exact_oracle(tiny_model_dir, tmp_path, monkeypatch):
    import sim

    monkeypatch.setattr(sim, "CACHE", tmp_path / "cache")
    path = tmp_path / "in.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"task": ["a", "b"] * 8, "prompt": [f"w{i % 5 + 1} w{i % 3 + 2} w1 w2 w3" for i in range(16)]}), path)
    argv = ["--input", str(path), "--shard-by", "task", "--regime", "gpu-roofline,trtllm", "--batch-size", "2",
            "--rows", "8", "--model", str(tiny_model_dir), "--max-tokens", "8", "--prompt-format", "raw",
            "--switch", "a,b", "--suffix", "4", "--json", str(tmp_path / "sim.json")]
    out = sim.main(argv)
    again = sim.main(argv)  # recorded once; deterministic in virtual time
    assert [r["job"] for r in out] == [r["job"] for r in again]
    assert (tmp_path / "cache").exists() and json.loads((tmp_path / "sim.json").read_text())["simulated"] is True
    for r in out:
        assert [s["key"] for s in r["shards"]] == ["a", "b", "switch"]
        for s in r["shards"]:
            assert s["vs_oracle"] == pytest.approx(s["goodput"] / s["oracle_goodput"])
            assert sum(s["ran"].values()) == s["rows"] == 8
            assert set(s["oracle_speedups"]) == {"none", "ngram:k=2", "ngram:k=4", "ngram:k=6", "ngram:k=8", "suffix:k=4"}
        assert r["job"]["oracle_goodput"] >= r["job"]["static_goodput"]
        assert r["job"]["schedule_goodput"] >= r["job"]["static_goodput"]  # one arm everywhere is a schedule too
        # where an arm is a build, the job is also judged against the oracle that pays its builds
        assert ("vs_oracle_with_builds" in r["job"]) == (r["regime"] == "trtllm")


def test_sim_oracle_runs_kept_in_a_file_give_the_same_figures_without_running_again(tiny_model_dir, tmp_path, monkeypatch):
    import sim

    monkeypatch.setattr(sim, "CACHE", tmp_path / "cache")
    path = tmp_path / "in.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"task": ["a", "b"] * 4, "prompt": [f"w{i % 5 + 1} w{i % 3 + 2} w1 w2" for i in range(8)]}), path)
    def at(batches):
        return ["--input", str(path), "--shard-by", "task", "--regime", "cpu", "--batch-size", batches, "--rows", "4",
                "--model", str(tiny_model_dir), "--max-tokens", "6", "--prompt-format", "raw", "--switch", "", "--no-schedule"]

    argv = at("1,2")
    plain = sim.main(argv)
    kept = tmp_path / "oracle.pkl"
    first = sim.main([*argv, "--oracle-runs", str(kept)])
    assert kept.exists() and [r["shards"] for r in first] == [r["shards"] for r in plain]

    def ran(*a, **k):
        raise AssertionError("an oracle run kept in the file ran again")

    monkeypatch.setattr(sim, "run_arm", ran)
    again = sim.main([*argv, "--oracle-runs", str(kept)])
    assert [r["shards"] for r in again] == [r["shards"] for r in plain]
    # a batch size the file does not hold runs its oracles (and here fails, run_arm being stubbed)
    with pytest.raises(AssertionError, match="ran again"):
        sim.main([*at("4"), "--oracle-runs", str(kept)])
    with pytest.raises(SystemExit):
        sim.main([*argv, "--oracle-runs", str(kept), "--record"])


def test_sim_bench_records_and_replays_an_eagle3_head_among_the_arms(tiny_model_dir, tiny_pair, tmp_path, monkeypatch):
    """--eagle3 FOLDER: the head's chains are recorded, as deep as its deepest arm, under a cache key
    of its files and that depth (a retrained head or a deeper arm records anew), and its arms are
    replayed beside the others."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import sim
    from tests.engine.torch.eagle3_heads import released, write

    monkeypatch.setattr(sim, "CACHE", tmp_path / "cache")
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"task": ["a", "b"] * 4, "prompt": [f"w{i % 5 + 1} w{i % 3 + 2} w1 w2 w3" for i in range(8)]}), path)
    head = write(tmp_path / "head", *released(tiny_pair[0], draft_vocab=2048))
    argv = ["--input", str(path), "--shard-by", "task", "--regime", "cpu", "--batch-size", "2", "--rows", "4",
            "--model", str(tiny_model_dir), "--max-tokens", "6", "--prompt-format", "raw", "--switch", "", "--ngram", "2",
            "--eagle3", str(head), "--eagle3-ks", "1,3", "--no-schedule"]

    def cached() -> set:
        return set((tmp_path / "cache").glob("*.pkl"))

    (out,) = sim.main(argv)
    for s in out["shards"]:
        assert set(s["oracle_speedups"]) == {"none", "ngram:k=2", "eagle3:k=1", "eagle3:k=3"}
        assert s["arm_s"]["eagle3:k=3"] > s["arm_s"]["eagle3:k=1"] > 0  # the head's forwards are priced
    first = cached()
    assert len(first) == 2  # the rows asked for, and every row recorded so far
    sim.main(argv)
    assert cached() == first  # the same head: read from the cache
    write(head, *released(tiny_pair[0], draft_vocab=1024))  # the head retrained
    sim.main(argv)
    assert len(cached()) == 4
    sim.main(argv[:-3] + ["--eagle3-ks", "1,4", "--no-schedule"])  # deeper than recorded
    assert len(cached()) == 6


def test_eagle3_bench_saves_a_head_and_its_held_out_prompts_as_the_sim_reads_them(tiny_pair, tmp_path):
    """--save-heads: the head in its released format and the prompts it never trained on, with
    the columns bench/sim.py's --input and --shard-by task read."""
    import eagle3
    import pyarrow.parquet as pq
    from tests.engine.torch.eagle3_heads import released, write

    from batchspec.engine.base import Request
    from batchspec.engine.eagle3_format import is_head

    head = write(tmp_path / "trained", *released(tiny_pair[0], draft_vocab=2048))
    held_out = [Request(f"prose-{i:04d}", messages=({"role": "user", "content": f"write {i}"},)) for i in (7, 8)]
    eagle3.save_for_sim(tmp_path / "out" / "prose", str(head), held_out, "prose")
    assert is_head(str(tmp_path / "out" / "prose" / "head"))
    table = pq.read_table(tmp_path / "out" / "prose" / "held_out.parquet").to_pylist()
    assert table == [{"id": "prose-0007", "task": "prose", "prompt": "write 7"}, {"id": "prose-0008", "task": "prose", "prompt": "write 8"}]


def test_sim_oracle_with_builds_is_the_best_sequence_of_engines_paying_each_change():
    import sim

    shards = [{"arm_s": {"none": 10.0, "k": 4.0}}, {"arm_s": {"none": 10.0, "k": 20.0}}, {"arm_s": {"none": 10.0, "k": 4.0}}]
    assert sim.build_oracle_s(shards, 0.0) == pytest.approx(4 + 10 + 4)  # every shard its best arm
    assert sim.build_oracle_s(shards, 5.0) == pytest.approx(4 + 10 + 5 + 5 + 4)  # k, a build, none, a build, k
    assert sim.build_oracle_s(shards, 100.0) == pytest.approx(4 + 20 + 4)  # the first engine, kept: no build repays
    assert sim.build_oracle_s(shards[1:2], 100.0) == pytest.approx(10)  # the first engine is free: the best one


def test_sim_one_arm_is_the_best_worst_shard_of_two_batches_any_single_arm_gets():
    import sim

    def shard(rows, vs, speedups):
        return {"shard": "s", "rows": rows, "vs_oracle": vs, "ran": {"none": rows}, "oracle": "none",
                "oracle_speedups": speedups, "arm_s": {a: rows / v for a, v in speedups.items()}}

    shards = [shard(8, 1.0, {"none": 1.0, "k2": 1.5, "k4": 2.0}),  # k4 best: k2 0.75, none 0.5
              shard(8, 0.6, {"none": 1.0, "k2": 0.9, "k4": 0.5}),  # none best: k2 0.9, k4 0.5
              shard(2, 0.1, {"none": 1.0, "k2": 0.1, "k4": 0.1})]  # under two batches: not judged
    got = sim.held_out_metrics(shards, batch_size=4)
    assert got["min_vs_oracle_2_batches"] == 0.6
    assert (got["one_arm"], got["one_arm_min_vs_oracle"]) == ("k2", 0.75)  # none 0.5, k4 0.5
    assert got["longest_shard_s"] == 20.0  # every shard, under its slowest arm (the third's k2 and k4)
    small = sim.held_out_metrics(shards[2:], batch_size=4)  # no shard of two batches: over all
    assert small["min_vs_oracle_2_batches"] is None and small["one_arm_min_vs_oracle"] == 1.0


def test_sim_scheduled_control_runs_each_step_under_the_arm_for_the_rows_it_runs():
    from types import SimpleNamespace

    import sim

    from batchspec.engine.base import SpecConfig

    long, short = SpecConfig("ngram", 4), SpecConfig("ngram", 2)
    control = sim.Scheduled({1: long, 4: short}, 8)
    assert control(SimpleNamespace(in_flight={1: [], 2: []}, queued=0)) == long  # a drain of 2 rows
    assert control(SimpleNamespace(in_flight={i: [] for i in range(3)}, queued=5)) == short  # a full batch of 8
    assert control(SimpleNamespace(in_flight={}, queued=0)) is None
    assert control.arm_at(3) == long and control.arm_at(4) == short


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
    from common import report, results

    def line(utc, value, **args):
        return {"utc": utc, "commit": "abc1234", "machine": "m", "bench": "engine", "args": {"quick": False, "threads": 1, **args},
                "metrics": {"plain_b8_vs_b1": value}, "command": "python bench/engine.py"}

    lines = [line("2026-12-01T00:00:00+00:00", 4.0), line("2026-12-02T00:00:00+00:00", 5.0, threads=2),
             line("2026-12-01T00:00:00+00:00", 3.0, quick=True),
             {**line("2026-11-01T00:00:00+00:00", 2.0), "bench": "peer", "metrics": {"ratio": 1.5, "source": "README"},
              "command": "python bench/peer.py", "prepare": "python make.py --out in.parquet"}]
    assert [(x["bench"], x["metrics"]) for x in results.latest(lines)] == [
        ("engine", {"plain_b8_vs_b1": 3.0}), ("engine", {"plain_b8_vs_b1": 5.0}), ("peer", {"ratio": 1.5, "source": "README"})]
    # an option added later, left off, does not split a figure from the lines recorded before it
    newer = {**line("2026-12-03T00:00:00+00:00", 6.0), "args": {"quick": False, "threads": 1, "no_schedule": False, "tag": None}}
    assert [x["metrics"] for x in results.latest([*lines, newer]) if x["bench"] == "engine"] == [
        {"plain_b8_vs_b1": 3.0}, {"plain_b8_vs_b1": 6.0}]
    # nor does an option that changes nothing without another (sim's eagle3_ks without --eagle3), recorded
    # at its default since: where the other is set, it tells figures apart
    sim = [{**line(f"2026-12-0{d}T00:00:00+00:00", v), "bench": "sim", "args": {"rows": 40, **extra}}
           for d, v, extra in [(1, 1.0, {}), (2, 2.0, {"eagle3": None, "eagle3_ks": [2, 4]}),
                               (3, 3.0, {"eagle3": "head", "eagle3_ks": [2, 4]}), (4, 4.0, {"eagle3": "head", "eagle3_ks": [2]})]]
    assert [x["metrics"]["plain_b8_vs_b1"] for x in results.latest(sim)] == [2.0, 3.0, 4.0]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    doc = tmp_path / "performance.md"
    doc.write_text(f"# Performance\n\nprose\n\n{results.BEGIN}\nold table\n{results.END}\n\nmore prose\n")
    report.main(["--results", str(tmp_path / "r.jsonl"), "--doc", str(doc), "--readme", "", "--grid", "", "--heldout", ""])
    text = doc.read_text()
    assert text.startswith("# Performance\n\nprose\n\n") and text.endswith(f"{results.END}\n\nmore prose\n")
    # a figure is told apart from its bench's others by what changes it (threads does not), with its commit and machine
    # an option left off reads "off", as a line recorded before the option existed does
    assert "old table" not in text and "| engine | quick off | plain_b8_vs_b1 5 | abc1234, m | `python bench/engine.py` |" in text
    assert "| engine | quick True | plain_b8_vs_b1 3 |" in text
    assert "| peer | - | ratio 1.5 (from the README) | abc1234, m | `python make.py --out in.parquet && python bench/peer.py` |" in text
    doc.write_text("no markers\n")
    with pytest.raises(SystemExit, match="expected one"):
        report.update_doc(doc, tmp_path / "r.jsonl")


def test_only_committed_reproducible_runs_go_into_the_projects_record():
    from common import results

    good = {"utc": "u", "commit": "abc1234", "machine": "m", "bench": "calibrate", "metrics": {}, "command": "c",
            "args": {"input": "held.parquet", "threads": 2}, "prepare": "python bench/common/peer_prompts.py --out held.parquet"}
    assert results.check(good) == []
    assert "commit abc1234-dirty" in results.check({**good, "commit": "abc1234-dirty"})[0]
    assert "a path of this machine" in results.check({**good, "args": {"input": "/tmp/held.parquet"}})[0]
    assert "--input-made-by" in results.check({k: v for k, v in good.items() if k != "prepare"})[0]
    assert results.check({**good, "args": {"input": "examples/prompts.parquet"}}) == []  # in the repository
    assert results._without_left_out(["--rows", "8", "--json", "/tmp/x.json", "--work=/tmp/w", "--record"]) == ["--rows", "8"]


def test_docs_performance_shows_the_table_of_bench_results():
    """`make bench-report` was run after the last recorded figure, every line is a committed,
    reproducible run, and the README's "Where it stands" and docs/calibration.md's grid are made
    from the same lines."""
    from common import results, stands

    lines = results.read()
    assert lines and all(set(results.KEYS) <= set(x) for x in lines)
    assert all(x["bench"] in results.BENCHES for x in lines)
    assert {i: results.check(x) for i, x in enumerate(lines) if results.check(x)} == {}
    text = results.DOC.read_text()
    block = text.split(results.BEGIN)[1].split(results.END)[0].strip()
    assert block == results.table(lines), "run `make bench-report`"
    assert results.block(results.README.read_text()) == stands.stands_table(lines), "run `make bench-report`"
    grid = (REPO / "docs" / "calibration.md").read_text()
    assert results.block(grid, stands.GRID_BEGIN, stands.GRID_END) == stands.grid_table(lines), "run `make bench-report`"
    assert results.block(grid, stands.HELDOUT_BEGIN, stands.HELDOUT_END) == stands.heldout_summary(lines), "run `make bench-report`"
    simulator = (REPO / "docs" / "simulator.md").read_text()
    assert results.block(simulator, stands.HELDOUT_BEGIN, stands.HELDOUT_END) == stands.heldout_table(lines), "run `make bench-report`"


def test_heldout_tables_show_the_newest_record_of_each_cell_of_the_protocol():
    """docs/simulator.md's held-out table and docs/calibration.md's summary of it are written from
    the sim records whose input bench/heldout.py made: one row (cell) per shards, regime and batch,
    the newest record of a cell winning; the tuning grid's records are not theirs."""
    from common import stands

    made = "python bench/heldout.py --seed 7 --out heldout.parquet"

    def sim(utc, regime, batch, rows, shard_by="workload", prepare=made, **metrics):
        base = {"min_vs_oracle": 0.9, "min_vs_oracle_2_batches": 0.95, "mean_vs_oracle_2_batches": 0.99, "vs_oracle": 0.98,
                "max_drain_loss": 0.002, "shards": 5, "min_rows": rows, "max_rows": rows, "worst_shard": "yaml-0 0.950 (ngram:k=6 40; ngram:k=8)"}
        return {"utc": utc, "commit": "abc1234", "machine": "m", "bench": "sim", "prepare": prepare, "command": "python bench/sim.py",
                "args": {"input": "heldout.parquet", "shard_by": shard_by, "regime": regime, "batch_size": batch, "rows": rows},
                "metrics": {**base, **metrics}}

    lines = [sim("2026-12-02T00:00:00+00:00", "cpu", 8, 40, worst_shard="newer"),
             sim("2026-12-01T00:00:00+00:00", "cpu", 8, 40, worst_shard="older"),
             sim("2026-12-01T00:00:00+00:00", "trtllm", 32, 40, min_vs_oracle_2_batches=None, mean_vs_oracle_2_batches=None,
                 vs_oracle_with_builds=1.0),
             sim("2026-12-01T00:00:00+00:00", "cpu", 32, 200, shard_by="key", shards=50, min_rows=40, max_rows=200),
             sim("2026-12-01T00:00:00+00:00", "cpu", 1, 256),
             sim("2026-12-03T00:00:00+00:00", "cpu", 8, 40, prepare="python examples/make_prompts.py --out grid.parquet")]
    rows = stands.heldout_table(lines).splitlines()[2:]
    assert rows == [
        "| workload 40 | `cpu` | 8 | 0.950 / 0.990 | 0.900 | 0.980 | +0.2% | newer |",
        "| workload 40 | `trtllm` | 32 | - (none) | 0.900 | 0.980 (1.000) | +0.2% | yaml-0 0.950 (ngram:k=6 40; ngram:k=8) |",
        "| workload 256 | `cpu` | 1 | 0.950 / 0.990 | 0.900 | 0.980 | +0.2% | yaml-0 0.950 (ngram:k=6 40; ngram:k=8) |",
        "| 50 keys, 40-200 rows | `cpu` | 32 | 0.950 / 0.990 | 0.900 | 0.980 | +0.2% | yaml-0 0.950 (ngram:k=6 40; ngram:k=8) |"]
    summary = stands.heldout_summary(lines).splitlines()
    assert summary[0] == "| shards | regime | batch 1 | batch 8 | batch 32 | batch 128 |"
    assert summary[2:] == ["| workload 40 | `cpu` | - | 0.950 / 0.980 | - | - |",
                           "| workload 40 | `trtllm` | - | - | 0.900* / 0.980 | - |",
                           "| workload 256 | `cpu` | 0.950 / 0.980 | - | - | - |",
                           "| 50 keys, 40-200 rows | `cpu` | - | - | 0.950 / 0.980 | - |"]


def test_every_command_the_tables_print_runs_as_printed():
    """Each command of docs/performance.md's and the README's tables names a script of the
    repository and only options that script takes (its --help lists them): nothing elided."""
    import re
    import shlex

    from common import results

    commands = {results.reproduce(x) for x in results.latest(results.read())}
    helps: dict[str, str] = {}
    for command in sorted(commands):
        for part in command.split(" && "):
            words = shlex.split(part)
            assert words[0] == "python" and (REPO / words[1]).is_file(), part
            if words[1] not in helps:
                helps[words[1]] = subprocess.run([sys.executable, str(REPO / words[1]), "--help"], capture_output=True,
                                                 text=True, check=True, timeout=120).stdout
            taken = set(re.findall(r"--[\w-]+", helps[words[1]]))
            asked = {w.split("=")[0] for w in words[2:] if w.startswith("--")}
            assert asked <= taken, f"{part}: {sorted(asked - taken)} not among {words[1]}'s options"


def test_performance_page_describes_every_maintained_bench_and_counts_them():
    """docs/performance.md has a section for each bench the record keeps (results.BENCHES), named
    after its script, and says how many there are: a bench added without its section fails here."""
    import re

    from common import results

    words = {5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}
    text = (REPO / "docs" / "performance.md").read_text(encoding="utf-8")
    sections = set(re.findall(r"^### (\w+): .*\(`bench/(\w+)\.py`\)$", text, re.M))
    assert {name for name, _ in sections} == set(results.BENCHES), sections
    assert all(name == script for name, script in sections), sections
    assert f"{words[len(results.BENCHES)]} maintained benchmarks under `bench/`" in text


def test_every_simulated_figure_prints_a_command_that_records_in_its_dtype():
    """A recording's tokens are its dtype's: the command beside a simulated figure, run as printed
    (its --dtype, else the simulator's default), records in the dtype the figure was recorded in."""
    import shlex

    import sim
    from common import results

    for line in (x for x in results.latest(results.read()) if x["bench"] == "sim"):
        argv = shlex.split(line["command"])[2:]
        assert sim.parser().parse_args(argv).dtype == line["args"]["dtype"], line["command"]


def test_the_simulator_records_in_float32_whose_greedy_tokens_no_cpu_kernel_changes():
    """bfloat16 greedy tokens change with the CPU's kernels (39 of 83 held-out prompts differ between
    AVX-512 and AVX2 on one machine: docs/simulator.md), float32's do not: the same prompts decoded
    with torch's vector kernels and without them (ATEN_CPU_CAPABILITY=default) agree token for token."""
    import sim

    assert sim.parser().parse_args(["--input", "x", "--shard-by", "k"]).dtype == "float32"
    script = ("import json, sys; from batchspec.engine.torch.engine import TorchEngine; "
              "from batchspec.engine.base import NO_SPEC, Request, SamplingParams; "
              "e = TorchEngine.load('smollm2-135m', dtype='float32', device='cpu'); "
              "rows = [Request(str(i), messages=({'role': 'user', 'content': p},), params=SamplingParams(max_tokens=48)) "
              "for i, p in enumerate(json.loads(sys.argv[1]))]; "
              "print(json.dumps([c.token_ids for c in e.generate(rows, NO_SPEC, 4).completions]))")
    prompts = json.dumps(["Rewrite as YAML: name=ada, role=admin, team=core", "Rename the variable x to count in: "
                          "x = 0\nfor i in range(9):\n    x += i\nprint(x)", "Reply to: my order never arrived.",
                          "Outline a talk on caching."])
    runs = [subprocess.run([sys.executable, "-c", script, prompts], capture_output=True, text=True, timeout=300, check=True,
                           env={**os.environ, **extra}).stdout for extra in ({}, {"ATEN_CPU_CAPABILITY": "default"})]
    assert json.loads(runs[0]) == json.loads(runs[1]) and all(len(t) > 10 for t in json.loads(runs[0]))
