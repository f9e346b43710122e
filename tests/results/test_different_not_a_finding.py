"""A run that reads DIFFERENT (issue 47's skipped backward, twice as fast and lighter) is drawn
marked ``DIFFERENT: not a finding`` and left out of every ranking and pick, on every page:
the report's bars and its speed-against-memory front, the crossovers, the energy table, the
machines page (ratios, chart, verdicts, csv), ``compare A B``'s page and the predictions."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from hopperlab.cli.main import main
from hopperlab.core import energy_names as N
from hopperlab.results import correctness
from hopperlab.results.machines import tradeoffs
from hopperlab.results.report import crossovers, energy
from hopperlab.results.report.html import render_html
from hopperlab.results.rows import read_runs

from tests.results.different_runs import (BASELINE, EXPERIMENT, GRADS, HONEST, SPEEDS, WRONG,
                                          write_finetune, write_folder)

#: the words every page puts on such a run (``correctness.NOT_A_FINDING``)
NOT_A_FINDING = "DIFFERENT: not a finding"


def _runs(results: Path) -> dict:
    runs, refused = read_runs(results)
    assert not refused
    return {r.variant: r for r in runs}


def test_the_report_marks_the_bar_and_keeps_it_off_the_front(tmp_path):
    from hopperlab.results.report.charts import DIFFERENT_BAR, bar_style

    assert correctness.NOT_A_FINDING == NOT_A_FINDING
    runs = _runs(write_folder(tmp_path / "results"))
    assert runs[WRONG].correctness.state == correctness.DIFFERENT
    style, words = bar_style(runs[WRONG])
    assert style["hatch"] == DIFFERENT_BAR["hatch"] and NOT_A_FINDING in words
    assert NOT_A_FINDING not in bar_style(runs[HONEST])[1]
    # the fault is faster and lighter than every honest run: on the front it pushed them off
    group = list(runs.values())
    front = tradeoffs.pareto_front(group, "tokens_per_s")
    assert WRONG not in front and HONEST in front, front
    page = render_html(group)
    assert f"grey cross-hatched bars, {NOT_A_FINDING}: {WRONG}" in page
    assert f"not weighed nor on the front, {NOT_A_FINDING}: {WRONG}" in page
    # the family's speed-against-memory chart: no point of it (it would sit where the best does)
    caption = next(c for c in page.split("<figcaption>")[1:]
                   if c.startswith("tokens/s over peak GPU memory"))
    assert caption.split("</figcaption>")[0].endswith(f"left out, {NOT_A_FINDING}: {WRONG}")


def test_a_different_point_crosses_no_line(tmp_path):
    results = tmp_path / "results"
    # two techniques over micro_batch; b at 2 is the fault, reading far above a there
    for variant, batch, speeds, grads in (
            ("a.micro_batch-1", 1, (100.0, 101.0, 99.0), GRADS),
            ("a.micro_batch-2", 2, (100.0, 101.0, 99.0), GRADS),
            ("b.micro_batch-1", 1, (90.0, 91.0, 89.0), GRADS),
            ("b.micro_batch-2", 2, (200.0, 201.0, 199.0), (0.0,) * 4)):
        write_finetune(results, variant, speeds, grads=grads, params={"micro_batch": batch})
    # the experiment's baseline is the first point
    for path in results.rglob("spec.json"):
        path.write_text(path.read_text().replace(f'"baseline": "{BASELINE}"',
                                                 '"baseline": "a.micro_batch-1"'))
    runs, _ = read_runs(results)
    assert {r.variant: r.correctness.state for r in runs if r.correctness}[
        "b.micro_batch-2"] == correctness.DIFFERENT
    assert not crossovers.experiment_crossings(runs)
    lines = crossovers.series_of(runs, "tokens_per_s")["micro_batch"]
    b = next(ln for ln in lines if ln.technique == "b")
    assert [p.status for p in b.points] == ["ok", NOT_A_FINDING]
    section = crossovers.crossover_section(runs, charts=False)
    assert f"{NOT_A_FINDING}: b.micro_batch-2" in section


def test_the_energy_table_and_power_chart_mark_the_run(tmp_path):
    results = write_folder(tmp_path / "results")
    for variant in (BASELINE, HONEST, WRONG):   # each run measured its energy
        for name in ("record.json", "metrics.json"):
            path = results / EXPERIMENT / variant / name
            data = json.loads(path.read_text())
            data["tags"][N.TAG_WINDOW] = "measured steps"
            data["metrics"][N.ENERGY_GPU_J] = 50.0
            path.write_text(json.dumps(data))
    table = energy.energy_table(list(_runs(results).values()))
    row = next(tr for tr in table.split("<tr>") if f"<td>{WRONG}" in tr)
    assert NOT_A_FINDING in row, row
    assert sum(NOT_A_FINDING in tr for tr in table.split("<tr>")) == 1


def _two_machines(tmp_path: Path, verb: str) -> tuple[int, list[dict], str]:
    """``hopperlab <verb> results-a results-b``: m1's variant honest, m2's the fault (twice
    as fast); the exit status, the csv's rows and the page."""
    a = write_folder(tmp_path / "results-a", machine="m1", wrong=False)
    write_finetune(a, WRONG, SPEEDS[BASELINE], offload="activations", machine="m1")  # honest
    write_folder(tmp_path / "results-b", machine="m2")
    out = tmp_path / "out"
    rc = main(["--root", str(tmp_path), verb, str(a), str(tmp_path / "results-b"),
               "--out", str(out)])
    name = "machines" if verb == "machines" else "compare"
    return (rc, list(csv.DictReader((out / f"{name}.csv").open())),
            (out / f"{name}.html").read_text())


