"""One writer per OUTPUT (batchspec.lease): a conditional create per generation, locally and on a
real S3 endpoint on loopback (moto honours If-None-Match), heartbeats, take-over of a dead or
silent holder, and a run refused while another holds its OUTPUT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from batchspec.cli import cli
from batchspec.errors import OutputError
from batchspec.write import Output
from tests.data import prompts_table

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(params=["local", "s3"])
def output(request, tmp_path):
    if request.param == "local":
        return Output(str(tmp_path / "out"))
    url, options, _ = request.getfixturevalue("s3")
    return Output(f"{url}/out", tuple(options.items()))


def test_a_second_taker_is_refused_while_the_first_holds_and_takes_it_once_released(output):
    from batchspec import lease as leases

    first = leases.take(output)
    with pytest.raises(OutputError, match=r"^OUTPUT .* is in use by another run \(host .*, pid \d+, started .*, last heartbeat 0 s "
                                          r"ago\); wait for it to finish, or use another OUTPUT \(a run that stops heartbeating is "
                                          r"taken over after 120 s\)$"):
        leases.take(output)
    first.check()
    leases.release(first)
    second = leases.take(output)
    assert second.generation == first.generation + 1
    assert output.names(leases.FOLDER) == [f"{second.generation:08d}.json"], "the taker removes the generations below its own"


def test_of_two_runs_taking_one_generation_at_once_exactly_one_gets_it(output):
    """The conditional create is what decides: both see generation 0 free and race for 1."""
    from batchspec import lease as leases

    lease = leases.Lease(output, 1, "x")
    results = []
    barrier = threading.Barrier(8)

    def create(i):
        barrier.wait()
        results.append(output.create(lease.path(), f"taker {i}".encode()))

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]


def test_a_silent_holder_is_taken_over_after_the_ttl_and_then_stops_before_writing(output):
    """A holder on another host whose heartbeat stopped (a paused or partitioned driver)."""
    from batchspec import lease as leases

    stale = leases.take(output, now=1000.0)
    doc = json.loads(output.read_text(f"{leases.FOLDER}/{stale.generation:08d}.json"))
    output.put(stale.path(), json.dumps({**doc, "host": "another-host"}).encode())
    with pytest.raises(OutputError, match="in use by another run"):
        leases.take(output, now=1000.0 + leases.TTL_S - 1)
    taker = leases.take(output, now=1000.0 + leases.TTL_S + 1)
    assert taker.generation == stale.generation + 1
    with pytest.raises(OutputError, match=r"^OUTPUT .* was taken over by another run .*; this run stops without writing$"):
        stale.check()
    assert not leases.renew(stale), "a taken-over holder stops heartbeating"
    taker.check()
    assert leases.renew(taker)


def test_a_holder_killed_on_this_host_is_taken_over_at_once(tmp_path):
    from batchspec import lease as leases

    out = Output(str(tmp_path / "out"))
    code = f"from batchspec import lease; from batchspec.write import Output; lease.take(Output({str(out.url)!r})); print('held', flush=True); import time; time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    with pytest.raises(OutputError, match="in use by another run"):
        leases.take(out)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert leases.take(out).generation == 2


def test_the_heartbeat_keeps_a_long_run_s_lease_alive(tmp_path):
    from batchspec import lease as leases

    out = Output(str(tmp_path / "out"))
    with leases.Held(out, ttl_s=0.4) as lease:
        started = time.time()
        time.sleep(1.5)  # several TTLs: only the heartbeat keeps it
        holder = json.loads(out.read_text(f"{leases.FOLDER}/{lease.generation:08d}.json"))
        # renewed while the run went on, long after the lease was taken (no bound on how promptly:
        # a loaded machine may delay the thread, and this test does not time it)
        assert holder["heartbeat"] > started + 0.5
        # a second run within the TTL of that heartbeat is refused, whatever the machine's load
        with pytest.raises(OutputError, match="in use by another run"):
            leases.take(out, ttl_s=0.4, now=holder["heartbeat"] + 0.1)
    assert json.loads(out.read_text(f"{leases.FOLDER}/{lease.generation:08d}.json"))["released"]


# ---- the run ----------------------------------------------------------------------------------


def test_a_run_on_an_output_another_run_holds_is_refused_in_one_line(tmp_path):
    from batchspec import lease as leases

    pq.write_table(prompts_table(4), tmp_path / "p.parquet")
    out = tmp_path / "out"
    with leases.Held(Output(str(out))):
        result = CliRunner().invoke(cli, ["run", str(tmp_path / "p.parquet"), str(out), "--plan-only"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: OUTPUT {out} is in use by another run (host "), lines
    assert not (out / "_plan.json").exists() and not (out / "_shards").exists()


@pytest.mark.parametrize(("input_of", "output_of"), [
    (lambda d: d, lambda d: d / "out"),  # OUTPUT inside the INPUT folder
    (lambda d: d / "**" / "*.parquet", lambda d: d / "runs" / "one"),  # a recursive glob reaches it
    (lambda d: d / "out" / "outputs", lambda d: d / "out"),  # INPUT inside OUTPUT (--no-resume deletes it)
    (lambda d: d, lambda d: d),
])
def test_input_and_output_may_not_overlap(tmp_path, input_of, output_of):
    data = tmp_path / "data"
    (data / "out" / "outputs").mkdir(parents=True)
    pq.write_table(prompts_table(4), data / "p.parquet")
    pq.write_table(prompts_table(4), data / "out" / "outputs" / "q.parquet")
    result = CliRunner().invoke(cli, ["run", str(input_of(data)), str(output_of(data)), "--plan-only"])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and " overlap: a run would read its own files as input" in lines[0], lines
    assert not (output_of(data) / "_plan.json").exists()


@pytest.mark.parametrize(("input_of", "output_of"), [
    (lambda d: d / "p.parquet", lambda d: d / "out"),  # a file's folder is not its input
    (lambda d: d / "*.parquet", lambda d: d / "out"),  # a flat glob never reaches out/outputs/
    (lambda d: d, lambda d: d.parent / "data-out"),  # a sibling whose name starts like INPUT's
])
def test_an_output_beside_the_input_or_outside_a_flat_glob_is_fine(tmp_path, input_of, output_of):
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(prompts_table(4), data / "p.parquet")
    result = CliRunner().invoke(cli, ["run", str(input_of(data)), str(output_of(data)), "--plan-only"])
    assert result.exit_code == 0, result.output


def test_a_driver_killed_mid_run_is_resumed_at_once_by_the_next_run(ray_session, tmp_path, tiny_model_dir):
    """SIGKILL leaves the lease unreleased; on the same host the next run sees its process gone."""
    pq.write_table(prompts_table(8), tmp_path / "p.parquet")
    out = tmp_path / "out"
    args = [str(tmp_path / "p.parquet"), str(out), "--model", str(tiny_model_dir), "--spec", "none", "--shard-size", "2",
            "--max-tokens", "3", "--batch-size", "2"]
    driver = subprocess.Popen([sys.executable, "-m", "batchspec", "run", *args], cwd=REPO,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not (out / "_plan.json").exists() and time.monotonic() < deadline and driver.poll() is None:
        time.sleep(0.2)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert (out / "_lease").exists() and not json.loads(next((out / "_lease").iterdir()).read_text())["released"]
    result = CliRunner().invoke(cli, ["run", *args])
    assert result.exit_code == 0, result.output
    assert "8 rows (0 errors), 4 shards" in result.output


def test_a_store_without_a_conditional_create_still_refuses_an_existing_lease(tmp_path, monkeypatch):
    """A backend whose pipe_file takes no mode: a look first, then a write (not atomic: said so)."""
    from fsspec.implementations.memory import MemoryFileSystem

    original = MemoryFileSystem.pipe_file

    def pipe_file(self, path, value, **kwargs):
        if kwargs:
            raise TypeError(f"pipe_file() got an unexpected keyword argument {next(iter(kwargs))!r}")
        return original(self, path, value)

    monkeypatch.setattr(MemoryFileSystem, "pipe_file", pipe_file)
    out = Output(f"memory://{tmp_path.name}/out")
    assert out.create(out.path("x"), b"1") and not out.create(out.path("x"), b"2")
    assert out.read_text("x") == "1"
