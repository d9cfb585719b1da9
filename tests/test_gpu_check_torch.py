"""jobs/gpu_check.py --engine torch: prepared for a GPU node; here it must at least run end to end
on CPU with the tiny shape (and refuse to write CPU figures into bench/results)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "jobs" / "gpu_check.py"), "--engine", "torch", *args],
                          capture_output=True, text=True, timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


def test_torch_check_runs_end_to_end_on_cpu_with_the_tiny_shape(tmp_path):
    out = tmp_path / "profile.json"
    done = run("--shape", "tiny", "--device", "cpu", "--out", str(out), "--reps", "1", "--max-tokens", "8", "--context", "32")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    tiny = report["shapes"]["tiny"]
    checks = tiny["check"]
    assert all(checks[k]["equal"] for k in ("draft_target:k=4:self", "draft_target:k=4:noisy", "ngram:k=4"))
    assert checks["draft_target:k=4:self"]["acceptance_rate"] == 1.0
    assert 0.0 < checks["draft_target:k=4:noisy"]["acceptance_rate"] < 1.0  # rejections inside drafts: the KV cut back
    assert checks["ngram:k=4"]["draft_tokens"] > 0  # the lookup proposed: equality was exercised
    assert sorted(tiny["profile"]["ms_by_batch"], key=int) == ["1", "2", "4", "8", "16", "32", "64"]
    assert all(len(row) == 9 for row in tiny["profile"]["ms_by_batch"].values())
    assert (tmp_path / "profile.md").read_text().startswith("# torch engine on")


def test_cpu_figures_never_land_in_bench_results():
    done = run("--shape", "tiny", "--device", "cpu")
    assert done.returncode == 2 and "not GPU figures" in done.stderr
    done = run("--shape", "tiny", "--device", "cpu", "--out", str(ROOT / "bench" / "results" / "x.json"))
    assert done.returncode == 2 and not (ROOT / "bench" / "results" / "x.json").exists()


def test_a_check_whose_drafter_proposed_nothing_fails(tmp_path):
    """One token per row: no decode step, no draft; equal outputs then prove nothing, and the check says so."""
    done = run("--shape", "tiny", "--device", "cpu", "--out", str(tmp_path / "p.json"), "--reps", "1", "--max-tokens", "1",
               "--context", "32")
    assert done.returncode == 1 and "proposed no draft token" in done.stdout
