"""`batchspec report` on a real run's output: a tiny-model run through `batchspec.pipeline.run`
(local Ray, torch on CPU, two shards), read back from a folder, from S3 (moto's server on
127.0.0.1, endpoint and credentials from AWS_* variables) and from memory://, plus the HTML page
rendered in headless Chromium.

The Chromium test is also the documented check of the page: it skips when `chromium` is absent
(`apt-get install -y chromium`), and with BATCHSPEC_REPORT_SCREENSHOT=FILE.png it keeps the
screenshot for a person to look at.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import fsspec
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from batchspec.cli import cli
from batchspec.errors import OutputError
from batchspec.report import load_report, render_html, storage_options
from batchspec.report.load import TIME_PARTS
from batchspec.report.plots import arm_bar

REPO = Path(__file__).resolve().parents[2]
ROWS = 12


@pytest.fixture(scope="module")
def real_run(tmp_path_factory, tiny_model_dir, ray_session):
    """OUTPUT of a real `batchspec run`: 12 prompts, two tasks, calibrated n-gram arms vs none."""
    from batchspec.config.run import build_config
    from batchspec.pipeline import run

    root = tmp_path_factory.mktemp("report")
    pq.write_table(pa.table({
        "id": [f"r{i:02d}" for i in range(ROWS)],
        "task": ["code", "prose"] * (ROWS // 2),
        "prompt": [f"x = [{i}, {i}, {i}]; y = [{i}, {i}, {i}]; z = [" for i in range(ROWS)],
    }), root / "in.parquet")
    (root / "pipeline.yaml").write_text(
        f"engine: torch\nmodel: {tiny_model_dir}\ndtype: float32\nspec: auto\n"
        f"candidates: {REPO / 'pipelines' / 'candidates' / 'torch_ngram.yaml'}\n"
        "shard_size: 6\nworkers: 1\nbatch_size: 2\nmax_tokens: 4\nworker: {num_cpus: 1, torch_threads: 1}\n"
        "calibration: {window: 4, measure_steps: 4}\n"
    )
    config = build_config(str(root / "in.parquet"), str(root / "out"), str(root / "pipeline.yaml"), shard_by="task")
    summary = run(config)  # in the session's Ray (one Ray for the whole suite)
    assert summary.complete
    return root / "out"


def test_report_of_a_real_run_agrees_with_its_files(real_run):
    report = load_report(str(real_run))
    outputs = pl.read_parquet(real_run / "outputs" / "*.parquet")
    stats = pl.read_parquet(real_run / "stats" / "*.parquet")
    assert report.complete and not report.warnings
    assert [s.shard_id for s in report.shards] == sorted(stats["shard_id"].to_list())
    assert {s.shard_key for s in report.shards} == {"code", "prose"}
    t = report.totals
    assert (t.shards, t.planned_shards, t.rows, t.output_rows) == (2, 2, ROWS, ROWS)
    assert t.output_tokens == outputs["output_tokens"].sum()
    assert t.finish_reasons == dict(outputs.group_by("finish_reason").len().sort("finish_reason").iter_rows())
    drafted = outputs["draft_tokens"].sum()
    assert t.acceptance_rate == (outputs["accepted_tokens"].sum() / drafted if drafted else None)
    for s in report.shards:
        assert s.output_rows == s.rows == ROWS // 2
        assert sum(s.time_split[p] for p in TIME_PARTS) == pytest.approx(s.wall_s)
        assert all(v >= 0 for v in s.time_split.values())
        chosen_label = "none" if s.spec_method == "none" else f"{s.spec_method}:k={s.draft_len}"
        assert s.decision_source == "calibrated" and s.speedup and s.events[0].kind == "start"
        assert [e.kind for e in s.events].count("profile") <= 1  # one worker: one profile per batch size
        assert "none" in [a.label for a in s.candidates]  # every arm is priced against plain decoding
        measured_arms = [a for a in s.candidates if a.measured]
        assert measured_arms and all(a.tokens_run > 0 and a.tokens_per_s for a in measured_arms)  # written, not dropped
        assert all(not a.tokens_run and a.tokens_per_s is None for a in s.candidates if not a.measured)
        # what the arms ran: every row of the shard finished under one arm, every decode token by one arm's steps
        shard_out = outputs.filter(pl.col("shard_id") == s.shard_id)
        decode_tokens = int((shard_out["output_tokens"] - 1).clip(lower_bound=0).sum())
        assert sum(a.rows_run for a in s.candidates) == s.rows
        assert sum(a.tokens_run for a in s.candidates) == decode_tokens
        # what calibration priced: each arm's counterfactual tally over the same finished rows
        none = next(a for a in s.candidates if a.label == "none")
        assert (none.tally_rows, none.tally_target_steps, none.tally_draft_tokens) == (s.rows - s.error_rows, decode_tokens, 0)
        for a in s.candidates:
            assert a.tally_rows == none.tally_rows and a.predicted_speedup and a.acceptance_exact
            assert a.mean_accepted_len == pytest.approx(1 + a.tally_accepted_tokens / a.tally_target_steps)
            assert arm_bar(a)[0] == a.predicted_speedup > 0  # plotted, whether it ran or not
        assert s.chosen is not None and s.chosen.label == chosen_label and s.chosen.method == s.spec_method
        assert 0 <= s.calibration_share <= 1
        assert s.decision_source in ("calibrated", "fixed")
        # every stats column docs/schema.md documents, filled as it says on a calibrated CPU run
        filled = ("tokens_per_s", "baseline_tokens_per_s", "speedup", "predicted_speedup", "calibration_s", "wall_s",
                  "decode_s", "prefill_s", "draft_s", "verify_s", "other_s", "draft_tokens", "accepted_tokens",
                  "target_steps", "decision_reason", "node_id", "prompt_format")
        assert [c for c in filled if getattr(s, c) is None] == []
        assert s.decode_s == pytest.approx(s.draft_s + s.verify_s + s.other_s)
        assert bool(s.cost_profile) == (s.profile_s > 0)  # the profile: the worker's
        assert (s.gpus, s.gpu_memory_per_gpu, s.builds, s.build_s, s.attempts) == (0.0, None, 0, 0.0, 1)  # a CPU worker
        assert (s.tree_bytes, s.tree_rows, s.tree_hit_rate, s.speculation_unmeasured) == (None, None, None, None)
        assert s.empty_rows == outputs.filter((pl.col("shard_id") == s.shard_id) & (pl.col("text") == "")).height
    assert sum(bool(s.cost_profile) for s in report.shards) == 1  # one worker, one batch size: one profile


def test_each_shard_counts_its_cpu_seconds_and_plain_decodings_price_of_the_same_rows(real_run):
    for s in load_report(str(real_run)).shards:
        assert (s.device, s.devices) == ("cpu", 1)  # a CPU worker of one torch thread: CPU-seconds
        assert s.gpu_s == (s.prefill_s + s.decode_s + s.calibration_s + s.profile_s) * s.devices
        ran_plain = not s.plain_estimated
        assert s.plain_decode_s == (s.decode_s if ran_plain else s.decode_s * s.speedup)
        assert s.plain_gpu_s == (s.prefill_s + s.plain_decode_s) * s.devices
        assert s.plain_gpu_s_err == s.plain_decode_s * s.plain_decode_u * s.devices
        assert (s.plain_decode_u == 0) == ran_plain and s.plain_decode_u < 0.5


def _savings_rows(output: str) -> dict[str, list[str]]:
    """The printed savings table's rows by their first cell."""
    table = output[output.index("what speculation saved"):]
    rows = [[c.strip() for c in line.strip("│┃ ").split("│")] for line in table.splitlines() if line.startswith("│")]
    return {r[0]: r for r in rows}


