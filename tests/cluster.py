"""One local Ray cluster of two nodes for the whole test session: a head (1 CPU, resource
`head_node`, the Jobs API on 127.0.0.1) and a second raylet (1 CPU, resource `second_node`), each
a real set of Ray processes on this machine, started by Ray's own `ray.cluster_utils.Cluster`.

The multinode tests connect their driver to it and send it a job through its Jobs API
(tests/test_multinode.py). Starting it once costs about 12-16 s, stopping it about 2 s. A test that
kills the second node leaves the cluster with one; `ensure_two_nodes()` adds a fresh second node
for whoever needs two. Both nodes share one temp dir, and so one runtime_env cache: a job with a
working_dir failed here with "[Errno 2]" in its final cleanup, which the second node dropping the
shared package (the driver's cwd) after its last actor exited would explain, and which separate
temp dirs made go away; so jobs sent here carry no working_dir.

Isolation from other Ray sessions on the machine: its own temp dir, free ports for the GCS, the
dashboard (Jobs API), the dashboard agent (its default 52365 may be taken: the Jobs API then says
"No available agent") and metrics; the address file a bare `ray.init()` would join is put back.
Ray 2.60 enables token auth by default, and its `ray.init` writes RAY_AUTH_MODE=token into this
process's environment and caches it: the cluster is started, and a driver joins it, under
`auth_disabled()` (without it, once any local Ray ran in the session, the Jobs API answers 401).
Its processes, and so the jobs' `python`, get this interpreter's folder first on PATH
(docs/deploy.md: a job runs the head's PATH python).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
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


@contextmanager
def auth_disabled():
    """RAY_AUTH_MODE=disabled for what starts or joins the cluster; the previous value after. Ray
    caches the mode (and token) in-process at its first init: reset that cache too, as Ray's own
    tests do, or nodes started here run in token mode (the Jobs API answered 401)."""
    from ray._private.authentication_test_utils import reset_auth_token_state

    before = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    reset_auth_token_state()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = before
        reset_auth_token_state()


@dataclass
class TwoNodes:
    cluster: object  # ray.cluster_utils.Cluster
    second: object  # its second node (ray._private.node.Node)
    jobs_address: str  # http://127.0.0.1:PORT, the Jobs API
    left_local: bool = False  # this process drove a local Ray before the cluster started

    @property
    def address(self) -> str:
        return self.cluster.address

    def node_ids(self) -> set[str]:
        return {self.cluster.head_node.node_id, self.second.node_id}

    def ensure_two_nodes(self) -> None:
        """A fresh second node if a test removed it (same resources, same label)."""
        if self.second in self.cluster.worker_nodes:
            return
        with auth_disabled():
            self.second = self.cluster.add_node(**_second_node_args())
            self.cluster.wait_for_nodes()


def _second_node_args() -> dict:
    return {"num_cpus": 1, "resources": {"second_node": 1}, "metrics_export_port": free_ports(1)[0]}


_TEMP_DIRS: list[str] = []


def _temp_dir() -> str:
    _TEMP_DIRS.append(tempfile.mkdtemp(prefix="bs2n-", dir="/tmp"))  # short: Ray's socket paths must fit
    return _TEMP_DIRS[-1]


@pytest.fixture(scope="module")  # torn down after the module: its four Ray processes stay up no longer
def two_node_cluster():
    import ray
    from ray.cluster_utils import Cluster

    # Nodes started while this process drives another Ray came up broken here (their actors were
    # cancelled before running): leave it first, as Ray's own tests do; a driver joining the cluster
    # rejoins a local Ray afterwards (TwoNodes.left_local).
    left_local = ray.is_initialized()
    ray.shutdown()
    address_file = Path(ray._private.utils.get_ray_address_file(None))
    before = address_file.read_text() if address_file.exists() else None
    temp_dir = _temp_dir()
    gcs, dashboard, agent, metrics = free_ports(4)
    path = os.environ.get("PATH", "")
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{path}"
    try:
        with auth_disabled():
            cluster = Cluster(initialize_head=True, head_node_args={
                "num_cpus": 1, "resources": {"head_node": 1}, "temp_dir": temp_dir, "gcs_server_port": gcs,
                "include_dashboard": True, "dashboard_host": "127.0.0.1", "dashboard_port": dashboard,
                "dashboard_agent_listen_port": agent, "metrics_export_port": metrics,
            })
            second = cluster.add_node(**_second_node_args())
        # Where `ray start --temp-dir` writes the address (ray/scripts/scripts.py, write_ray_address(
        # gcs_address, temp_dir)) and where a job's supervisor looks it up (job_supervisor.py,
        # canonicalize_bootstrap_address_or_die("auto", the node's temp_dir)). Cluster writes it to
        # the default /tmp/ray only, so without this the supervisor fell back to grepping for a
        # GCS process and sent the job's driver to another Ray on the machine (seen under
        # pytest-xdist: the job hung dialing the other test process's local Ray).
        ray._private.utils.write_ray_address(cluster.head_node.gcs_address, temp_dir)
    finally:
        os.environ["PATH"] = path
        if before is None:  # Cluster wrote its address where a bare ray.init() of any process would join it
            address_file.unlink(missing_ok=True)
        else:
            address_file.write_text(before)
    try:
        cluster.wait_for_nodes()
        nodes = TwoNodes(cluster, second, f"http://127.0.0.1:{dashboard}", left_local)
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
    logs = Path(temp_dir, "session_latest", "logs")
    tail = "".join(p.read_text()[-1500:] for p in (logs / "dashboard.err", logs / "dashboard.log") if p.exists())
    raise RuntimeError(f"the Jobs API at {address} did not come up; its log ends:\n{tail}")
