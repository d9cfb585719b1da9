"""`make docs`: the column tables of the README and docs/schema.md, written from the schema the code
writes (batchspec/stats.py), so they cannot drift from it.

Each record is a dataclass in batchspec/stats.py (StepCost in engine/base.py); its Parquet columns
are `stats.arrow_fields(record)`, in order. A column's meaning is the comment on its field's line
(and the comment lines right under it); a derived column's (ArmResult.label) its property's
docstring. Each table goes between a pair of markers:

    <!-- schema:NAME -->
    ...the table, rewritten...
    <!-- /schema:NAME -->

tests/test_docs.py fails when a file differs from what this writes, when a field has no comment,
or when a documented table names a column the code does not write (or leaves one out).
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
import textwrap
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402

from batchspec.engine.base import StepCost  # noqa: E402
from batchspec.stats import ArmResult, Event, OutputRow, ShardStats, arrow_fields  # noqa: E402

# table name -> its record; each name's table appears in the files of FILES that carry its markers
TABLES = {"outputs": OutputRow, "stats": ShardStats, "candidates": ArmResult, "events": Event, "cost_profile": StepCost}
FILES = (ROOT / "README.md", ROOT / "docs" / "schema.md")
_FIELD = re.compile(r"^    (\w+): [^#]*?(?:#\s?(.*))?$")
_MORE = re.compile(r"^    #\s?(.*)$")


def field_docs(record: type) -> dict[str, str]:
    """Each field's comment (its line's, then the comment lines right under it), and each derived
    column's property docstring."""
    docs: dict[str, str] = {}
    current = None
    for line in textwrap.dedent(inspect.getsource(record)).splitlines():
        more = _MORE.match(line)
        if more and current:
            docs[current] = f"{docs[current]} {more.group(1).strip()}".strip()
            continue
        field = _FIELD.match(line)
        current = field.group(1) if field else None
        if field:
            docs[current] = (field.group(2) or "").strip()
    for name in getattr(record, "DERIVED", ()):
        docs[name] = " ".join((inspect.getdoc(getattr(record, name)) or "").split())
    return docs


def type_name(t: pa.DataType) -> str:
    if pa.types.is_list(t):
        inner = t.value_type
        return "list<struct>" if pa.types.is_struct(inner) else f"list<{type_name(inner)}>"
    return {"double": "float64", "bool": "bool"}.get(str(t), str(t))


def rows(record: type) -> list[tuple[str, str, str]]:
    """(column, type, meaning) of every column `record` writes, in order."""
    docs = field_docs(record)
    return [(f.name, type_name(f.type), docs.get(f.name, "")) for f in arrow_fields(record)]


def table(record: type) -> str:
    lines = ["| column | type | meaning |", "|---|---|---|"]
    lines += [f"| `{name}` | {kind} | {meaning.replace('|', chr(92) + '|')} |" for name, kind, meaning in rows(record)]
    return "\n".join(lines)


def markers(name: str) -> tuple[str, str]:
    return f"<!-- schema:{name} -->", f"<!-- /schema:{name} -->"


def rewrite(text: str, where: str = "text") -> str:
    """`text` with every marked table rewritten; a marker without its pair is refused."""
    for name, record in TABLES.items():
        begin, end = markers(name)
        if text.count(begin) != text.count(end):
            raise SystemExit(f"{where}: {begin} and {end} do not pair up")
        pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
        text = pattern.sub(lambda _: f"{begin}\n{table(record)}\n{end}", text)
    return text


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Rewrite the column tables of the README and docs/schema.md "
                                     "from batchspec/stats.py.")
    parser.parse_args(argv)
    for path in FILES:
        old = path.read_text(encoding="utf-8")
        new = rewrite(old, str(path.relative_to(ROOT)))
        if new != old:
            path.write_text(new, encoding="utf-8")
        print(f"{path.relative_to(ROOT)}: {'rewritten' if new != old else 'up to date'}")


if __name__ == "__main__":
    main()
