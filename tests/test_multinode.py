"""A run on a local Ray cluster of two nodes: a head and a second raylet on this machine, each with
its own resources and a custom resource label. Shards spread over both; the second node is killed
while the run goes on, and every input row still ends up exactly once in the output.

Ray's own `ray.cluster_utils.Cluster` starts the raylets (real processes, real object stores);
`remove_node` kills the second one's processes without warning, as a lost machine would."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from batchspec.pipeline import run
from tests.data import prompts_table
from tests.test_pipeline import make_config, read_outputs


@pytest.fixture
def two_nodes():
    import ray
    from ray.cluster_utils import Cluster

    was_up = ray.is_initialized()
    ray.shutdown()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Cluster writes its address to /tmp/ray/ray_current_cluster, which a bare ray.init() of any
    # other process on this machine would then join: put back what was there.
    address_file = Path(ray._private.utils.get_ray_address_file(None))
    before = address_file.read_text() if address_file.exists() else None
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"head_node": 1}, "include_dashboard": False})
    if before is None:
        address_file.unlink(missing_ok=True)
    else:
        address_file.write_text(before)
    second = cluster.add_node(num_cpus=1, resources={"second_node": 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield cluster, second
    finally:
        ray.shutdown()
        cluster.shutdown()
        if was_up:  # give the rest of the session back the local Ray it had
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
            ray.data.DataContext.get_current().enable_progress_bars = False


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

    cluster, second = two_nodes
    assert {n["NodeID"] for n in ray.nodes() if n["Alive"]} == {cluster.head_node.node_id, second.node_id}
    pq.write_table(prompts_table(16), tmp_path / "p.parquet")
    out = tmp_path / "out"
    config = make_config(tmp_path / "p.parquet", out, tiny_model_dir, spec="none", shard_size=2, workers=2, num_cpus=0.5, max_tokens=4)
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
