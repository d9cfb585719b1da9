"""Runs on a local Ray cluster of two nodes (tests/cluster.py: a head and a second raylet on this
machine, each with its own resources and a custom resource label, started once per session).

- `batchspec submit JOB --wait` to the cluster's Jobs API: the job's shards spread over both nodes
  (each shard's stats row names the node that ran it) and every row is written exactly once.
- A run from this process whose second node is killed while it goes on: every input row still ends
  up exactly once in the output. `remove_node` kills the node's processes without warning, as a
  lost machine would; it runs last here, and a later user of the cluster that needs two nodes
  asks for a fresh second one (`ensure_two_nodes`).
"""

from __future__ import annotations

import threading
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from batchspec.cli import cli
from batchspec.pipeline import run
from tests.cluster import auth_disabled
from tests.data import prompts_table
from tests.test_pipeline import make_config, read_outputs

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def two_nodes(two_node_cluster):
    """The module's two-node cluster with this process's driver connected to it (and the local Ray
    it had, if any, given back afterwards)."""
    import ray

    was_up = ray.is_initialized() or two_node_cluster.left_local
    two_node_cluster.left_local = False
    ray.shutdown()
    two_node_cluster.ensure_two_nodes()
    with auth_disabled():
        ray.init(address=two_node_cluster.address, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        try:
            yield two_node_cluster
        finally:
            ray.shutdown()
        if was_up:  # give the rest of the session back the local Ray it had
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
            ray.data.DataContext.get_current().enable_progress_bars = False


def test_submit_spreads_shards_over_both_nodes_and_writes_every_row_once(two_nodes, tiny_model_dir, tmp_path):
    """A job file in the style of jobs/local.yaml, submitted with the CLI and waited for."""
    n = 12
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump({
        "engine": "torch", "model": str(tiny_model_dir), "dtype": "float32", "spec": "none",
        # One CPU per node and per worker: one worker on each node; no shard is handed out before
        # both have loaded their model, so each node starts with a shard of its own.
        "shard_size": 1, "workers": 2, "batch_size": 1, "max_tokens": 32,
        "worker": {"num_cpus": 1, "torch_threads": 1, "wait_for_workers_s": 300},
    }))
    pq.write_table(prompts_table(n), tmp_path / "in.parquet")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "kind": "batchspec-job", "name": "two-nodes", "pipeline": str(tmp_path / "pipeline.yaml"),
        "input": str(tmp_path / "in.parquet"), "output": str(tmp_path / "runs" / "{date}"),
        "options": {"shard_by": "task"}, "resources": {"entrypoint_num_cpus": 0},
        # The job runs this checkout's batchspec, whatever the venv has installed. No working_dir:
        # both nodes share this machine's runtime_env cache, and the second node deleting the
        # package when its last actor exits would delete the driver's cwd (seen: "[Errno 2]").
        "runtime_env": {"env_vars": {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}},
    }))
    result = CliRunner().invoke(cli, ["submit", str(job), "--address", two_nodes.jobs_address, "--wait", "--run-date", "2026-01-03"])
    assert result.exit_code == 0, result.output[-3000:]

    out = tmp_path / "runs" / "2026-01-03"
    assert (out / "_SUCCESS").exists()
    outputs = read_outputs(out)
    assert sorted(outputs["id"].to_list()) == [f"row-{i:04d}" for i in range(n)], "every row exactly once"
    assert outputs.filter(pl.col("finish_reason") == "error").height == 0
    stats = pl.read_parquet(f"{out}/stats/*.parquet")
    assert stats.height == n and stats["rows"].sum() == n
    assert set(stats["node_id"].to_list()) == two_nodes.node_ids(), "shards ran on both nodes"


class KillSecondNode:
    """Progress hook: once a shard committed on the second node, kill that node (from another
    thread, so the kill lands while the run goes on)."""

    def __init__(self, cluster, node):
        self.cluster, self.node, self.nodes, self.killer = cluster, node, [], None

    def planned(self, shards, rows, skipped):
        pass

    def shard_done(self, outcome):
        self.nodes.append(outcome.node_id)
        if outcome.node_id == self.node.node_id and self.killer is None:
            self.killer = threading.Thread(target=self.cluster.remove_node, args=(self.node, False))
            self.killer.start()


def wait_dead(node_id: str, timeout_s: float = 180) -> bool:
    import time

    import ray

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(n["Alive"] for n in ray.nodes() if n["NodeID"] == node_id):
            return True
        time.sleep(1)
    return False


@pytest.mark.timeout(900)
def test_shards_spread_over_two_nodes_and_a_killed_node_loses_no_row(two_nodes, tiny_model_dir, tmp_path):
    import ray

    cluster, second = two_nodes.cluster, two_nodes.second
    assert {n["NodeID"] for n in ray.nodes() if n["Alive"]} >= {cluster.head_node.node_id, second.node_id}
    pq.write_table(prompts_table(16), tmp_path / "p.parquet")
    out = tmp_path / "out"
    config = make_config(tmp_path / "p.parquet", out, tiny_model_dir, spec="none", shard_size=2, workers=2, num_cpus=0.5, max_tokens=4,
                         wait_for_workers_s=300)  # both workers ready before any shard: the second node gets one
    hook = KillSecondNode(cluster, second)
    try:
        summary = run(config, progress=hook)
    except Exception:  # the job may fail with its node: then a resume must finish it
        summary = run(config)
    if hook.killer is not None:
        hook.killer.join()
    assert second.node_id in hook.nodes and cluster.head_node.node_id in hook.nodes, "shards ran on both nodes"
    assert wait_dead(second.node_id), "the second node was killed"
    assert summary.complete
    df = read_outputs(out)
    assert sorted(df["id"].to_list()) == [f"row-{i:04d}" for i in range(16)]
    assert df.filter(pl.col("finish_reason") == "error").height == 0
    assert pl.read_parquet(f"{out}/stats/*.parquet")["rows"].sum() == 16
