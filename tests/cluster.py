"""One local Ray cluster of two nodes for the whole test session: a head (1 CPU, resource
`head_node`, the Jobs API on 127.0.0.1) and a second raylet (1 CPU, resource `second_node`), each
a real set of Ray processes on this machine, started by Ray's own `ray.cluster_utils.Cluster`.

The multinode tests connect their driver to it (tests/test_multinode.py); the submit tests send it
jobs through the Jobs API (tests/test_submit.py). Starting it once costs about 12 s, stopping it
about 2 s. A test that kills the second node leaves the cluster with one; `ensure_two_nodes()`
adds a fresh second node for whoever needs two.

Each node has its own --temp-dir, as separate machines would: nodes sharing one would share the
runtime_env cache too, and the second node deleting a job's working_dir when its last actor there
exits would delete the driver's cwd on the head (seen: "[Errno 2]" from os.getcwd() in the job).

Isolation from other Ray sessions on the machine: those temp dirs, free ports for the GCS, the
dashboard (Jobs API), the dashboard agent (its default 52365 may be taken: the Jobs API then says
"No available agent") and metrics; the address file a bare `ray.init()` would join is put back.
Ray 2.60 enables token auth by default: the head runs with RAY_AUTH_MODE=disabled. Its processes,
and so the jobs' `python`, get this interpreter's folder first on PATH (ENVIRONMENT.md: a job runs
the head's PATH python).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@dataclass
class TwoNodes:
    cluster: object  # ray.cluster_utils.Cluster
    second: object  # its second node (ray._private.node.Node)
    jobs_address: str  # http://127.0.0.1:PORT, the Jobs API

    @property
    def address(self) -> str:
        return self.cluster.address

    def node_ids(self) -> set[str]:
        return {self.cluster.head_node.node_id, self.second.node_id}

    def ensure_two_nodes(self) -> None:
        """A fresh second node if a test removed it (same resources, same label)."""
        if self.second in self.cluster.worker_nodes:
            return
        self.second = self.cluster.add_node(**_second_node_args())
        self.cluster.wait_for_nodes()


def _second_node_args() -> dict:
    return {"num_cpus": 1, "resources": {"second_node": 1}, "metrics_export_port": free_ports(1)[0], "temp_dir": _temp_dir()}


_TEMP_DIRS: list[str] = []


def _temp_dir() -> str:
    _TEMP_DIRS.append(tempfile.mkdtemp(prefix="bs2n-", dir="/tmp"))  # short: Ray's socket paths must fit
    return _TEMP_DIRS[-1]


@pytest.fixture(scope="session")
def two_node_cluster():
    import ray
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    address_file = Path(ray._private.utils.get_ray_address_file(None))
    before = address_file.read_text() if address_file.exists() else None
    temp_dir = _temp_dir()
    gcs, dashboard, agent, metrics = free_ports(4)
    path = os.environ.get("PATH", "")
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{path}"
    try:
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "resources": {"head_node": 1}, "temp_dir": temp_dir, "gcs_server_port": gcs,
            "include_dashboard": True, "dashboard_host": "127.0.0.1", "dashboard_port": dashboard,
            "dashboard_agent_listen_port": agent, "metrics_export_port": metrics,
        })
        second = cluster.add_node(**_second_node_args())
    finally:
        os.environ["PATH"] = path
        if before is None:  # Cluster wrote its address where a bare ray.init() of any process would join it
            address_file.unlink(missing_ok=True)
        else:
            address_file.write_text(before)
    try:
        cluster.wait_for_nodes()
        nodes = TwoNodes(cluster, second, f"http://127.0.0.1:{dashboard}")
        _wait_for_jobs_api(nodes.jobs_address, temp_dir)
        yield nodes
    finally:
        cluster.shutdown()
        for d in _TEMP_DIRS:
            shutil.rmtree(d, ignore_errors=True)


def _wait_for_jobs_api(address: str, temp_dir: str) -> None:
    """Until the dashboard answers (a submit then waits for the head's job agent itself)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{address}/api/version", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the Jobs API at {address} did not come up (logs under {temp_dir})")
