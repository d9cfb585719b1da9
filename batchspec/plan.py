"""Step 2, plan: which input rows go to which shard, decided once and saved as OUTPUT/_plan.json.

Rows are grouped by the shard-by value (groups in sorted key order, rows in input order inside a
group, null keys last) and each group is cut into shards of at most `shard_size` rows, so every
workload gets its own calibration. A shard names its rows as runs of row indices per input file,
which stays compact for millions of rows; no prompt text is held here.

The plan's fingerprint covers the input files (paths and sizes) and the options that change the
plan (shard_by, shard_size). The same input and options always give the same plan and shard ids;
a resume against an OUTPUT whose plan has another fingerprint is refused (`check_resume`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass

from batchspec.errors import OutputError
from batchspec.read import InputSource, RowKeys

PLAN_VERSION = 1


@dataclass(frozen=True)
class ShardPlan:
    """One shard: its id, its shard-by value, and its rows as (file index, [[start, stop), ...])."""

    shard_id: str
    shard_key: str | None
    rows: int
    parts: tuple[tuple[int, tuple[tuple[int, int], ...]], ...]

    def row_indices(self) -> list[tuple[int, list[int]]]:
        """Per input file, the sorted row indices of this shard."""
        return [(f, [r for start, stop in runs for r in range(start, stop)]) for f, runs in self.parts]


@dataclass(frozen=True)
class Plan:
    fingerprint: str
    input_url: str
    files: tuple[tuple[str, int, int], ...]  # (path, size, rows)
    shard_by: str | None
    shard_size: int
    rows: int
    shards: tuple[ShardPlan, ...]

    def to_json(self) -> str:
        doc = asdict(self)
        doc["version"] = PLAN_VERSION
        return json.dumps(doc, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        doc = json.loads(text)
        doc.pop("version", None)
        shards = tuple(
            ShardPlan(s["shard_id"], s["shard_key"], s["rows"], tuple((f, tuple(map(tuple, runs))) for f, runs in s["parts"]))
            for s in doc.pop("shards")
        )
        files = tuple(tuple(f) for f in doc.pop("files"))
        return cls(shards=shards, files=files, **doc)


def fingerprint(source: InputSource, shard_by: str | None, shard_size: int) -> str:
    doc = {
        "version": PLAN_VERSION,
        "files": [(f.path, f.size) for f in source.files],
        "shard_by": shard_by,
        "shard_size": shard_size,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def make_plan(source: InputSource, keys: RowKeys, shard_by: str | None, shard_size: int) -> Plan:
    assert shard_size >= 1, shard_size
    groups: dict[str | None, list[int]] = {}
    for i, key in enumerate(keys.keys):
        groups.setdefault(key, []).append(i)
    order = sorted(groups, key=lambda k: (k is None, k or ""))
    shards, n = [], 0
    for key in order:
        members = groups[key]
        for start in range(0, len(members), shard_size):
            chunk = members[start : start + shard_size]
            parts = _runs([(keys.file_index[i], keys.row_index[i]) for i in chunk])
            shards.append(ShardPlan(_shard_id(n, key), key, len(chunk), parts))
            n += 1
    return Plan(
        fingerprint=fingerprint(source, shard_by, shard_size),
        input_url=source.url,
        files=tuple((f.path, f.size, f.rows) for f in source.files),
        shard_by=shard_by,
        shard_size=shard_size,
        rows=len(keys.ids),
        shards=tuple(shards),
    )


def _shard_id(n: int, key: str | None) -> str:
    """`00003-code`: the ordinal keeps ids unique and sorted; the key slug keeps them readable."""
    slug = re.sub(r"[^A-Za-z0-9_.=-]+", "_", key)[:40].strip("_.") if key is not None else ""
    return f"{n:05d}-{slug}" if slug else f"{n:05d}"


def _runs(rows: list[tuple[int, int]]) -> tuple[tuple[int, tuple[tuple[int, int], ...]], ...]:
    """(file, row) pairs in input order -> per file, runs of consecutive rows as [start, stop)."""
    by_file: dict[int, list[list[int]]] = {}
    for f, r in rows:
        runs = by_file.setdefault(f, [])
        if runs and runs[-1][1] == r:
            runs[-1][1] = r + 1
        else:
            runs.append([r, r + 1])
    return tuple((f, tuple((a, b) for a, b in runs)) for f, runs in by_file.items())


def check_resume(existing: Plan | None, plan: Plan) -> None:
    """Refuse to resume into an OUTPUT that holds a run of another input or plan."""
    if existing is not None and existing.fingerprint != plan.fingerprint:
        raise OutputError(
            f"OUTPUT holds a run of a different input/plan (fingerprint {existing.fingerprint} != {plan.fingerprint}); "
            "use a new OUTPUT or --no-resume"
        )
