"""The simulator is a client of the product, never a mode of it: no module of batchspec/ outside
batchspec/sim/ imports the simulator or names a cost regime, and the engine contract has no
simulator field (docs/architecture.md, "Layers")."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import batchspec
from batchspec.engine.base import Engine
from batchspec.sim.regimes import REGIMES

PACKAGE = Path(batchspec.__file__).resolve().parent
SIM = PACKAGE / "sim"
# A regime by its concept or by a name only a regime has ("cpu" and "trtllm" are engines' words too).
NAMES_A_REGIME = re.compile(r"regime|" + "|".join(re.escape(n) for n in REGIMES if "-" in n), re.IGNORECASE)


def product_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if SIM not in p.parents)


def offences(source: str, name: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        modules = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        found += [f"{name}:{node.lineno}: imports {m}" for m in modules if m == "batchspec.sim" or m.startswith("batchspec.sim.")]
    for number, line in enumerate(source.splitlines(), 1):
        if "batchspec.sim" in line or NAMES_A_REGIME.search(line):
            found.append(f"{name}:{number}: {line.strip()[:100]}")
    return found


def test_no_product_module_imports_the_simulator_or_names_a_regime():
    found = [o for path in product_modules() for o in offences(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))]
    assert not found, "the product must not know the simulator:\n" + "\n".join(found)


def test_the_scan_reads_the_product_and_catches_each_offence():
    names = {p.relative_to(PACKAGE).as_posix() for p in product_modules()}
    assert {"shard.py", "engine/torch/decode.py", "calibrate/controller.py"} <= names and not any(n.startswith("sim/") for n in names)
    assert offences("from batchspec.sim.clock import RegimeClock\n", "x.py")
    assert offences("from batchspec import sim\n", "x.py")
    assert offences("import batchspec.sim.replay as replay\n", "x.py")
    assert offences("engine.regime = None\n", "x.py")
    assert offences('name = "gpu-roofline"\n', "x.py")
    assert not offences("from batchspec.engine.torch.clock import WallClock  # the real clock\n", "x.py")


def test_the_engine_contract_lists_no_simulator_field():
    members = set(Engine.__annotations__) | {n for n in vars(Engine) if not n.startswith("_")}
    assert not {m for m in members if NAMES_A_REGIME.search(m) or "sim" in m}, members
