"""An installed wheel runs anywhere: build the wheel, unpack it into a folder away from the
checkout, and run `python -m batchspec run` with the defaults (the packaged pipeline and
candidates, found through importlib.resources) from a folder that is not the repository, then
`batchspec validate` the packaged files. Offline: the packaged model comes from the prepared cache."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[1]


def test_no_module_finds_files_through_its_own_path():
    """Package data comes from importlib.resources (batchspec/data), never Path(__file__)/.."""
    offenders = [str(p.relative_to(REPO)) for p in (REPO / "batchspec").rglob("*.py") if re.search(r"__file__", p.read_text())]
    assert offenders == []


@pytest.fixture(scope="module")
def unpacked_wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the tracked files (so the checkout gets no build/ folder),
    unpacked as pip would install it."""
    base = tmp_path_factory.mktemp("wheel")
    src, dist, site = base / "src", base / "dist", base / "site"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = REPO / name
        if source.is_symlink() or not source.is_file():
            continue  # pipelines/ and trt_configs/ are links into batchspec/data
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(source.read_bytes())
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q", "-w", str(dist)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = dist.glob("batchspec-*.whl")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    return site


def _python(site: Path, cwd: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "RAY_ADDRESS": ""}
    env.pop("BATCHSPEC_PIPELINE", None)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_wheel_carries_the_package_data(unpacked_wheel, tmp_path):
    data = unpacked_wheel / "batchspec" / "data"
    shipped = sorted(str(p.relative_to(data)) for p in data.rglob("*.yaml"))
    in_repo = sorted(str(p.relative_to(REPO / "batchspec" / "data")) for p in (REPO / "batchspec" / "data").rglob("*.yaml"))
    assert shipped == in_repo and "pipelines/local.yaml" in shipped
    where = _python(unpacked_wheel, tmp_path, "-c", "import batchspec; print(batchspec.__file__)")
    assert where.stdout.strip() == str(unpacked_wheel / "batchspec" / "__init__.py"), where.stderr
    result = _python(unpacked_wheel, tmp_path, "-m", "batchspec", "validate", *(str(data / p) for p in shipped))
    assert result.returncode == 0, result.stderr
    assert len([line for line in result.stdout.splitlines() if line.startswith("OK ")]) == len(shipped)


@pytest.mark.slow
def test_the_unpacked_wheel_runs_the_default_pipeline_outside_the_checkout(unpacked_wheel, tmp_path):
    table = pq.read_table(REPO / "examples" / "prompts.parquet").slice(0, 4)
    pq.write_table(table, tmp_path / "in.parquet")
    result = _python(unpacked_wheel, tmp_path, "-m", "batchspec", "run", "in.parquet", "out", "--max-tokens", "2", "--batch-size", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    out = pl.read_parquet(str(tmp_path / "out" / "outputs" / "*.parquet"))
    assert sorted(out["id"]) == sorted(table.column("id").to_pylist())
    assert out["error"].null_count() == 4 and (out["output_tokens"] > 0).all()
    assert (tmp_path / "out" / "_SUCCESS").exists()
