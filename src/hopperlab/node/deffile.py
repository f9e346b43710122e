"""The sections of an Apptainer/Singularity definition file, read verbatim.

The ``.def`` files are the one list of what goes into an image (``%files``, ``%post``,
``%environment``, ``%test``): the cluster builds them with apptainer from an NGC base, and the
Charliecloud build here runs the same sections on a Debian base (``node.charliecloud``). spython
rewrites sections as it parses them (it drops ``export``, re-indents ``%post``, turns ``%test``
into a file name), so the text is taken as written here instead.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from hopperlab.core.errors import NodeError

_SECTION = re.compile(r"^%([A-Za-z]+)\b[^\n]*$", re.MULTILINE)
_HEADER = re.compile(r"^([A-Za-z]+):\s*(.*?)\s*$")
_EXPORT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


class DefFileError(NodeError):
    """A definition file this module cannot read (a section it needs is malformed)."""


@dataclass(frozen=True)
class DefFile:
    """What a definition file says, section by section (text as written, minus the header)."""

    path: Path
    header: dict[str, str]
    sections: dict[str, str]

    @property
    def files(self) -> list[tuple[str, str]]:
        """``%files`` as (source, destination) pairs; a lone source goes to the same path."""
        pairs = []
        for line in self.sections.get("files", "").splitlines():
            words = shlex.split(line, comments=True)
            if not words:
                continue
            if len(words) > 2:
                raise DefFileError(f"{self.path}: %files: {line.strip()!r}: expected "
                                   f"'SOURCE [DESTINATION]'")
            pairs.append((words[0], words[-1]))
        return pairs

    @property
    def environment(self) -> dict[str, str]:
        """``%environment`` as variables: only ``[export] NAME=VALUE`` lines (unquoted once)."""
        env = {}
        for line in self.sections.get("environment", "").splitlines():
            if not line.strip() or line.strip().startswith("#"):
                continue
            match = _EXPORT.match(line)
            if not match:
                raise DefFileError(f"{self.path}: %environment: {line.strip()!r}: only "
                                   f"'export NAME=VALUE' lines can be carried to other runtimes")
            words = shlex.split(match.group(2))
            env[match.group(1)] = words[0] if words else ""
        return env

    def script(self, section: str) -> str:
        """A section as a shell script (empty when the file has none)."""
        return self.sections.get(section, "")


def read_def(path: Path | str) -> DefFile:
    """Parse ``path``: the ``Key: value`` header, then each ``%section``'s text."""
    path = Path(path)
    text = path.read_text()
    marks = list(_SECTION.finditer(text))
    header: dict[str, str] = {}
    for line in text[:marks[0].start() if marks else len(text)].splitlines():
        match = _HEADER.match(line)
        if match:
            header[match.group(1)] = match.group(2)
    sections: dict[str, str] = {}
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        sections[mark.group(1).lower()] = text[mark.end():end].strip("\n") + "\n"
    return DefFile(path=path, header=header, sections=sections)


def install_script(defn: DefFile, source: str) -> str:
    """The ``%files`` copies (from ``source``, where the project is mounted) and the ``%post``
    as one shell script: how a runtime without a definition-file builder (enroot on the
    cluster) takes the same contents from the same ``.def``."""
    lines = ["#!/bin/sh", f"# {defn.path.name}: %files from {source}, then %post as written",
             "set -e"]
    made: set[str] = set()
    for src, dst in defn.files:
        origin = src if src.startswith("/") else f"{source.rstrip('/')}/{src}"
        parent = str(Path(dst).parent)
        if parent not in made:
            made.add(parent)
            lines.append(f"mkdir -p {shlex.quote(parent)}")
        lines.append(f"cp -a {shlex.quote(origin)} {shlex.quote(dst)}")
    lines.append(f"# %post of {defn.path.name}")
    return "\n".join(lines) + "\n" + defn.script("post")
