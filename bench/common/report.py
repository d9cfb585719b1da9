"""`make bench-report`: every table written from bench/results.jsonl, between its markers:
docs/performance.md's (results.table: the current figure of each bench), the README's "Where it
stands", docs/calibration.md's simulated grid and summary of the held-out protocol, and
docs/simulator.md's held-out table (stands.py: the figures a reader weighs first)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

if __package__ in (None, ""):  # run as a script: bench/common is first on the path, bench/ is not
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import stands  # noqa: E402
from common.results import DOC, README, RESULTS, ROOT, read, rewrite, table  # noqa: E402


def update_doc(doc: Path | str = DOC, results: Path | str = RESULTS, readme: Path | str | None = None,
               grid: Path | str | None = None, heldout: Path | str | None = None) -> str:
    """Rewrite the table between the markers of `doc` (and of `readme`: STANDS; of `grid`: the
    simulated grid and the held-out summary; of `heldout`: the held-out table) from `results`;
    return the first."""
    lines = read(results)
    made = table(lines)
    doc = Path(doc)
    doc.write_text(rewrite(doc.read_text(encoding="utf-8"), made, str(doc)), encoding="utf-8")
    if readme is not None:
        readme = Path(readme)
        readme.write_text(rewrite(readme.read_text(encoding="utf-8"), stands.stands_table(lines), str(readme)), encoding="utf-8")
    if grid is not None:
        grid = Path(grid)
        text = rewrite(grid.read_text(encoding="utf-8"), stands.grid_table(lines), str(grid), stands.GRID_BEGIN, stands.GRID_END)
        text = rewrite(text, stands.heldout_summary(lines), str(grid), stands.HELDOUT_BEGIN, stands.HELDOUT_END)
        grid.write_text(text, encoding="utf-8")
    if heldout is not None:
        heldout = Path(heldout)
        heldout.write_text(rewrite(heldout.read_text(encoding="utf-8"), stands.heldout_table(lines), str(heldout),
                                   stands.HELDOUT_BEGIN, stands.HELDOUT_END), encoding="utf-8")
    return made


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Regenerate docs/performance.md's, the README's, docs/calibration.md's and "
                                     "docs/simulator.md's tables from bench/results.jsonl.")
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--doc", default=str(DOC))
    parser.add_argument("--readme", default=str(README), help="whose 'Where it stands' table to rewrite ('' for none)")
    parser.add_argument("--grid", default=str(ROOT / "docs" / "calibration.md"),
                        help="whose simulated grid and held-out summary to rewrite ('' for none)")
    parser.add_argument("--heldout", default=str(ROOT / "docs" / "simulator.md"), help="whose held-out table to rewrite ('' for none)")
    args = parser.parse_args(argv)
    made = update_doc(args.doc, args.results, args.readme or None, args.grid or None, args.heldout or None)
    print(f"{args.doc}: {made.count(chr(10)) - 1} figures from {args.results}"
          + "".join(f"; {f}" for f in (args.readme, args.grid, args.heldout) if f))


if __name__ == "__main__":
    main()
