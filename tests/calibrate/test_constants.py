"""Every number the controller and its records use is a named constant, and docs/calibration.md's
"Constants" table gives each its value and reason: a reader changing one finds why it is what it is."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "calibration.md"
MODULES = ["batchspec/calibrate/controller.py", "batchspec/calibrate/evidence.py", "batchspec/calibrate/ledger.py",
           "batchspec/calibrate/worker.py", "batchspec/calibrate/estimate.py", "batchspec/predict/costs.py"]
ALSO = {"batchspec/engine/trtllm/adapter.py": {"BUILD_S_UNTIMED"}}  # the controller's forecast of a build


def constants(path: str, only: set[str] | None = None) -> dict[str, float]:
    """A module's numeric constants: module-level UPPER_CASE names bound to a number."""
    found = {}
    for node in ast.parse((ROOT / path).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and type(node.value.value) in (int, float):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id.isupper() and (only is None or target.id in only):
                    found[target.id] = node.value.value
    return found


def table() -> dict[str, str]:
    """The Constants section's rows, by each name its first cell gives."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Constants"):]
    section = section[: section.index("\n## ", 1)]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            for name in line.split("|")[1].replace("`", "").split(","):
                rows[name.strip()] = line
    return rows


def written(value: float, row: str) -> bool:
    cells = row.split("|")[2]
    return f"{value:g}" in cells or f"{value * 100:g}%" in cells


def test_every_constant_of_the_controller_and_its_records_has_its_value_and_reason_in_the_docs():
    rows = table()
    every = {name: (path, v) for path in MODULES for name, v in constants(path).items()}
    every.update({name: (path, v) for path, names in ALSO.items() for name, v in constants(path, names).items()})
    assert {"CHECK_EVERY", "RECENT_STEPS", "BUILD_S_UNTIMED", "WINDOW_STEPS"} <= set(every)  # the scan reads them
    missing = [f"{name} ({path})" for name, (path, _) in every.items() if name not in rows]
    assert not missing, f"name these in docs/calibration.md, \"Constants\", with their reason: {missing}"
    wrong = [f"{name} = {v}" for name, (_, v) in every.items() if not written(v, rows[name])]
    assert not wrong, f"docs/calibration.md, \"Constants\", gives another value for: {wrong}"
    assert all(path.split("/", 1)[1] in rows[name] for name, (path, _) in every.items())  # and where it lives
