"""`batchspec submit`: the job file's translation (entrypoint, env, address, date) as unit tests, and
end to end against a real Ray head started here with `ray start --head --block` on 127.0.0.1.

The head gets its own --temp-dir and free ports, so other Ray sessions on the machine are neither
joined nor disturbed. It is stopped by signalling the `ray start --block` process group and then
only the processes whose command line names this head's temp dir; `ray stop` is not used because it
stops every Ray process of the machine, other people's included.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from batchspec import submit
from batchspec.cli import cli
from batchspec.config.job import load_job
from batchspec.errors import ConfigError
from tests.cluster import free_ports

REPO = Path(__file__).resolve().parent.parent
RUN_DATE = "2026-01-02"


def write_job(folder: Path, **fields) -> Path:
    doc = {"kind": "batchspec-job", "name": "t", "input": "in.parquet", "output": "/tmp/never/{date}", **fields}
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


# ---------------------------------------------------------------------------------------------
# Units: what a job file turns into


def test_entrypoint_is_batchspec_run_with_options_and_the_fixed_date(tmp_path):
    job = load_job(write_job(tmp_path, output="s3://b/runs/{date}", pipeline="pipelines/local.yaml",
                                    options={"shard_by": "task", "max_tokens": 8, "resume": False, "draft-model": "x y"}))
    argv = shlex.split(submit.entrypoint(job, dt.date(2026, 3, 4)))
    assert argv[:6] == ["python", "-m", "batchspec", "run", "in.parquet", "s3://b/runs/{date}"]
    assert argv[argv.index("--pipeline") + 1] == "pipelines/local.yaml"
    assert argv[argv.index("--shard-by") + 1] == "task"
    assert argv[argv.index("--max-tokens") + 1] == "8"
    assert argv[argv.index("--draft-model") + 1] == "x y"
    assert "--no-resume" in argv and "--resume" not in argv
    assert argv[-2:] == ["--run-date", "2026-03-04"]


def test_run_date_precedence_cli_then_options_then_today(tmp_path):
    job = load_job(write_job(tmp_path, options={"run_date": "2026-05-06"}))
    assert submit.job_run_date(job, dt.date(2026, 1, 1)) == dt.date(2026, 1, 1)
    assert submit.job_run_date(job) == dt.date(2026, 5, 6)
    plain = load_job(write_job(tmp_path))
    assert submit.job_run_date(plain) == dt.datetime.now(dt.timezone.utc).date()


def test_env_vars_are_filled_from_the_submitter_and_a_missing_one_is_named(tmp_path):
    job = load_job(write_job(tmp_path, runtime_env={"env_vars": {"KEY": "${MY_KEY}", "PLAIN": "1", "MIX": "a-${MY_KEY}-b"}}))
    env = submit.resolve_env(job, {"MY_KEY": "s3cret"})
    assert env["env_vars"] == {"KEY": "s3cret", "PLAIN": "1", "MIX": "a-s3cret-b"}
    with pytest.raises(ConfigError, match=r"runtime_env.env_vars.KEY: \$\{MY_KEY\} is not set"):
        submit.resolve_env(job, {})


def test_address_precedence(tmp_path):
    job = load_job(write_job(tmp_path, address="http://file:8265"))
    env = {"BATCHSPEC_ADDRESS": "http://bs:8265", "RAY_ADDRESS": "http://ray:8265"}
    assert submit.resolve_address("http://cli:8265", job, env) == "http://cli:8265"
    assert submit.resolve_address(None, job, env) == "http://bs:8265"
    assert submit.resolve_address(None, job, {"RAY_ADDRESS": "http://ray:8265"}) == "http://ray:8265"
    assert submit.resolve_address(None, job, {}) == "http://file:8265"
    assert submit.resolve_address(None, load_job(write_job(tmp_path)), {}) == "http://127.0.0.1:8265"


def test_working_dir_is_relative_to_the_job_file_and_the_pipeline_is_checked_there(tmp_path):
    (tmp_path / "wd").mkdir()
    (tmp_path / "wd" / "p.yaml").write_text("engine: torch\nworkers: 0\n")
    with pytest.raises(ConfigError, match=r"job.yaml: pipeline: .*p.yaml: workers: expected an integer >= 1"):
        load_job(write_job(tmp_path, pipeline="p.yaml", runtime_env={"working_dir": "wd"}))
    (tmp_path / "wd" / "p.yaml").write_text("engine: torch\nworkers: 2\n")
    job = load_job(write_job(tmp_path, pipeline="p.yaml", runtime_env={"working_dir": "wd"}))
    assert job.runtime_env["working_dir"] == str(tmp_path / "wd")


def test_unreachable_address_is_one_line(tmp_path):
    port = free_ports(1)[0]
    job = write_job(tmp_path)
    result = CliRunner().invoke(cli, ["submit", str(job), "--address", f"http://127.0.0.1:{port}"])
    assert result.exit_code == 1
    assert f"--address http://127.0.0.1:{port}: cannot reach the Ray Jobs API" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


class AgentNotUpYet:
    """A Jobs client whose head answers as a real one did while its job agent was not up (seen in
    this suite under load): JobSubmissionClient raises RuntimeError with Ray's 500 text
    (ray/dashboard/modules/job/job_head.py, submit_job). A real head gives that answer only for a
    moment after it starts, which a test cannot produce on demand."""

    def __init__(self, refusals: int):
        self.refusals, self.submitted = refusals, []

    def get_job_status(self, job_id):
        raise RuntimeError(f"Job {job_id} does not exist")

    def submit_job(self, **kwargs):
        if self.refusals:
            self.refusals -= 1
            raise RuntimeError("Request failed with status code 500: No available agent to submit job, please try again later.")
        self.submitted.append(kwargs["submission_id"])


def test_a_head_whose_job_agent_is_not_up_yet_is_tried_again(tmp_path, monkeypatch):
    job = load_job(write_job(tmp_path))
    plan = submit.plan_submission(job, dt.date(2026, 1, 2), {})
    monkeypatch.setattr(submit.time, "sleep", lambda s: None)
    client = AgentNotUpYet(refusals=3)
    monkeypatch.setattr(submit, "connect", lambda address: client)
    done = submit.submit(job, "http://head:8265", plan)
    assert client.submitted == [done.job_id] and not done.attached

    monkeypatch.setattr(submit, "AGENT_WAIT_S", 0.0)  # an agent that never comes up: one line, no traceback
    monkeypatch.setattr(submit, "connect", lambda address: AgentNotUpYet(refusals=99))
    with pytest.raises(ConfigError, match=r"refused the job: .*No available agent to submit job") as err:
        submit.submit(job, "http://head:8265", plan)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------
# End to end: a real Ray head on 127.0.0.1


def _stop_head(proc: subprocess.Popen, temp_dir: str) -> None:
    """SIGTERM the `ray start --block` group, then anything left that names our temp dir."""
    import psutil

    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=5)  # Ray's processes exit on SIGTERM; `ray start --block` itself may linger
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    ours = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if temp_dir in " ".join(p.info["cmdline"] or []) or (p.pid != os.getpid() and os.getpgid(p.pid) == proc.pid):
                ours.append(p)
        except (psutil.Error, ProcessLookupError, OSError):
            continue
    for p in ours:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(ours, timeout=10)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass


@pytest.fixture(scope="module")
def ray_head():
    """A Ray head with the Jobs API on 127.0.0.1 (auth off, as docs/deploy.md says for Ray 2.60)."""
    ray_bin = Path(sys.executable).parent / "ray"
    temp_dir = tempfile.mkdtemp(prefix="bsray-", dir="/tmp")  # short: Ray's socket paths must fit
    gcs, dash, client, agent, agent_grpc, env_agent, metrics, node, objm = free_ports(9)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "HF_HUB_OFFLINE": "1",
           "RAY_USAGE_STATS_ENABLED": "0", "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    cmd = [str(ray_bin), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={gcs}", "--num-cpus=2",
           "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
           f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}",
           f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={env_agent}",
           f"--metrics-export-port={metrics}", f"--node-manager-port={node}", f"--object-manager-port={objm}",
           f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    log = open(os.path.join(temp_dir, "ray-start.log"), "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"http://127.0.0.1:{dash}"
    try:
        _wait_for_jobs_api(address, proc, temp_dir)
        yield address
    finally:
        _stop_head(proc, temp_dir)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _wait_for_jobs_api(address: str, proc: subprocess.Popen, temp_dir: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited {proc.returncode}: {Path(temp_dir, 'ray-start.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{address}/api/version", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"the Jobs API at {address} did not come up: {Path(temp_dir, 'ray-start.log').read_text()[-2000:]}")


@pytest.fixture(scope="module")
def tiny_job(tmp_path_factory, tiny_model_dir):
    """A job folder: a working_dir with a tiny-model pipeline, 8 prompts in two tasks, an OUTPUT."""
    root = tmp_path_factory.mktemp("submit")
    wd = root / "wd"
    wd.mkdir()
    (wd / "pipeline.yaml").write_text(yaml.safe_dump({
        "engine": "torch", "model": str(tiny_model_dir), "dtype": "float32", "spec": "auto",
        "candidates": str(REPO / "pipelines" / "candidates" / "torch_ngram.yaml"),
        "shard_size": 4, "workers": 1, "batch_size": 2, "max_tokens": 4,
        "worker": {"num_cpus": 1, "torch_threads": 1},
        "calibration": {"window": 4, "measure_steps": 4},
    }))
    n = 8
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(n)], "task": ["code", "chat"] * (n // 2),
                             "prompt": [f"def add_{i}(a, b): return a + b  # add add add" for i in range(n)]}), root / "in.parquet")
    job = write_job(root, name="e2e", pipeline="pipeline.yaml", input=str(root / "in.parquet"),
                    output=str(root / "runs" / "{date}"), options={"shard_by": "task", "max_tokens": 4},
                    resources={"entrypoint_num_cpus": 0},
                    runtime_env={"working_dir": "wd", "env_vars": {"HF_HUB_OFFLINE": "1", "BS_MARK": "${BS_TEST_MARK}"}})
    return root, job, n


def test_submit_wait_runs_the_pipeline_on_the_cluster_and_a_rerun_resumes(ray_head, tiny_job, monkeypatch):
    root, job, n = tiny_job
    monkeypatch.setenv("BS_TEST_MARK", "from-the-submitter")
    runner = CliRunner()
    result = runner.invoke(cli, ["submit", str(job), "--address", ray_head, "--wait", "--run-date", RUN_DATE])
    assert result.exit_code == 0, result.output[-3000:]
    job_id = f"batchspec-e2e-{RUN_DATE}"
    assert job_id in result.stdout.splitlines()

    out = root / "runs" / RUN_DATE
    assert (out / "_SUCCESS").exists() and (out / "_plan.json").exists()
    outputs = pl.read_parquet(out / "outputs" / "*.parquet")
    assert sorted(outputs["id"].to_list()) == [f"r{i}" for i in range(n)]
    assert set(outputs["finish_reason"].to_list()) <= {"stop", "length"}
    assert outputs["output_tokens"].max() <= 4
    stats = pl.read_parquet(out / "stats" / "*.parquet")
    assert stats.height == 2 and stats["rows"].sum() == n and set(stats["shard_key"].to_list()) == {"code", "chat"}

    from ray.job_submission import JobSubmissionClient

    info = JobSubmissionClient(ray_head).get_job_info(job_id)
    assert info.runtime_env["env_vars"]["BS_MARK"] == "from-the-submitter"
    assert info.entrypoint.startswith("python -m batchspec run") and f"--run-date {RUN_DATE}" in info.entrypoint

    # The same night again (a CronJob retry): a new submission id, and the run resumes.
    marks = {p.name: p.stat().st_mtime_ns for p in (out / "stats").iterdir()}
    again = runner.invoke(cli, ["submit", str(job), "--address", ray_head, "--wait", "--run-date", RUN_DATE])
    assert again.exit_code == 0, again.output[-3000:]
    assert f"{job_id}-r2" in again.stdout.splitlines()
    assert {p.name: p.stat().st_mtime_ns for p in (out / "stats").iterdir()} == marks
    assert pl.read_parquet(out / "outputs" / "*.parquet").height == n

    # The same night with other options (the job file edited: another max_tokens): refused in one
    # line, and the night's outputs, stats, plan and manifest byte for byte as they were.
    night = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and "_lease" not in p.parts}
    (root / "variant").mkdir()
    variant = write_job(root / "variant", name="e2e", pipeline="pipeline.yaml", input=str(root / "in.parquet"),
                        output=str(root / "runs" / "{date}"), options={"shard_by": "task", "max_tokens": 6},
                        resources={"entrypoint_num_cpus": 0}, runtime_env={"working_dir": "../wd", "env_vars": {"HF_HUB_OFFLINE": "1"}})
    third = runner.invoke(cli, ["submit", str(variant), "--address", ray_head, "--wait", "--run-date", RUN_DATE])
    assert third.exit_code == 1, third.output[-3000:]
    last = third.output.strip().splitlines()[-1]
    assert last.startswith(f"Error: job {job_id}-r3 FAILED: OUTPUT holds 2 shard(s) made with other options (max_tokens: 4 != 6); "
                           "use another OUTPUT, or --no-resume --force"), last
    assert {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and "_lease" not in p.parts} == night

    # The report reads the cluster's output.
    report = runner.invoke(cli, ["report", str(out), "--json"])
    assert report.exit_code == 0, report.output
    import json

    doc = json.loads(report.stdout)
    assert doc["complete"] and doc["totals"]["rows"] == n and doc["totals"]["output_rows"] == n


def test_a_failing_job_exits_1_with_one_line(ray_head, tiny_job):
    root, _, _ = tiny_job
    bad = write_job(root / "wd", name="broken", input=str(root / "missing.parquet"), output=str(root / "broken" / "{date}"),
                    resources={"entrypoint_num_cpus": 0}, runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1"}})
    result = CliRunner().invoke(cli, ["submit", str(bad), "--address", ray_head, "--wait"])
    assert result.exit_code == 1
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("Error: job batchspec-broken-") and "FAILED" in last


def test_a_job_whose_python_lacks_batchspec_says_so_in_one_line(ray_head, tiny_job, tmp_path):
    """The head's PATH python is not the venv's (a head started without the venv on PATH): here the
    job's PATH leads `python` to the system interpreter, which has no batchspec."""
    root, _, _ = tiny_job
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if system_python is None:
        pytest.skip("no system python3 to stand in for a head's PATH python")
    (fake_bin / "python").symlink_to(system_python)
    bad = write_job(tmp_path, name="nopython", input=str(root / "in.parquet"), output=str(tmp_path / "o" / "{date}"),
                    resources={"entrypoint_num_cpus": 0},
                    runtime_env={"env_vars": {"PATH": f"{fake_bin}:/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}})
    result = CliRunner().invoke(cli, ["submit", str(bad), "--address", ray_head, "--wait"])
    assert result.exit_code == 1, result.output[-2000:]
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("Error: job batchspec-nopython-") and "FAILED" in last, last
    # batchspec itself (no working_dir) or, when the job's cwd holds the package, its first dependency
    assert re.search(r"the job's python lacks batchspec(\'s dependency '\w+')? \(No module named '\w+'\); "
                     r"start the head from the venv \(make ray-head", last), last


@pytest.mark.parametrize("logs,line", [
    ("Traceback (most recent call last):\n  File \"<frozen runpy>\", line 198\n"
     "ModuleNotFoundError: No module named 'fsspec'\n",
     "the job's python lacks batchspec's dependency 'fsspec' (No module named 'fsspec'); start the head from the venv"),
    ("/usr/bin/python3: No module named batchspec\n", "the job's python lacks batchspec (No module named 'batchspec')"),
    ("/bin/sh: 1: python: not found\n", "the job found no python on the head's PATH; start the head from the venv"),
    ("rows read\nError: s3://b/in: no Parquet files\n", "s3://b/in: no Parquet files"),
    ("Error: engine trtllm needs tensorrt_llm (No module named 'tensorrt_llm')\n", "engine trtllm needs tensorrt_llm"),
    ("Killed\n", None),
])
def test_the_failure_line_comes_from_the_job_logs(logs, line):
    found = submit.failure_line(logs)
    assert found == line if line is None else found.startswith(line), found


def test_make_ray_head_puts_the_venv_first_on_path():
    venv = "/opt/batchspec-venv"
    dry = subprocess.run(["make", "-n", "ray-head", f"VENV={venv}"], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert dry.returncode == 0, dry.stderr
    start = dry.stdout[dry.stdout.index("PATH="):]
    assert start.startswith(f'PATH="{venv}/bin:$PATH" RAY_AUTH_MODE=disabled {venv}/bin/ray start --head')
    assert "--node-ip-address=127.0.0.1" in start and "--dashboard-host=127.0.0.1" in start
