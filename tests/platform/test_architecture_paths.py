"""ARCHITECTURE.md stays true where it names a place (issue 55): every path it names (a module,
a folder, a test file, a room of the package or of tests/) exists, read from where the page
names it (the repository, the package, a family, configs/, tests/)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: where a path the page names may start: the repository, the package and its rooms, the
#: family whose engines it names, the folders whose contents it lists (configs/, tests/)
BASES = ("", "src", "src/hopperlab", "src/hopperlab/workloads",
         "src/hopperlab/workloads/finetune", "configs", "tests")
#: what runs write (git-ignored, so not in a checkout)
WRITTEN = {"results/report.html"}
#: a path: segments joined by "/", ending in "/" (a folder) or in a file name with a suffix;
#: not a placeholder (<name>, {family}) nor a glob
PATH = re.compile(r"(?<![\w/.<{*-])((?:[\w.-]+/)+(?:[\w-]+\.[a-z]+)?)(?![\w<{*/-])")


def named_paths(text: str) -> set[str]:
    return {p for p in PATH.findall(text) if not p.startswith(("http", "nvcr.io"))}


def missing(text: str, root: Path = ROOT) -> list[str]:
    return sorted(p for p in named_paths(text) - WRITTEN
                  if not any((root / base / p).exists() for base in BASES))


def test_every_path_architecture_md_names_exists():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    assert len(named_paths(text)) > 40  # the page names its rooms and modules
    assert missing(text) == []


def test_every_room_of_the_package_is_on_the_page():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    rooms = {p.name for p in (ROOT / "src/hopperlab").iterdir() if (p / "__init__.py").is_file()}
    assert {r for r in rooms if f"\n{r}/ " not in text} == set()


def test_a_wrong_path_is_found():
    page = ("memory/     pinned, `workloads/finetune/techniques.py`, node/pyxis.py, "
            "`tests/workloads/<name>/test_*.py`, H100/H200")
    assert missing(page) == ["node/pyxis.py", "workloads/finetune/techniques.py"]
