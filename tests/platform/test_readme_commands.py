"""Every command the README shows parses as written (issue 46, item 2): the README is a
newcomer's entry, and a command that has drifted from the code is the first thing they type.

Each `hopperlab ...` is parsed by hopperlab's own parser and its verb answers `--help`; each
`snakemake ...` is parsed by Snakemake's parser, and (integration) runs with `-n` in a copy of
the project; each `bash scripts/...` exists and is valid bash; the pip lines install what the
lines beside them need. A command of a kind not listed here fails the test, so that it gets a
check. The README's links are checked with the docs' (tests/platform/test_docs_pages.py).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.helpers import REPO, copy_project, snakemake

README = REPO / "README.md"
#: what the issue asks of an entry page
MAX_LINES = 120
#: placeholders the README uses for a user's own folders: stand-ins that parse
PLACEHOLDERS = {"RESULTS_A": "results-a", "RESULTS_B": "results-b", "RESULTS_DIR": "results"}


def readme_commands(text: str) -> list[str]:
    """The commands of the README's ```bash blocks (one per line, `&&` split) and of the
    command column of its tables (each backticked command in the last cell)."""
    commands: list[str] = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.M | re.S):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                commands += [c.strip() for c in line.split("&&")]
    for row in re.findall(r"^\|.*\|\s*$", text, re.M):
        last = row.strip().strip("|").split(" | ")[-1]
        commands += [c for c in re.findall(r"`([^`]+)`", last)
                     if c.split()[0] in ("hopperlab", "snakemake", "bash", "python3")]
    return commands


def expand(command: str) -> list[list[str]]:
    """The argument lists of one command: an optional ` [...]` part both left out and put in
    (a bracket inside a word, `'.[test]'`, is the word's own)."""
    optional = re.compile(r"\s+\[([^\[\]]+)\]")
    variants = {command}
    while any(optional.search(v) for v in variants):
        v = next(v for v in variants if optional.search(v))
        variants.remove(v)
        m = optional.search(v)
        variants |= {v[:m.start()] + v[m.end():], v[:m.start()] + " " + m.group(1) + v[m.end():]}
    return [[PLACEHOLDERS.get(w, w) for w in shlex.split(v)] for v in sorted(variants)]


COMMANDS = readme_commands(README.read_text())
KINDS = ("hopperlab", "snakemake", "bash", "python3 -m pip", "python3 -m pytest")


def of_kind(kind: str) -> list[str]:
    return [c for c in COMMANDS if c == kind or c.startswith(kind + " ")]


def test_the_readme_is_an_entry_page_and_every_command_has_a_check():
    assert len(README.read_text().splitlines()) <= MAX_LINES
    unchecked = [c for c in COMMANDS if not any(c == k or c.startswith(k + " ") for k in KINDS)]
    assert not unchecked, f"README commands no test checks: {unchecked}"
    # the two fresh-machine commands lead, and CI runs the second one exactly
    assert "snakemake --cores 2" in COMMANDS and "bash scripts/test.sh" in COMMANDS
    assert "exec bash scripts/test.sh" in (REPO / ".ci" / "run").read_text()


def test_readme_commands_are_found():
    # the extraction itself: a README change that hides its commands from this file fails here
    assert {"hopperlab list", "snakemake -n", "python3 -m pytest"} <= set(COMMANDS)
    assert expand("hopperlab check [RESULTS_DIR] [--strict]") == [
        ["hopperlab", "check"], ["hopperlab", "check", "--strict"],
        ["hopperlab", "check", "results"], ["hopperlab", "check", "results", "--strict"]]


@pytest.mark.parametrize("command", of_kind("hopperlab"))
def test_hopperlab_commands_parse_and_their_verb_has_help(command, capsys):
    from hopperlab.cli.main import build_parser

    for argv in expand(command):
        args = build_parser().parse_args(argv[1:])  # argparse exits 2 on a word it does not know
        assert callable(args.func), argv
        with pytest.raises(SystemExit) as exc:
            build_parser().parse_args([argv[1], "--help"])
        assert exc.value.code == 0
        assert f"hopperlab {argv[1]}" in capsys.readouterr().out


@pytest.mark.parametrize("command", of_kind("snakemake"))
def test_snakemake_commands_parse(command):
    from snakemake.cli import get_argument_parser

    for argv in expand(command):
        get_argument_parser().parse_args(argv[1:])  # exits 2 on an unknown option


@pytest.mark.parametrize("command", of_kind("bash"))
def test_bash_scripts_exist_and_parse(command):
    script = REPO / shlex.split(command)[1]
    assert script.is_file(), script
    out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_pip_lines_install_what_the_commands_beside_them_need():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    installs = [expand(c)[0][3:] for c in of_kind("python3 -m pip")]
    assert all(words[0] == "install" for words in installs), installs
    targets = [w for words in installs for w in words[1:] if not w.startswith("-")]
    for target in targets:
        m = re.fullmatch(r"\.(?:\[([\w,]+)\])?", target)
        if m:  # the project, with extras that pyproject.toml has
            assert all(e in extras for e in (m.group(1) or "").split(",") if e), target
    # `python3 -m pytest` right beside an install that brings pytest
    assert of_kind("python3 -m pytest")
    assert ".[test]" in targets and any(r.startswith("pytest") for r in extras["test"])
    # the torch the README installs is the one scripts/test.sh installs
    torch = [t for t in targets if t.startswith("torch")]
    assert torch and all(t in (REPO / "scripts" / "test.sh").read_text() for t in torch), torch


@pytest.mark.integration
def test_snakemake_commands_dry_run(tmp_path: Path):
    project = copy_project(tmp_path / "project")
    for command in of_kind("snakemake"):
        for argv in expand(command):
            out = snakemake([*argv[1:], "-n"], project, timeout=300)
            assert out.returncode == 0, (argv, out.stderr[-2000:])
            assert "This was a dry-run" in out.stdout + out.stderr, argv
