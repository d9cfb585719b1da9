"""`batchspec run` through click's CliRunner: exit codes, one-line errors, the summary, and one
end-to-end run of the real packaged SmolLM2-135M on a handful of example prompts."""

from __future__ import annotations

from pathlib import Path

import json
import shutil

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from batchspec.cli import cli
from batchspec.config.run import DEFAULT_PIPELINE, PIPELINES_DIR, validate_pipeline_file
from tests.data import prompts_table

TRT_CONFIGS = Path(__file__).resolve().parents[2] / "batchspec" / "data" / "trt_configs"
FAST = ["--batch-size", "4", "--max-tokens", "6", "--shard-size", "4"]


def invoke(*args: str):
    return CliRunner().invoke(cli, ["run", *args], catch_exceptions=False)


def test_cli_run_writes_every_row_prints_the_summary_and_names_the_arms_it_left_out(ray_session, tiny_model_dir, tmp_path):
    pq.write_table(prompts_table(6), tmp_path / "p.parquet")
    (tmp_path / "dt.yaml").write_text("speculative_config:\n  decoding_type: Draft_Target\n  max_draft_len: 2\n")
    (tmp_path / "cands.yaml").write_text(f"candidates:\n  - config: {TRT_CONFIGS / 'ngram.yaml'}\n    max_draft_len: [2]\n"
                                         "  - config: dt.yaml\n")
    out = tmp_path / "out"
    result = invoke(str(tmp_path / "p.parquet"), str(out), "--model", str(tiny_model_dir), "--spec", str(tmp_path / "cands.yaml"),
                    "--shard-by", "task", *FAST)
    assert result.exit_code == 0, result.output
    assert "6 rows (0 errors), 2 shards" in result.output
    totals = json.loads((out / "_manifest.json").read_text())["totals"]
    assert totals["decode_tokens_per_s"] == pytest.approx(totals["baseline_tokens_per_s"] * totals["speedup"])
    assert "arm left out of calibration: draft_target:k=2: no draft model configured" in result.output
    assert pl.read_parquet(f"{out}/outputs/*.parquet").height == 6
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["config"]["shard_by"] == "task"
    assert [line.split(":")[0] for line in manifest["totals"]["dropped_arms"]] == ["draft_target"]
    assert manifest["config"]["prompt_format"] == "chat" and "prompt-format mismatch" not in result.output


def test_the_summary_sets_decode_goodput_beside_the_baseline_it_is_compared_with(capsys):
    """The speedup compares decode goodput with plain decoding's priced goodput for the same
    tokens: those two are printed one under the other, the speedup their ratio; the end-to-end
    rate (output tokens over wall time, prefill and Ray included) stands on its own line."""
    from batchspec.cli.run import _print_summary
    from batchspec.pipeline import RunSummary

    _print_summary(RunSummary(output="out", rows=256, error_rows=0, shards=4, shards_skipped=0, shards_failed=0, retries=0,
                              output_tokens=6144, wall_s=120.0, tokens_per_s=50.4, baseline_tokens_per_s=88.9,
                              speedup=1.05, complete=True, decode_tokens_per_s=93.3))
    captured = capsys.readouterr()
    cells = [[c.strip() for c in line.strip("│ ").split("│")] for line in captured.err.splitlines() if "│" in line]
    table = {name: value for name, value, *_ in cells if name}
    names = list(table)
    decode = names.index("decode tokens/s")
    assert names[decode + 1 : decode + 3] == ["plain decoding tokens/s", "speedup vs plain decoding"]
    assert names[decode - 1] == "tokens/s, end to end" and table[names[decode - 1]].startswith("50.4 ")
    assert table["decode tokens/s"].startswith("93.3 ") and table["plain decoding tokens/s"].startswith("88.9 ")
    assert table["speedup vs plain decoding"] == "1.05x"
    assert captured.out.strip() == ("256 rows (0 errors), 4 shards, 50.4 tokens/s end to end, "
                                    "decode 93.3 tokens/s vs plain 88.9: 1.05x -> out")