def test_report_prints_cpu_hours_used_and_saved_per_key_and_for_the_run_as_the_stats_sum_them(real_run):
    """What `batchspec report` prints is the stats' own sums, to the last digit it prints."""
    from batchspec.report.savings import sig

    result = CliRunner().invoke(cli, ["report", str(real_run), "--gpu-hour-price", "2.5"])
    assert result.exit_code == 0, result.output
    assert "what speculation saved, in CPU-hours" in result.output and "CPU-h used" in result.output
    printed = _savings_rows(result.output)
    stats = pl.read_parquet(real_run / "stats" / "*.parquet")
    groups = [(key, stats.filter(pl.col("shard_key") == key)) for key in ("code", "prose")] + [("run", stats)]
    for name, g in groups:
        used, plain = g["gpu_s"].sum() / 3600, g["plain_gpu_s"].sum() / 3600
        err, tokens = g["plain_gpu_s_err"].sum() / 3600, g["output_tokens"].sum()
        mark = "*" if g["plain_estimated"].any() else ""
        expected = [name, str(g.height), sig(used), sig(plain), sig(plain - used) + mark, sig(err), sig(tokens / used),
                    sig(2.5 * used / (tokens / 1e6)), f"{sig(2.5 * (plain - used))} +- {sig(2.5 * err)}"]
        assert printed[name] == expected, (printed, expected)
    doc = json.loads(CliRunner().invoke(cli, ["report", str(real_run), "--json"]).output)["savings"]
    assert doc["unit"] == "CPU" and doc["run"]["used_h"] == pytest.approx(stats["gpu_s"].sum() / 3600, rel=1e-12)
    assert [k["key"] for k in doc["keys"]] == ["code", "prose"]
    plain_only = CliRunner().invoke(cli, ["report", str(real_run)]).output
    assert "cost / M out tok" not in plain_only and "CPU-h saved" in plain_only  # the money columns need a price


