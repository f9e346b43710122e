"""The repository's own documents hold together (issue 28, item 18): ARCHITECTURE.md is in the
repository and names every package layer the import-linter contract keeps; the README links the
docs it relies on and names every variable `.ci/run` sets."""

from __future__ import annotations

import re
import tomllib

from tests.helpers import REPO

#: the layers whose every module the page names (the others, which grow every week: by what
#: they hold)
NAMED_MODULE_BY_MODULE = ("core", "cuda", "node", "config")


def test_architecture_is_in_the_repository_and_matches_the_layers():
    text = (REPO / "ARCHITECTURE.md").read_text()
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in contracts["contracts"] if c["name"].startswith("Layers"))["layers"]
    for layer in layers:
        for name in re.split(r"\s*\|\s*", layer):
            package = name.removeprefix("hopperlab.")
            assert re.search(rf"^{package}/\s", text, re.M), f"ARCHITECTURE.md lacks {package}/"
            if package not in NAMED_MODULE_BY_MODULE:
                continue
            # every module of the layer is named in its line(s) of the page
            modules = sorted(p.stem for p in (REPO / "src/hopperlab" / package).glob("*.py")
                             if p.stem not in ("__init__", "__main__"))
            block = text[text.index(f"\n{package}/"):]
            block = block[:re.search(r"\n[a-z]+/\s", block[1:]).start() + 1] \
                if re.search(r"\n[a-z]+/\s", block[1:]) else block[:600]
            words = block.replace("_", " ").lower()
            missing = [m for m in modules if m.replace("_", " ") not in words]
            assert not missing, f"ARCHITECTURE.md's {package}/ does not name {missing}"
    assert "../shared" not in text  # nothing outside the repository


def test_readme_links_the_docs_and_names_every_ci_variable():
    readme = (REPO / "README.md").read_text()
    for doc in ("ARCHITECTURE.md", "docs/node.md", "docs/tracking.md"):
        assert f"]({doc})" in readme, doc
        assert (REPO / doc).is_file()
    ci = (REPO / ".ci" / "run").read_text()
    names = set(re.findall(r"\b(HOPPERLAB_[A-Z_]+)=", ci))
    assert names and all(n in readme for n in names), names - {n for n in names if n in readme}