def test_a_run_whose_rows_come_back_empty_says_so_in_one_line_under_its_summary(ray_session, tiny_model_dir, tmp_path):
    """The symptom of a prompt format the model does not expect: it ends every row at once. Here a
    model whose logits are all zero picks token 0, a special token made an end token, every time."""
    import torch
    from transformers import AutoModelForCausalLM

    model = tmp_path / "ends-at-once"
    shutil.copytree(tiny_model_dir, model)
    lm = AutoModelForCausalLM.from_pretrained(model)
    with torch.no_grad():
        lm.get_output_embeddings().weight.zero_()
    lm.save_pretrained(model)
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, lm.config.eos_token_id]}))
    pq.write_table(prompts_table(6), tmp_path / "p.parquet")
    out = tmp_path / "out"
    result = invoke(str(tmp_path / "p.parquet"), str(out), "--model", str(model), "--spec", "none", "--prompt-format", "raw", *FAST)
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    summary = next(i for i, line in enumerate(lines) if line.startswith("6 rows (0 errors)"))
    assert summary + 1 < len(lines), result.output
    assert lines[summary + 1] == ("warning: 6 of 6 rows returned an empty text: a likely prompt-format mismatch "
                                  "(prompt_format raw; try --prompt-format chat (an instruct model?))"), lines[summary:]
    stats = pl.read_parquet(f"{out}/stats/*.parquet")
    assert stats["empty_rows"].sum() == 6 and set(stats["prompt_format"]) == {"raw"}
    assert json.loads((out / "_manifest.json").read_text())["config"]["prompt_format"] == "raw"


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        (lambda d: (d / "bad.parquet").write_bytes(b"PAR1 not really parquet"), [], r"bad\.parquet is not readable Parquet"),
        (lambda d: pq.write_table(pa.table({"q": ["x"]}), d / "bad.parquet"), [], r"needs a 'prompt'"),
        (lambda d: pq.write_table(prompts_table(2), d / "bad.parquet"), ["--shard-by", "topic"], r"--shard-by column 'topic'"),
        (lambda d: pq.write_table(prompts_table(2), d / "bad.parquet"), ["--engine", "trtllm"], r"engine trtllm needs tensorrt_llm"),
        (lambda d: pq.write_table(prompts_table(2), d / "bad.parquet"), ["--workers", "0"], r"--workers: expected an integer >= 1, got 0"),
        (lambda d: pq.write_table(prompts_table(2), d / "bad.parquet"), ["--prompt-format", "json"],
         r"--prompt-format: expected one of chat, raw, got 'json'"),
    ],
)
def test_cli_problems_are_one_line_and_exit_non_zero(tmp_path, make, args, message):
    make(tmp_path)
    result = invoke(str(tmp_path / "bad.parquet"), str(tmp_path / "out"), *args)
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    import re

    assert re.search(message, lines[0]), lines[0]
    assert not (tmp_path / "out" / "_SUCCESS").exists()


def test_shipped_pipeline_files_validate():
    assert "engine torch" in validate_pipeline_file(DEFAULT_PIPELINE)
    assert "engine trtllm" in validate_pipeline_file(PIPELINES_DIR / "gpu_trtllm.yaml")


def test_pipeline_file_errors_name_file_key_and_expectation(tmp_path):
    from batchspec.errors import ConfigError

    bad = tmp_path / "p.yaml"
    bad.write_text("shard_size: -3\n")
    with pytest.raises(ConfigError, match=r"p\.yaml: shard_size: expected an integer >= 1, got -3"):
        validate_pipeline_file(bad)
    bad.write_text("prompt_format: xml\n")
    with pytest.raises(ConfigError, match=r"p\.yaml: prompt_format: expected one of chat, raw, got 'xml'"):
        validate_pipeline_file(bad)
    bad.write_text("worker: {gpus: 1}\n")
    with pytest.raises(ConfigError, match=r"p\.yaml: worker\.gpus: unknown key"):
        validate_pipeline_file(bad)