def test_the_machines_page_gives_it_no_ratio_no_bar_and_no_rank(tmp_path, capsys):
    rc, rows, page = _two_machines(tmp_path, "machines")
    assert rc == 0
    wrong = next(r for r in rows if r["variant"] == WRONG and r["machine"] == "m2")
    assert wrong["ratio_to_reference"] == "" and wrong["better"] == "", wrong
    assert wrong["correctness"] == correctness.DIFFERENT
    honest = next(r for r in rows if r["variant"] == HONEST and r["machine"] == "m2")
    assert honest["ratio_to_reference"] != "" and honest["correctness"] == correctness.SAME
    assert f"not drawn, {NOT_A_FINDING}: {WRONG} on m2" in page
    assert f"m2: 1 run(s) reading DIFFERENT on either side ({NOT_A_FINDING}: " \
           f"{WRONG}): not ranked" in page
    assert "faster in 0 of 2 runs" in page   # ranked on the honest two only


def test_compare_a_b_says_different_in_b_not_faster(tmp_path, capsys):
    rc, rows, page = _two_machines(tmp_path, "compare")
    assert rc == 1
    mine = [r for r in rows if r["run"] == f"{EXPERIMENT}/{WRONG}"]
    assert [r["verdict"] for r in mine] == ["DIFFERENT in B"], mine
    assert f"1 run(s) of B read DIFFERENT, not a finding: {EXPERIMENT}/{WRONG}" in page
    assert "B is better" not in page


def test_a_different_run_is_predicted_nowhere(tmp_path):
    from hopperlab.results.machines import descriptions, predict, runs

    root = Path(__file__).resolve().parents[2] / descriptions.MACHINES_DIR
    src = descriptions.find_description(root, "h200-141g-pcie5-x86_64")
    tgt = descriptions.find_description(root, "gh200-96g-c2c-aarch64")
    group = runs.load_folder(write_folder(tmp_path / "results"))[0]
    preds = predict.predict_run(group, f"{EXPERIMENT}/{WRONG}", src, tgt)
    assert preds and all(p.predicted is None and p.unpredictable.startswith(NOT_A_FINDING)
                         for p in preds), preds
    honest = predict.predict_run(group, f"{EXPERIMENT}/{HONEST}", src, tgt)
    assert not any((p.unpredictable or "").startswith(NOT_A_FINDING) for p in honest)


