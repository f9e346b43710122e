"""What "the same result" means for a variant against the run it is compared with (issue 47).

A family declares it (``FamilyInfo.sameness``: a function of the two runs' ``spec.json``), and
``hopperlab.results.correctness`` reads both runs' records and says ``same``, ``within bound``,
``DIFFERENT`` or ``not compared``. A faster variant that computes something else is no finding:
the megatron-core recompute that skipped backward read twice as fast. Pure and cheap (no torch):
the report runs on the login node.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from hopperlab.core.rundir import write_json_atomic

#: the classes of a declaration
EXACT, BOUNDED, NOT_COMPARABLE = "exact", "bounded", "not comparable"

#: what a family's runs record to be compared (``results.correctness`` reads each):
#: ``losses``: steps.jsonl ``loss`` (and ``grad_norm`` where both runs have it) per step;
#: ``tokens``: ``artifacts/evidence.json`` ``tokens``, lists of greedy token ids;
#: ``topn``: ``artifacts/evidence.json`` ``topn``, each fixed query's ranked item ids;
#: ``checksum``: ``artifacts/evidence.json`` ``checksum``, a digest of the bytes moved;
#: ``answers``: the run checks its own answers against a peer (metric ``all_correct``)
MEASURES = frozenset({"losses", "tokens", "topn", "checksum", "answers"})


@dataclass(frozen=True)
class Sameness:
    """One variant's declaration against its reference run.

    ``bound`` (bounded only) is the largest deviation that still reads ``within bound``, in the
    measure's unit (losses: relative per step; tokens, topn: the share of replies or queries that
    differ); ``reason`` says why that number, or why the two runs cannot be compared."""

    kind: str
    measure: str = ""
    bound: float = 0.0
    reason: str = ""

    def __post_init__(self) -> None:
        if self.kind not in (EXACT, BOUNDED, NOT_COMPARABLE):
            raise ValueError(f"Sameness.kind: {self.kind!r} is not exact, bounded or not "
                             "comparable")
        if (self.kind != NOT_COMPARABLE or self.measure) and self.measure not in MEASURES:
            raise ValueError(f"Sameness.measure: {self.measure!r} is not one of "
                             f"{', '.join(sorted(MEASURES))}")
        if self.kind == BOUNDED and not (self.bound > 0 and self.reason):
            raise ValueError("Sameness: a bounded declaration needs a bound above 0 and its "
                             "reason")
        if self.kind == NOT_COMPARABLE and not self.reason:
            raise ValueError("Sameness: not comparable needs its reason")


def exact(measure: str, reason: str = "") -> Sameness:
    return Sameness(EXACT, measure, 0.0, reason)


def bounded(measure: str, bound: float, reason: str) -> Sameness:
    return Sameness(BOUNDED, measure, bound, reason)


def not_comparable(reason: str, measure: str = "") -> Sameness:
    """``measure`` "losses": the numbers differ, but a backward that ran in the reference and
    not in the variant (a zero gradient norm) still reads DIFFERENT."""
    return Sameness(NOT_COMPARABLE, measure=measure, reason=reason)


#: ``rule(variant_spec, reference_spec) -> Sameness``: both are the runs' ``spec.json``
Rule = Callable[[Mapping[str, Any], Mapping[str, Any]], Sameness]


def world_size(spec: Mapping[str, Any]) -> int:
    """The ranks a run spans, from its spec.json ``resources`` as the launcher counts them
    (``config.spec.Resources.world_size``: nodes x tasks per node, one task per GPU where
    ``gpus_per_node`` is given): a full-scale row names its GPUs (``gpus_per_node: 4``
    against ``1``), a smoke row its tasks."""
    res = spec.get("resources") or {}
    tasks = res.get("tasks_per_node") or res.get("gpus_per_node") or 1
    return int(res.get("nodes") or 1) * int(tasks)


def differing(variant: Mapping[str, Any], reference: Mapping[str, Any]) -> set[str]:
    """The params and knobs whose values differ between two specs (knobs by their names)."""
    out = set()
    for part in ("params", "knobs"):
        a, b = variant.get(part) or {}, reference.get(part) or {}
        out |= {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
    return out


# -- what a run records to be compared: ``artifacts/evidence.json`` ----------------------------
# One small JSON object per run, name -> value (greedy token ids, each fixed query's top-n),
# written by the workload as part of its normal work; per-step figures (finetune's losses and
# gradient norms) stay in steps.jsonl.

EVIDENCE_FILE = "evidence.json"
#: evidence of what was computed where the spec cannot say it (a model sized to the GPUs at
#: run time: ``num_layers: 0``, tensor parallel serves as many layers as they hold), e.g.
#: ``{"layers": 62}``: two runs whose ``served`` differ are not compared, whatever the class
SERVED = "served"


def add_evidence(recorder: Any, name: str, value: Any) -> None:
    """Put ``value`` (JSON: numbers, strings, lists) under ``name`` in the run's evidence file,
    keeping what earlier calls put there."""
    path = Path(recorder.artifact_path(EVIDENCE_FILE))
    data = read_evidence_file(path) or {}
    data[name] = value
    write_json_atomic(path, data)


def read_evidence_file(path: Path) -> dict[str, Any] | None:
    """The evidence object at ``path``; None where there is none or it is not an object."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
