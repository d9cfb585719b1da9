"""Fixtures for the pipeline tests: one local Ray for the session, a real S3 endpoint on loopback
(moto's server), and small Parquet prompt sets written through fsspec."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

S3_KEY, S3_SECRET = "testing", "testing"


@pytest.fixture(scope="session")
def ray_session():
    import ray

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ.setdefault("AWS_ACCESS_KEY_ID", S3_KEY)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", S3_SECRET)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint, request):
    """A fresh bucket; returns (bucket url, fsspec storage options, polars storage options)."""
    import s3fs

    options = {"key": S3_KEY, "secret": S3_SECRET, "client_kwargs": {"endpoint_url": s3_endpoint}}
    fs = s3fs.S3FileSystem(**options)
    bucket = "bkt-" + request.node.name.lower().replace("_", "-")[:40].strip("-")
    fs.mkdir(bucket)
    polars_options = {
        "aws_access_key_id": S3_KEY,
        "aws_secret_access_key": S3_SECRET,
        "aws_region": "us-east-1",
        "aws_endpoint_url": s3_endpoint,
        "aws_allow_http": "true",
    }
    return f"s3://{bucket}", options, polars_options


def prompts_table(n: int, tasks=("code", "prose"), with_id: bool = True) -> pa.Table:
    cols = {
        "prompt": [f"Write item {i} about {tasks[i % len(tasks)]}: the quick brown fox {i}" for i in range(n)],
        "task": [tasks[i % len(tasks)] for i in range(n)],
        "source": [f"src-{i}" for i in range(n)],
    }
    if with_id:
        cols = {"id": [f"row-{i:04d}" for i in range(n)], **cols}
    return pa.table(cols)


def write_parquet(fs, path: str, table: pa.Table, row_group_size: int | None = None) -> None:
    with fs.open(path, "wb") as f:
        pq.write_table(table, f, row_group_size=row_group_size)