def test_a_different_run_on_two_gpus_is_not_predicted_from_one(tmp_path):
    from hopperlab.results.machines import descriptions, gpu_count, runs

    root = Path(__file__).resolve().parents[2] / descriptions.MACHINES_DIR
    desc = descriptions.find_description(root, "h200-141g-pcie5-x86_64")
    one = tmp_path / "one-gpu"
    for variant in (HONEST, WRONG):   # honest one-GPU runs of both
        write_finetune(one, f"{variant}-1gpu", SPEEDS[HONEST], offload="activations")
    multi = write_folder(tmp_path / "two-gpus")
    for spec in multi.rglob("spec.json"):
        data = json.loads(spec.read_text())
        spec.write_text(json.dumps({**data, "resources": {"gpus": 2, "nodes": 1}}))
    preds = gpu_count.predict_counts(runs.load_folder(one)[0], desc, runs.load_folder(multi))
    by = {p.variant: p for p in preds}
    assert by[WRONG].unpredictable.startswith(NOT_A_FINDING), by[WRONG]
    assert by[WRONG].measured is None
    assert not (by[HONEST].unpredictable or "").startswith(NOT_A_FINDING)


def test_a_node_whose_run_reads_different_fails_check_every_node(tmp_path):
    from hopperlab.results.machines import node_check
    from hopperlab.results.rows import collect_runs

    nodes = {"n1": write_folder(tmp_path / "n1", wrong=False),
             "n2": write_folder(tmp_path / "n2", wrong=False),
             "n3": write_folder(tmp_path / "n3")}    # on n3 the variant skips backward
    for n in ("n1", "n2"):
        write_finetune(nodes[n], WRONG, SPEEDS[BASELINE], offload="activations")
    verdicts = {v.node: v for v in node_check.judge_nodes(
        {n: collect_runs(f) for n, f in nodes.items()}, tmp_path / "no-refs")}
    assert verdicts["n3"].verdict == "different", verdicts["n3"]   # a failure, exit 1
    assert any(line.startswith(f"DIFFERENT {EXPERIMENT}/{WRONG} against {BASELINE}")
               for line in verdicts["n3"].lines)
    assert verdicts["n1"].verdict == verdicts["n2"].verdict == node_check.PASS


def test_check_junit_fails_the_different_run(tmp_path):
    import xml.etree.ElementTree as ET

    results = write_folder(tmp_path / "results")
    junit = tmp_path / "check.xml"
    assert main(["--root", str(tmp_path), "check", str(results), "--references",
                 str(tmp_path / "no-refs"), "--junit", str(junit)]) == 1
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    failure = cases[f"{EXPERIMENT}/{WRONG}"].find("failure")
    assert failure is not None and failure.get("type") == "different", ET.tostring(
        cases[f"{EXPERIMENT}/{WRONG}"])
    assert "gradient norm" in failure.text
    assert cases[f"{EXPERIMENT}/{HONEST}"].find("failure") is None


def test_a_run_compared_with_a_different_run_reads_different_too(tmp_path):
    results = write_folder(tmp_path / "results")
    # compared with the fault itself (compare_to), and the same as it: a wrong result agreed with
    run_dir = write_finetune(results, "after-the-fault", SPEEDS[WRONG], grads=(0.0,) * 4,
                             offload="activations")
    spec = json.loads((run_dir / "spec.json").read_text())
    (run_dir / "spec.json").write_text(json.dumps({**spec, "compare_to": WRONG}))
    v = _runs(results)["after-the-fault"].correctness
    assert v.state == correctness.DIFFERENT and v.against == WRONG, v
    assert v.detail.startswith(f"compared with {WRONG}, which reads DIFFERENT against "
                               f"{BASELINE}: step 0: gradient norm"), v.detail


def test_the_tables_of_a_gpu_call_mark_the_run(tmp_path):
    from hopperlab.results.tables import energy as energy_table, runs as runs_table

    results = write_folder(tmp_path / "results")
    for lines in (runs_table.lines(results, tmp_path / "no-refs"), energy_table.lines(results)):
        marked = [ln for ln in lines if NOT_A_FINDING in ln]
        assert len(marked) == 1 and f"{EXPERIMENT}/{WRONG}" in marked[0], lines