def test_end_to_end_on_the_packaged_smollm2(ray_session, smollm2_dir, tmp_path):
    table = pq.read_table(Path(__file__).resolve().parents[2] / "examples" / "prompts.parquet").slice(0, 4)
    pq.write_table(table, tmp_path / "p.parquet")
    out = tmp_path / "out"
    result = invoke(str(tmp_path / "p.parquet"), str(out), "--max-tokens", "8", "--batch-size", "4")
    assert result.exit_code == 0, result.output
    df = pl.read_parquet(f"{out}/outputs/*.parquet")
    assert sorted(df["id"]) == sorted(table.column("id").to_pylist())
    assert df["error"].null_count() == 4 and (df["output_tokens"] > 0).all()
    assert set(df["task"]) == set(table.column("task").to_pylist())


def test_options_override_the_pipeline_file_which_overrides_defaults(tmp_path, monkeypatch):
    from batchspec.config.run import RunConfig, build_config

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text("shard_size: 5\nbatch_size: 3\nworker: {num_cpus: 0.5}\ncandidates: c.yaml\n")
    (tmp_path / "c.yaml").write_text("candidates: []\n")
    config = build_config("in", "out", str(pipeline), shard_size=7, max_attempts=5)
    assert (config.shard_size, config.batch_size, config.max_tokens) == (7, 3, RunConfig.max_tokens)
    assert (config.worker.num_cpus, config.worker.max_attempts) == (0.5, 5)
    assert config.candidates == str(tmp_path / "c.yaml"), "relative paths are taken from the pipeline file"
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    assert build_config("in", "out", str(pipeline)).ray_address == "ray://head:10001"


