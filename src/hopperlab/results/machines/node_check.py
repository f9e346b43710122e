"""The verdict per node of ``hopperlab check --every-node``: each node's runs against the
machine's references, and each node against the other nodes of the partition (a node whose
figure is worse than the others' median beyond the noise, by the test of
``hopperlab.core.effects``, is *slow*: the 13.6 GB/s link among 55 GB/s ones needs no
reference to be found). A node that neither was judged against a reference nor compared
with another node is ``nothing checked``, never a pass. A node whose run reads DIFFERENT
(``results.correctness``: it computed something else than its baseline there) is
``different``, a failure, and that run is no peer of the others."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from hopperlab.core import effects
from hopperlab.core.rundir import FAILING_STATUSES, read_samples
from hopperlab.core.stats import percentile, robust_spread
from hopperlab.results import correctness
from hopperlab.results.machines import references
from hopperlab.results.machines.ab import measure_of
from hopperlab.results.rows import RunRow

PASS, SLOW, REGRESSION, FAILED = "pass", "slow", "regression", "failed"
DIFFERENT = "different"
NOTHING_CHECKED = "nothing checked"


@dataclass
class NodeVerdict:
    node: str
    verdict: str
    lines: list[str] = field(default_factory=list)
    #: run directory -> its judgement against the references
    judgements: dict[str, references.Judgement] = field(default_factory=dict)
    #: run directory -> what made the node slow in that run
    slow: dict[str, list[str]] = field(default_factory=dict)


def _samples(row: RunRow) -> list[dict[str, float]]:
    return read_samples(Path(row.run_dir)) if Path(row.run_dir).is_dir() else []


def against_peers(rows: Mapping[str, Sequence[RunRow]], min_effect: float,
                  compared: set[str] | None = None) -> dict[str, dict[str, list[str]]]:
    """node -> run directory -> findings where the node is worse than the others' median;
    each node that was compared with the others at all is added to ``compared``."""
    out: dict[str, dict[str, list[str]]] = {n: {} for n in rows}
    compared = set() if compared is None else compared
    by_key: dict[str, dict[str, RunRow]] = {}
    for node, node_rows in rows.items():
        for r in correctness.findings(node_rows):  # a DIFFERENT run is nobody's peer
            if r.status == "ok":
                by_key.setdefault(r.key, {})[node] = r
    for key, per_node in by_key.items():
        if len(per_node) < 2:
            continue
        any_row = next(iter(per_node.values()))
        metrics = [m for m in any_row.headline_metrics
                   if references.direction(any_row.family, m) is not None]
        measures = {n: {m: measure_of(r, m, _samples(r)) for m in metrics}
                    for n, r in per_node.items()}
        for node, row in per_node.items():
            for metric in metrics:
                mine = measures[node][metric]
                peers = [measures[n][metric] for n in per_node if n != node]
                peers = [p for p in peers if p is not None]
                if mine is None or not peers:
                    continue
                spreads = [p.spread for p in (*peers, mine) if p.spread is not None]
                if not spreads and len(peers) >= 2:
                    # measured once each: the other nodes' scatter is the noise (the suspect
                    # is left out, so that its own distance cannot widen it)
                    spreads = [robust_spread([p.median for p in peers])]
                others = effects.Measure(percentile([p.median for p in peers], 50),
                                         sum(p.n for p in peers),
                                         max(spreads) if spreads else None)
                try:
                    eff = effects.compare(mine, others,
                                          direction=references.direction(row.family, metric),
                                          min_effect=min_effect)
                except ValueError:
                    continue
                compared.add(node)
                if eff.verdict == effects.WORSE:
                    out[node].setdefault(str(row.run_dir), []).append(
                        f"{key} {metric}: worse than the other nodes' median, {eff.detail}")
    return out


def judge_nodes(rows: Mapping[str, Sequence[RunRow]], refs_dir: Path,
                min_effect: float = effects.DEFAULT_MIN_EFFECT) -> list[NodeVerdict]:
    """Every node's verdict: failed (a run did not end ok) > different (a run computed
    something else than its baseline) > regression (against the references) > slow (against
    the other nodes) > nothing checked (no reference judged a run of it and no other node was
    compared with it) > pass."""
    compared: set[str] = set()
    peers = against_peers(rows, min_effect, compared)
    out = []
    for node, node_rows in sorted(rows.items()):
        judged = references.judge_rows(node_rows, refs_dir)
        v = NodeVerdict(node, PASS, judgements=judged, slow=peers.get(node, {}))
        failed = [r for r in node_rows if r.status in FAILING_STATUSES]
        regs = references.regressions(judged)
        v.lines += [f"{r.key} ended {r.status}: {r.reason or ''}".rstrip(": ") for r in failed]
        wrong = correctness.different_lines(node_rows)
        v.lines += wrong
        v.lines += [f"REGRESSION {f.key} {f.metric}: {f.detail}" for f in regs]
        v.lines += [f"SLOW {line}" for lines in v.slow.values() for line in lines]
        if not node_rows:
            v.verdict, v.lines = FAILED, ["no run recorded"]
        elif failed:
            v.verdict = FAILED
        elif wrong:
            v.verdict = DIFFERENT
        elif regs:
            v.verdict = REGRESSION
        elif v.slow:
            v.verdict = SLOW
        elif node not in compared and not any(f.verdict != references.NO_REFERENCE
                                              for j in judged.values() for f in j.findings):
            v.verdict = NOTHING_CHECKED
            v.lines.append("no run of it had a reference and no other node ran the same run "
                           "to compare: not a pass")
        out.append(v)
    return out
