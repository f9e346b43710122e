"""A checksum of what a copy run's copies moved (issue 47): compared between copy variants.

Every copy variant moves the same pattern at the same sizes, whatever its direction or host
memory, so the probed ends of every destination (the bytes the run checks anyway) hash to the
same digest. Per size the distinct probes are hashed, so that a bidirectional run's two
destinations read as one unidirectional one's when both hold what was sent, and differ when
either does not.
"""

from __future__ import annotations

import hashlib

#: bytes probed at each end of a destination (as ``HostBackend.all_equal`` checks them)
PROBE_BYTES = 4096


class MovedBytes:
    def __init__(self) -> None:
        self._sizes: dict[int, set[str]] = {}

    def add(self, size_mb: int, first: bytes, last: bytes) -> None:
        """One destination of ``size_mb`` MiB: its first and last ``PROBE_BYTES`` bytes."""
        digest = hashlib.sha256(first + last).hexdigest()
        self._sizes.setdefault(size_mb, set()).add(digest)

    def checksum(self) -> str:
        h = hashlib.sha256()
        for size_mb in sorted(self._sizes):
            h.update(f"{size_mb}:{','.join(sorted(self._sizes[size_mb]))};".encode())
        return h.hexdigest()[:16]
