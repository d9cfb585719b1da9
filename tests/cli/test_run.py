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
    assert (out / "_plan.json").read_text() == plan_text
    assert {p.name: p.read_bytes() for p in (out / "_shards").glob("*.parquet")} == shards, "kept, as they were"
    df = pl.read_parquet(f"{out}/outputs/*.parquet")
    assert sorted(df["id"].to_list()) == [f"row-{i:04d}" for i in range(10)]
    assert df["error"].null_count() == 10 and (out / "_SUCCESS").exists()
    # Without the flag, a rerun of the finished OUTPUT removes _shards/ (still never reading the input).
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert not (out / "_shards").exists() and (out / "_SUCCESS").exists()
    assert pl.read_parquet(f"{out}/outputs/*.parquet").sort("id").equals(df.sort("id"))
