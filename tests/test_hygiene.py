"""Product code says what and why, never when: no dates, machine names, commit hashes, bench
paths or references to files outside the repository in `batchspec/`. The evidence behind a
constant lives in docs/ beside the constant's name (docs/CONTRIBUTING.md, "Style")."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "batchspec"

# A hex word of 7-12 characters holding a letter and a digit, standing alone as a commit is
# written: not part of a longer hex string (a sha256), a file or cache name (`name-b179c9523d0e`)
# or an identifier.
_ALONE_BEFORE = r"(?<![0-9A-Za-z_\-./])"
_ALONE_AFTER = r"(?![0-9A-Za-z_\-/])"
COMMIT = re.compile(_ALONE_BEFORE + r"(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}" + _ALONE_AFTER)

RULES: dict[str, re.Pattern[str]] = {
    "a date": re.compile(r"\b(19|20)\d\d-[01]\d-[0-3]\d\b"),
    # CPU model strings; GPU product names (H100, H200) are data names and allowed.
    "a machine name": re.compile(
        r"\b(xeon|epyc|ryzen|threadripper|opteron|graviton|core i[3579]|model[- ]\d{2,3}|family[- ]\d{2})\b",
        re.IGNORECASE,
    ),
    "a commit hash": COMMIT,
    "a bench path": re.compile(r"\bbench/"),
    "a reference to a file outside the repository": re.compile(r"\b(DESIGN|ENVIRONMENT|STYLE)\.md"),
}

SUFFIXES = {".py", ".yaml", ".yml", ".md", ".txt", ".json", ".toml", ".cfg"}


def offences(text: str, name: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in RULES.items():
            for match in pattern.finditer(line):
                found.append(f"{name}:{number}: {what}: {match.group(0)!r} in {line.strip()[:100]!r}")
    return found


def package_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*") if p.is_file() and p.suffix in SUFFIXES)


def test_product_code_says_what_and_why_not_when() -> None:
    found = []
    for path in package_files():
        found += offences(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))
    assert not found, "move these to docs/ (see docs/CONTRIBUTING.md):\n" + "\n".join(found)


def test_the_package_is_scanned() -> None:
    names = {p.relative_to(PACKAGE).as_posix() for p in package_files()}
    assert {"stats.py", "engine/torch/kv.py", "data/pipelines/local.yaml"} <= names


@pytest.mark.parametrize(
    "line, what",
    [
        ("    0.61 ms; bfloat16 with its conversion to float, as until 2026-12-05, 5.4 ms", "a date"),
        ("float32 sgemm on this 2-core AMD EPYC (torch 2.13)", "a machine name"),
        ("shard at batch 8 (128 held-out rows, Xeon 167)", "a machine name"),
        ("the model-167 machine", "a machine name"),
        ("interleaved, 1.13x plain at f6a3dae; see README", "a commit hash"),
        ("(since commit 544c111)", "a commit hash"),
        ("most of a step the rule had been 20-30% of it (bench/fast_model.py).", "a bench path"),
        ('"""One row of OUTPUT/stats: DESIGN.md\'s stats columns first."""', "a reference to a file outside the repository"),
        ("dtype: float32  # exact greedy equality (ENVIRONMENT.md)", "a reference to a file outside the repository"),
    ],
)
def test_each_rule_catches_its_offence(line: str, what: str) -> None:
    assert [o for o in offences(line, "x.py") if f": {what}: " in o], line


@pytest.mark.parametrize(
    "line",
    [
        # sha256 checksums, cache folder names, identifiers and GPU product names are not offences.
        '    sha256="3b2b6c62f5b7a3e5d8e0f4e7c9f9b0f4a2d6e1c3b5a7f9e1d3c5b7a9f1e3d5c7",',
        "    PosixPath('/root/.cache/batchspec/models/smollm2-135m-b179c9523d0e')",
        "REGIMES = ('cpu', 'h200-torch', 'gpu-roofline')  # an H100 or H200",
        "    x = deadbeef + 1234567  # hex words without a digit, or digits alone",
        "float32 and bfloat16 on AVX2 and AVX-512",
        "batchspec run --run-date \"$(date -u +%F)\"",
    ],
)
def test_legitimate_text_passes(line: str) -> None:
    assert offences(line, "x.py") == []


# docs/ states the design as it is; its history lives in git. A figure's commit and date stand in
# one place only: the table of docs/performance.md that `make bench-report` writes from
# bench/results.jsonl (and the other tables written from it).
DOCS = PACKAGE.parent / "docs"
DOC_RULES = ("a date", "a commit hash")
FULL_COMMIT = re.compile(r"\b[0-9a-f]{40}\b")  # upstream is cited by commit in the code and SOURCES.md, not in docs/
GENERATED = [("<!-- bench-report:begin -->", "<!-- bench-report:end -->")]


def doc_offences(text: str, name: str) -> list[str]:
    for begin, end in GENERATED:
        if begin in text and end in text:
            text = text[: text.index(begin)] + text[text.index(end):]
    found = [o for o in offences(text, name) if any(f": {what}: " in o for what in DOC_RULES)]
    return found + [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: a full commit hash: {m.group()}"
                    for m in FULL_COMMIT.finditer(text)]


