"""The docs' column tables are the schema the code writes: `make docs` (docs/generate.py) writes them
from batchspec/stats.py, and these tests fail when a table is stale, names a column the code does
not write, leaves one out, or a field has no meaning to show."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# docs/generate.py is a script (`make docs`), loaded by path.
_spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(docs)

from batchspec.stats import arrow_fields  # noqa: E402

_ROW = re.compile(r"^\| `(\w+)` \|")


def documented(text: str, name: str) -> list[list[str]]:
    """The column names of every table marked `name` in `text`, one list per table."""
    begin, end = docs.markers(name)
    tables = re.findall(re.escape(begin) + r"(.*?)" + re.escape(end), text, re.DOTALL)
    return [[m.group(1) for line in t.splitlines() if (m := _ROW.match(line))] for t in tables]


@pytest.mark.parametrize("name", list(docs.TABLES))
def test_every_column_written_has_a_meaning(name):
    blank = [column for column, _, meaning in docs.rows(docs.TABLES[name]) if not meaning]
    assert not blank, f"give these fields a comment on their line in the record: {blank}"


@pytest.mark.parametrize("path", docs.FILES, ids=lambda p: p.name)
def test_the_docs_tables_are_what_make_docs_writes(path):
    text = path.read_text(encoding="utf-8")
    assert docs.rewrite(text) == text, f"{path.relative_to(ROOT)} is stale: run `make docs`"


@pytest.mark.parametrize("name", list(docs.TABLES))
def test_each_documented_table_names_exactly_the_columns_written(name):
    written = [f.name for f in arrow_fields(docs.TABLES[name])]
    tables = [t for path in docs.FILES for t in documented(path.read_text(encoding="utf-8"), name)]
    assert tables, f"no file carries the {name} table"
    for columns in tables:
        assert columns == written


def test_a_stale_or_short_table_is_caught():
    fresh = docs.rewrite("x\n<!-- schema:events -->\n<!-- /schema:events -->\n")
    short = "\n".join(line for line in fresh.splitlines() if "`reason`" not in line)
    assert docs.rewrite(short) != short
    assert documented(short, "events") == [["row", "kind", "arm", "predicted", "measured"]]
    with pytest.raises(SystemExit, match="do not pair up"):
        docs.rewrite("<!-- schema:events -->\n")


def test_a_meaning_is_the_comment_on_the_fields_line_and_under_it():
    meanings = docs.field_docs(docs.ShardStats)
    assert meanings["shard_key"] == "its --shard-by value"
    assert meanings["speedup"].endswith("null where the table cannot price plain decoding")  # two lines
    assert docs.field_docs(docs.ArmResult)["label"].startswith("The arm's name")  # a derived column's docstring