def test_plan_only_prints_the_shard_table_and_a_later_run_resumes_without_reading_the_input(ray_session, tiny_model_dir, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(prompts_table(10).slice(0, 6), folder / "a.parquet", row_group_size=2)
    pq.write_table(prompts_table(10).slice(6), folder / "b.parquet", row_group_size=3)
    out = tmp_path / "out"
    # No model is loaded: a model folder that does not exist is no problem for --plan-only.
    result = invoke(str(folder), str(out), "--model", str(tmp_path / "no-such-model"), "--shard-by", "task", "--shard-size", "3", "--plan-only")
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[1].split() == ["00000-code", "code", "3"] and lines[4].split() == ["00003-prose", "prose", "2"]
    assert lines[-1].startswith("10 rows, 4 shards, 2 shard key(s), plan ")
    assert (out / "_plan.json").exists() and len(list((out / "_shards").glob("*.parquet"))) == 4
    assert not (out / "outputs").exists() and not (out / "stats").exists()
    plan_text = (out / "_plan.json").read_text()
    shards = {p.name: p.read_bytes() for p in (out / "_shards").glob("*.parquet")}
    # Same paths and sizes (so the same plan fingerprint), but not Parquet any more: the run below
    # works only because it takes the plan and the shard files and never reads the input again.
    for p in folder.glob("*.parquet"):
        p.write_bytes(b"\0" * p.stat().st_size)
    args = [str(folder), str(out), "--model", str(tiny_model_dir), "--spec", "none", "--shard-by", "task", "--shard-size", "3",
            "--batch-size", "4", "--max-tokens", "4"]
    result = invoke(*args, "--keep-shards")
    assert result.exit_code == 0, result.output
    planned, ran = json.loads(plan_text), json.loads((out / "_plan.json").read_text())
    assert planned.pop("identity")["options"]["max_tokens"] != ran.pop("identity")["options"]["max_tokens"] == 4, \
        "nothing was committed: the run binds the plan to its own options"
    assert ran == planned, "the plan itself is the one --plan-only made"
    assert {p.name: p.read_bytes() for p in (out / "_shards").glob("*.parquet")} == shards, "kept, as they were"
    df = pl.read_parquet(f"{out}/outputs/*.parquet")
    assert sorted(df["id"].to_list()) == [f"row-{i:04d}" for i in range(10)]
    assert df["error"].null_count() == 10 and (out / "_SUCCESS").exists()
    # Without the flag, a rerun of the finished OUTPUT removes _shards/ (still never reading the input).
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert not (out / "_shards").exists() and (out / "_SUCCESS").exists()
    assert pl.read_parquet(f"{out}/outputs/*.parquet").sort("id").equals(df.sort("id"))


# ---- poison cells: a cell fails its row alone, and --plan-only says which rows will fail ----------


def poison_input(path: Path) -> pa.Table:
    """Six rows over two keys, four of them poison: an infinite max_tokens in a float column, a seed
    of 2**64 (a float column), a prompt and an id that are not UTF-8, and a key that is not either."""
    def utf8(values):
        return pa.array(values, pa.binary()).view(pa.string())

    table = pa.table({
        "id": utf8([b"r0", b"r1", b"r2", b"r3\xff", b"r4", b"r5"]),
        "prompt": utf8([b"alpha beta", b"gamma", b"delta \xc3\x28", b"epsilon", b"zeta", b"eta"]),
        "task": utf8([b"a", b"b", b"a", b"b", b"a", b"b\xfe"]),
        "max_tokens": pa.array([4.0, float("inf"), None, None, None, None]),
        "seed": pa.array([None, None, None, None, 2.0**64, None]),
    })
    pq.write_table(table, path)
    return table


def test_poison_cells_fail_their_rows_alone_and_plan_only_names_them(ray_session, tiny_model_dir, tmp_path):
    poison_input(tmp_path / "p.parquet")
    out = tmp_path / "out"
    args = [str(tmp_path / "p.parquet"), str(out), "--model", str(tiny_model_dir), "--shard-by", "task", "--spec", "none", *FAST]
    plan = invoke(*args, "--plan-only")
    assert plan.exit_code == 0, plan.output
    assert "3 of 6 rows will fail (first r2: prompt is not valid UTF-8)" in plan.output
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    df = pl.read_parquet(f"{out}/outputs/*.parquet").sort("id")
    assert df.height == 6 and (out / "_SUCCESS").exists()
    errors = dict(zip(df["id"], df["error"]))
    assert errors["r1"] == "max_tokens must be a finite integer, got inf"
    assert errors["r2"] == "prompt is not valid UTF-8"
    assert errors["r4"] == "seed must be an integer in [0, 2**64), got 1.8446744073709552e+19"
    assert errors["r0"] is None and errors["r5"] is None and errors["r3\ufffd"] is None, errors
    assert sorted(set(df["shard_id"])) == ["00000-a", "00001-b", "00002-b"]


def test_a_run_with_a_shard_that_failed_every_attempt_exits_non_zero_in_one_line(monkeypatch, tmp_path):
    """The library's side (error rows, no _SUCCESS, retried next run) is tests/test_pipeline.py's; here
    the command's: the summary, then one line, exit 1."""
    from batchspec import pipeline

    summary = pipeline.RunSummary("out", 4, 2, 2, 0, 1, 2, 10, 1.0, 1.0, None, None, True,
                                  failed_reason="00001-code: shard failed 3 times: RuntimeError: boom")
    monkeypatch.setattr(pipeline, "run", lambda config, progress=None, force=False: summary)
    pq.write_table(prompts_table(2), tmp_path / "p.parquet")
    result = invoke(str(tmp_path / "p.parquet"), str(tmp_path / "out"))
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == ("Error: 1 of 2 shard(s) failed every attempt and are written as error rows "
                                                      "(first 00001-code: shard failed 3 times: RuntimeError: boom); no _SUCCESS; "
                                                      "rerun to retry them")


def test_force_goes_only_with_no_resume(tmp_path):
    result = CliRunner().invoke(cli, ["run", str(tmp_path / "p.parquet"), str(tmp_path / "out"), "--force"])
    assert result.exit_code == 2 and "--force only goes with --no-resume" in result.output


# ---- the smaller ones: each a one-line error or the right behaviour -------------------------------


def one_error_line(result) -> str:
    """The one error line a failed command ends with (a progress bar may come before it; no traceback)."""
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and lines[-1].startswith("Error: "), result.output
    assert sum(line.startswith("Error") for line in lines) == 1 and "Traceback" not in result.output, result.output
    return lines[-1]


def test_an_output_path_that_reads_as_markup_is_printed_as_text(ray_session, tiny_model_dir, tmp_path):
    pq.write_table(prompts_table(2), tmp_path / "p.parquet")
    out = tmp_path / "out[/]x"
    result = invoke(str(tmp_path / "p.parquet"), str(out), "--model", str(tiny_model_dir), "--spec", "none", *FAST)
    assert result.exit_code == 0, result.output
    assert f"-> {out}" in result.output and (out / "_SUCCESS").exists()


def test_a_model_that_fails_to_load_is_one_line(ray_session, tiny_model_dir, tmp_path):
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model_dir, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a truncated download
    pq.write_table(prompts_table(2), tmp_path / "p.parquet")
    line = one_error_line(invoke(str(tmp_path / "p.parquet"), str(tmp_path / "out"), "--model", str(broken), "--spec", "none", *FAST))
    assert line.startswith(f"Error: model {str(broken)!r} cannot be loaded: "), line


def test_a_truncated_committed_stats_file_is_one_line_naming_it(ray_session, tiny_model_dir, tmp_path):
    pq.write_table(prompts_table(4), tmp_path / "p.parquet")
    out = tmp_path / "out"
    args = [str(tmp_path / "p.parquet"), str(out), "--model", str(tiny_model_dir), "--spec", "none", "--shard-by", "task", *FAST]
    assert invoke(*args).exit_code == 0
    stats = out / "stats" / "00000-code.parquet"
    stats.write_bytes(stats.read_bytes()[:100])
    line = one_error_line(invoke(*args))
    assert line == (f"Error: OUTPUT {out}: the commit mark {stats} cannot be read (Parquet: "
                    + line.split("(Parquet: ", 1)[1].split(")")[0] + "); delete it to run that shard again"), line
    report = CliRunner().invoke(cli, ["report", str(out)], catch_exceptions=False)
    assert one_error_line(report).startswith(f"Error: cannot read {out}"), report.output


def test_a_yaml_alias_bomb_is_a_config_error_in_validate_and_run(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    bomb.write_text("\n".join(lines) + "\nshard_size: 4\n")
    result = CliRunner().invoke(cli, ["validate", str(bomb)])
    assert result.exit_code == 1 and f"{bomb}: YAML aliases expand it past 100000 values" in result.output, result.output
    pq.write_table(prompts_table(2), tmp_path / "p.parquet")
    line = one_error_line(invoke(str(tmp_path / "p.parquet"), str(tmp_path / "out"), "--pipeline", str(bomb)))
    assert line == f"Error: {bomb}: YAML aliases expand it past 100000 values (an alias bomb?)", line
    cycle = tmp_path / "cycle.yaml"
    cycle.write_text("shard_size: &s [*s]\n")
    assert "YAML aliases expand it past" in one_error_line(invoke(str(tmp_path / "p.parquet"), str(tmp_path / "out"), "--pipeline", str(cycle)))


def test_sigterm_stops_a_run_in_one_line_and_the_next_run_resumes(ray_session, tiny_model_dir, tmp_path):
    """What a scheduler sends first: the driver stops its workers, releases OUTPUT and says so in one
    line (exit 143, as a process ended by SIGTERM), with no native stack dump."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    pq.write_table(prompts_table(16), tmp_path / "p.parquet")
    out = tmp_path / "out"
    args = [str(tmp_path / "p.parquet"), str(out), "--model", str(tiny_model_dir), "--spec", "none", "--shard-size", "2",
            "--max-tokens", "4", "--batch-size", "2"]
    driver = subprocess.Popen([sys.executable, "-m", "batchspec", "run", *args], env={**os.environ, "HF_HUB_OFFLINE": "1"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (out / "_plan.json").exists() and time.monotonic() < deadline and driver.poll() is None:
        time.sleep(0.2)
    time.sleep(1.0)
    driver.send_signal(signal.SIGTERM)
    _, err = driver.communicate(timeout=120)
    assert driver.returncode == 143, err[-3000:]
    assert "SIGTERM received" not in err and "Traceback" not in err, err[-3000:]
    lines = [line for line in err.strip().splitlines() if line.startswith("Error")]
    assert lines == ["Error: stopped by SIGTERM; committed shards are kept: rerun to resume"], err[-3000:]
    assert err.strip().splitlines()[-1] == lines[0]
    assert json.loads(next((out / "_lease").iterdir()).read_text())["released"]
    again = invoke(*args)
    assert again.exit_code == 0, again.output
