"""JUnit XML of a check, for CI systems: one test case per run (and node), a ``failure`` per
regression and per run that reads DIFFERENT (``results.correctness``: another computation
than its baseline's, whatever its reference says), ``skipped`` for a run without a reference; inconclusive findings are written as
system-out so that a CI page shows them without failing."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping, Sequence
from xml.etree import ElementTree as ET

from hopperlab.core.rundir import FAILING_STATUSES, write_text_atomic
from hopperlab.results import correctness
from hopperlab.results.machines.references import (
    INCONCLUSIVE,
    NO_REFERENCE,
    REGRESSION,
    Judgement,
)


def write(path: Path, name: str, rows: Sequence[Any], judgements: Mapping[str, Judgement],
          node_of: Mapping[str, str] | None = None,
          slow: Mapping[str, Sequence[str]] | None = None) -> Path:
    """Write ``path``; ``node_of`` (run directory -> node) names each case's class by node;
    ``slow`` (run directory -> findings) fails a case whose node is slower than its peers."""
    suite = ET.Element("testsuite", name=name)
    failures = skipped = 0
    for row in rows:
        j = judgements.get(str(row.run_dir))
        if j is None:
            continue
        node = (node_of or {}).get(str(row.run_dir))
        case = ET.SubElement(suite, "testcase", name=row.key,
                             classname=f"hopperlab.{node or row.machine or 'unknown'}")
        bad = [f for f in j.findings if f.verdict == REGRESSION]
        slower = list((slow or {}).get(str(row.run_dir), ()))
        if row.status in FAILING_STATUSES and not bad:
            failures += 1
            ET.SubElement(case, "failure", message=f"run ended {row.status}",
                          type="failed").text = str(row.reason or "")
        elif not correctness.offered(row):
            failures += 1
            ET.SubElement(case, "failure", message=f"{correctness.DIFFERENT} against "
                          f"{row.correctness.against}", type="different").text = \
                row.correctness.detail
        elif slower and not bad:
            failures += 1
            ET.SubElement(case, "failure", message="slower than the other nodes",
                          type="slow").text = "\n".join(slower)
        elif bad:
            failures += 1
            fail = ET.SubElement(case, "failure", message=f"{len(bad)} regression(s): "
                                 + ", ".join(f.metric for f in bad), type="regression")
            fail.text = "\n".join(f.detail for f in bad)
        elif j.verdict == NO_REFERENCE:
            skipped += 1
            ET.SubElement(case, "skipped", message="no reference for this run")
        unclear = [f for f in j.findings if f.verdict == INCONCLUSIVE]
        if unclear:
            ET.SubElement(case, "system-out").text = "\n".join(
                f"inconclusive: {f.detail}" for f in unclear)
    suite.set("tests", str(len(suite)))
    suite.set("failures", str(failures))
    suite.set("skipped", str(skipped))
    suite.set("errors", "0")
    _clean(suite)
    ET.indent(suite)
    write_text_atomic(Path(path), ET.tostring(suite, encoding="unicode",
                                              xml_declaration=True) + "\n")
    return Path(path)


#: terminal colour and cursor sequences (a reason copied from a job's coloured stderr)
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]")
#: what XML 1.0 cannot hold at all (NUL, other C0 controls but tab and newlines, lone
#: surrogates, U+FFFE/U+FFFF): a CI parser refuses the whole file for one of them
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _text(value: str) -> str:
    """``value`` without ANSI sequences, other unwritable characters shown as ``\\xNN``."""
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", _ANSI.sub("", value))


def _clean(element: ET.Element) -> None:
    """Every text and attribute of the tree writable as XML 1.0."""
    for e in element.iter():
        if e.text:
            e.text = _text(e.text)
        for key, value in list(e.attrib.items()):
            e.set(key, _text(value))
