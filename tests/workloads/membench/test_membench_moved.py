"""The checksum of what a copy run moved (issue 47): the same for every direction when every
destination holds what was sent, another one when a destination does not."""

from __future__ import annotations

import json

import pytest

from hopperlab.workloads.membench.copies import DST_BYTE, SRC_BYTE
from hopperlab.workloads.membench.moved import PROBE_BYTES, MovedBytes
from tests.workloads.membench.test_membench import run_variant, spec


def _checksum(run_dir) -> str:
    return json.loads((run_dir / "artifacts" / "evidence.json").read_text())["checksum"]


@pytest.mark.parametrize("use_torch", [True, False], ids=["torch", "numpy"])
def test_every_direction_moves_the_same_bytes(tmp_path, use_torch):
    if use_torch:
        pytest.importorskip("torch")
    sums = set()
    for direction in ("h2d", "d2h", "bidir"):
        record, run_dir = run_variant(tmp_path / direction, spec(
            test="copy", direction=direction, host_memory="pageable"), use_torch=use_torch)
        assert record["status"] == "ok", record["reason"]
        sums.add(_checksum(run_dir))
    assert len(sums) == 1


def test_a_destination_that_missed_its_bytes_changes_the_checksum():
    sent, stale = bytes([SRC_BYTE]) * PROBE_BYTES, bytes([DST_BYTE]) * PROBE_BYTES
    one = MovedBytes()
    one.add(8, sent, sent)
    both = MovedBytes()
    both.add(8, sent, sent)
    both.add(8, sent, sent)      # bidir: two destinations that hold what was sent
    assert both.checksum() == one.checksum()
    wrong = MovedBytes()
    wrong.add(8, sent, sent)
    wrong.add(8, sent, stale)    # bidir: the second one's tail was never written
    assert wrong.checksum() != one.checksum()
    other = MovedBytes()
    other.add(4, sent, sent)     # another size
    assert other.checksum() != one.checksum()
