"""The docs say what holds now, with their history linked (issue 46, item 3): a person looking
for what a machine does today reads the current table first, not round-by-round logs. Each
docs/benchmarks page is short enough to read, opens with a table that has a date and a verdict,
and links every history file of its own; no link in the README or docs/ points nowhere."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers import REPO

BENCHMARKS = REPO / "docs" / "benchmarks"
HISTORY = BENCHMARKS / "history"
#: the issue's "at most ~250 lines" for a benchmarks page
MAX_LINES = 250
#: the current table comes before this many lines of a page (title, verdict sentence, table)
TABLE_WITHIN = 80


def pages() -> list[Path]:
    return sorted(BENCHMARKS.glob("*.md"))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(files: list[Path]) -> list[str]:
    """`file: target` for each relative Markdown link whose file, or `#anchor` heading, is
    missing."""
    broken = []
    for file in files:
        for target in re.findall(r"\]\(([^)\s]+)\)", file.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (file.parent / path) if path else file
            if not dest.exists():
                broken.append(f"{file.relative_to(REPO)}: {target}")
            elif anchor and dest.is_file():
                headings = re.findall(r"^#+ (.+)$", dest.read_text(), re.M)
                if anchor not in {slug(h) for h in headings}:
                    broken.append(f"{file.relative_to(REPO)}: {target}")
    return broken


def test_every_benchmarks_page_is_short_and_opens_with_its_current_table():
    assert pages()
    for page in pages():
        lines = page.read_text().splitlines()
        assert len(lines) <= MAX_LINES, f"{page.name}: {len(lines)} lines"
        headers = [l.lower() for l in lines[:TABLE_WITHIN] if l.startswith("|")]
        assert any("date" in h and "verdict" in h for h in headers), \
            f"{page.name} does not open with a table of date and verdict"


def test_every_history_file_is_linked_from_its_page():
    files = sorted(HISTORY.glob("*.md"))
    assert files
    for file in files:
        page = BENCHMARKS / (re.match(r"(.+)-\d{4}-\d{2}\.md$", file.name).group(1) + ".md")
        assert page.is_file(), f"{file.name} names no page"
        assert f"(history/{file.name})" in page.read_text(), f"{page.name} does not link {file.name}"
        assert f"(../{page.name})" in file.read_text(), f"{file.name} does not link {page.name}"


def test_no_link_of_the_readme_or_docs_points_nowhere():
    files = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    assert broken_links(files) == []


def test_the_link_check_sees_a_broken_link(tmp_path, monkeypatch):
    # the check itself: a missing file and a missing heading are both caught
    monkeypatch.setattr("tests.platform.test_docs_pages.REPO", tmp_path)
    (tmp_path / "a.md").write_text("# Top\n\n[x](b.md) [y](#top) [z](#nowhere) [w](https://e.org)\n")
    assert broken_links([tmp_path / "a.md"]) == ["a.md: b.md", "a.md: #nowhere"]