def test_docs_carry_no_date_or_commit_outside_the_generated_tables() -> None:
    found = []
    for path in sorted(DOCS.rglob("*.md")):
        found += doc_offences(path.read_text(encoding="utf-8"), f"docs/{path.relative_to(DOCS).as_posix()}")
    assert not found, "history lives in git; figures' commits in docs/performance.md's table:\n" + "\n".join(found)


def test_the_docs_rule_catches_a_date_and_a_commit_but_not_the_generated_table() -> None:
    text = ("Measured at 3bf54a7 on 2026-12-06.\n<!-- bench-report:begin -->\n| x | 3bf54a7 | 2026-12-06 |\n"
            "<!-- bench-report:end -->\n")
    assert len(doc_offences(text, "x.md")) == 2 and not doc_offences(text.split("\n", 1)[1], "x.md")
    assert doc_offences("read at " + "0052bed36509c7a5a2d8e48265334e40cf2f5a0e" + ".\n", "x.md")


def test_no_help_text_or_bench_names_an_issue_number() -> None:
    issue = re.compile(r"\bissues? \d+", re.IGNORECASE)
    files = [p for d in ("batchspec", "bench", "jobs", "examples") for p in (ROOT / d).rglob("*.py")] + [ROOT / "Makefile"]
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()[:80]}" for p in files
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if issue.search(line)]
    assert not found, "say what and why, not which issue:\n" + "\n".join(found)


# A fresh clone must set up on any machine: nothing tracked may point outside the checkout or name
# a path of one machine, and nothing the ignore rules exclude may be tracked (a `.venv` symlink
# to another worktree's venv once went in this way, and `python3 -m venv .venv` then failed).
ROOT = PACKAGE.parent


def _git(*args: str) -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.split("\0" if "-z" in args else "\n") if line]


def link_offences(entries: list[tuple[str, str]]) -> list[str]:
    """(path, link target) pairs of tracked symlinks -> what is wrong with each."""
    found = []
    for path, target in entries:
        if Path(target).is_absolute():
            found.append(f"{path} -> {target}: an absolute path of one machine")
            continue
        resolved = (ROOT / path).parent.joinpath(target).resolve()
        if ROOT.resolve() not in resolved.parents and resolved != ROOT.resolve():
            found.append(f"{path} -> {target}: leaves the repository")
        elif not resolved.exists():
            found.append(f"{path} -> {target}: points at nothing")
    return found


def test_no_tracked_symlink_leaves_the_repository() -> None:
    entries = []
    for line in _git("ls-files", "-s", "-z"):
        mode, _, _, path = line.split(None, 3)
        if mode == "120000":
            entries.append((path, os.readlink(ROOT / path)))
    assert not link_offences(entries), "\n".join(link_offences(entries))


def test_no_ignored_path_is_tracked() -> None:
    tracked_but_ignored = _git("ls-files", "--cached", "--ignored", "--exclude-standard")
    assert not tracked_but_ignored, f"tracked although .gitignore excludes them: {tracked_but_ignored}"


def test_the_venv_is_ignored_in_every_form() -> None:
    # A directory, a symlink (a file to git) and a venv of a nested checkout.
    ignored = _git("check-ignore", "--no-index", ".venv", ".venv/bin/python", "sub/.venv")
    assert set(ignored) == {".venv", ".venv/bin/python", "sub/.venv"}


@pytest.mark.parametrize(
    "entry, what",
    [
        ((".venv", "/work/wt/calib-55/.venv"), "an absolute path"),
        (("cache", "../../elsewhere"), "leaves the repository"),
        (("pipelines", "batchspec/data/nowhere"), "points at nothing"),
    ],
)
def test_each_link_rule_catches_its_offence(entry: tuple[str, str], what: str) -> None:
    assert what in " ".join(link_offences([entry]))


def test_a_link_inside_the_repository_passes() -> None:
    assert link_offences([("pipelines", "batchspec/data/pipelines")]) == []


def test_no_make_variable_is_assigned_twice() -> None:
    """make expands a recipe's variables when it runs, with the file's last assignment: a second
    `NAME = ...` further down silently changes every recipe above it that reads NAME."""
    assigned = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*(?:\?|:|::)?=")
    names = [m.group(1) for line in (ROOT / "Makefile").read_text(encoding="utf-8").splitlines() if (m := assigned.match(line))]
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, f"assigned more than once in the Makefile: {twice}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but hyphens and underscores dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_every_link_between_the_docs_reaches_a_file_and_a_heading() -> None:
    """A page renamed or a heading reworded leaves links that go nowhere; nothing else notices."""
    link = re.compile(r"\]\(([^)\s]+)\)")
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    broken = []
    for page in pages:
        for target in link.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md":
                headings = {_slug(h) for h in re.findall(r"^#+ (.+)$", dest.read_text(encoding="utf-8"), re.MULTILINE)}
                if anchor not in headings:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "links that go nowhere:\n" + "\n".join(broken)


def test_calibration_page_stays_a_design_of_at_most_300_lines() -> None:
    """docs/calibration.md is the concepts, the rule, its constants and the grids' summary; the
    simulator's detail is docs/simulator.md's, the history git's."""
    lines = (DOCS / "calibration.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 300, f"docs/calibration.md has {lines} lines (at most 300)"


def test_readme_stays_for_users_at_most_250_lines() -> None:
    """The README is for users: what to run and what comes back; engineering detail is docs/'s."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 250, f"README.md has {lines} lines (at most 250): move engineering detail to docs/"