def test_report_reads_s3_with_endpoint_and_credentials_from_the_environment(real_run, monkeypatch):
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}.items():
            monkeypatch.setenv(name, value)
        fs_opts, pl_opts = storage_options("s3://runs/x")
        assert fs_opts == {"client_kwargs": {"endpoint_url": endpoint}}
        assert pl_opts["aws_endpoint_url"] == endpoint and pl_opts["aws_allow_http"] == "true"
        fs = fsspec.filesystem("s3", **fs_opts)
        fs.mkdir("runs")
        fs.put(str(real_run), "runs/2026-01-02", recursive=True)
        remote = load_report("s3://runs/2026-01-02/")
        local = load_report(str(real_run))
        assert remote.output == "s3://runs/2026-01-02"
        assert remote.shards == local.shards and remote.totals == local.totals and remote.complete
        result = CliRunner().invoke(cli, ["report", "s3://runs/2026-01-02"])
        assert result.exit_code == 0, result.output
        assert "00000-code" in result.stdout and "total" in result.stdout
        missing = CliRunner().invoke(cli, ["report", "s3://runs/never"])
        assert missing.exit_code == 1 and "not a batchspec run" in missing.output
    finally:
        server.stop()


def test_report_reads_any_fsspec_url_through_fsspec(real_run):
    mem = fsspec.filesystem("memory")
    mem.put(str(real_run), "/report-copy", recursive=True)
    try:
        copy = load_report("memory://report-copy")
        assert copy.totals == load_report(str(real_run)).totals
    finally:
        mem.rm("/report-copy", recursive=True)


def test_an_unfinished_run_is_reported_with_what_is_missing(real_run, tmp_path):
    partial = tmp_path / "partial"
    shutil.copytree(real_run, partial)
    (partial / "_SUCCESS").unlink()
    first = sorted((partial / "stats").iterdir())[0]
    first.unlink()
    report = load_report(str(partial))
    assert not report.complete and report.totals.shards == 1 and report.totals.planned_shards == 2
    assert any("1 of 2 shards committed" in w for w in report.warnings)
    assert any(f"rows of 1 uncommitted shard(s) (first {first.stem})" in w for w in report.warnings)


def test_not_a_run_and_a_plan_without_shards_are_one_line_errors(tmp_path):
    with pytest.raises(OutputError, match="not a batchspec run"):
        load_report(str(tmp_path / "nothing"))
    (tmp_path / "planned").mkdir()
    (tmp_path / "planned" / "_plan.json").write_text(json.dumps({"shards": [{}, {}]}))
    with pytest.raises(OutputError, match="planned, but no shard is committed yet"):
        load_report(str(tmp_path / "planned"))


def test_html_page_is_self_contained_with_four_plots(real_run):
    page = render_html(load_report(str(real_run)))
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 4  # rates, arms, time, CPU-hours saved per key
    assert all(base64.b64decode(img)[:8] == b"\x89PNG\r\n\x1a\n" for img in images)
    assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing fetched from anywhere
    assert "00000-code" in page and "00001-prose" in page


def _colour_share(png: Path, rgb: tuple[int, int, int], tol: int = 12) -> float:
    from PIL import Image

    img = Image.open(png).convert("RGB")
    pixels = list(img.getdata())
    near = sum(all(abs(a - b) <= tol for a, b in zip(p, rgb)) for p in pixels[::7])
    return near / len(pixels[::7])


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium not installed (apt-get install -y chromium)")
def test_html_page_renders_its_plots_in_headless_chromium(real_run, tmp_path):
    page = tmp_path / "report.html"
    result = CliRunner().invoke(cli, ["report", str(real_run), "--html", str(page)])
    assert result.exit_code == 0, result.output
    shot = tmp_path / "shot.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--hide-scrollbars", "--window-size=1280,1400", f"--screenshot={shot}", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    assert shot.exists()
    if os.environ.get("BATCHSPEC_REPORT_SCREENSHOT"):
        shutil.copy(shot, os.environ["BATCHSPEC_REPORT_SCREENSHOT"])
    # The plots are drawn: the chosen-arm gold and the time-split colours cover visible areas.
    assert _colour_share(shot, (0xF0, 0xB4, 0x29)) > 0.002  # chosen arm, calibration time
    assert _colour_share(shot, (0x82, 0x9A, 0xB1)) > 0.002  # prefill time
    assert _colour_share(shot, (0xFF, 0xFF, 0xFF)) < 0.97  # not a blank page


def hostile_run(real_run, root: Path, keys: list[str], folder: str) -> Path:
    """A copy of the real run (in `folder`) whose shards are `len(keys)` copies of one real stats
    row, each with one of `keys` as its shard key: data a report must show as text, never as
    markup or math."""
    out = root / folder
    shutil.copytree(real_run, out)
    shutil.rmtree(out / "outputs")
    stats = pl.read_parquet(real_run / "stats" / "*.parquet").head(1)
    for p in (out / "stats").iterdir():
        p.unlink()
    for i, key in enumerate(keys):
        row = stats.with_columns(pl.lit(f"{i:05d}-k").alias("shard_id"), pl.lit(key).alias("shard_key"))
        row.write_parquet(out / "stats" / f"{i:05d}-k.parquet")
    return out


@pytest.mark.parametrize(("shards", "folder"), [
    (3, "run"),  # keys that read as rich markup
    (61, "run"),  # past MAX_PLOTTED (60) the time plot is by shard key: keys that read as mathtext
    (3, "hostile[/]run"),  # an OUTPUT path that reads as markup and as a glob
])
def test_shard_keys_and_paths_are_shown_as_text_never_as_markup_or_math(real_run, tmp_path, shards, folder):
    keys = ["[/]", r"$\frac{$", "[bold]x[/bold]"]
    out = hostile_run(real_run, tmp_path, [keys[i % len(keys)] + (str(i) if i >= len(keys) else "") for i in range(shards)], folder)
    page = tmp_path / "r.html"
    result = CliRunner().invoke(cli, ["report", str(out), "--html", str(page)])
    assert result.exit_code == 0, result.output
    assert "[/]" in result.output and "[bold]x[/bold]" in result.output and f"batchspec report: {out}" in result.output
    assert "&lt;" not in result.output and r"$\frac{$" in result.output
    assert len(re.findall(r'src="data:image/png;base64,', page.read_text())) == 4
