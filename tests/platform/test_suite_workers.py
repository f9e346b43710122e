"""How scripts/test.sh shares the suite between workers (tests/infra/workers.py, shared.py) and
what its time summary says (scripts/test_times.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import REPO
from tests.infra.workers import (NICE_ENV, SLURM_GROUP, nice_steps, niceness, plan, read_weights,
                                 unit_of)


def test_a_test_that_uses_the_cluster_joins_the_slurm_group_and_others_their_file():
    assert unit_of("tests/a/test_x.py::test_one", ("tmp_path", "slurm_cluster")) == SLURM_GROUP
    assert unit_of("tests/a/test_x.py::test_two[3]", ("tmp_path",)) == "tests/a/test_x.py"


def test_units_go_longest_first_an_unknown_one_as_the_median_and_split_slurm_tests_last():
    tests = [("tests/q.py::a", "tests/q.py"), ("tests/s.py::x", SLURM_GROUP),
             ("tests/c.py::b", SLURM_GROUP), ("tests/c.py::c", "tests/c.py"),
             ("tests/s.py::y", SLURM_GROUP), ("tests/new.py::n", "tests/new.py")]
    weights = {"tests/q.py": 1.0, SLURM_GROUP: 900.0, "tests/c.py": 500.0, "tests/z.py": 20.0}
    order = plan(tests, weights)
    # slurm (900) first, its test from c.py (which also runs elsewhere) at its end; c.py (500);
    # new.py unknown: the median (260.0); q.py (1)
    assert order == ["tests/s.py::x", "tests/s.py::y", "tests/c.py::b", "tests/c.py::c",
                     "tests/new.py::n", "tests/q.py::a"]
    assert sorted(order) == sorted(t for t, _ in tests)  # nothing lost, nothing twice


def test_the_shipped_weights_read_and_name_the_slurm_group(tmp_path):
    assert read_weights()[SLURM_GROUP] > 0
    bad = tmp_path / "w.json"
    bad.write_text("[1, 2]")
    assert read_weights(bad) == {}


def test_made_once_makes_it_once_for_two_processes_and_hands_both_the_result(tmp_path):
    code = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(REPO)!r})
        os.environ["PYTEST_XDIST_WORKER"] = sys.argv[1]
        from pathlib import Path
        from tests.infra.shared import made_once

        class Factory:  # stands for pytest's TempPathFactory: one base per worker
            def getbasetemp(self):
                return Path({str(tmp_path)!r}) / ("popen-" + sys.argv[1])

        def make(folder):
            with open(folder / "makes.txt", "a") as f:
                f.write(sys.argv[1] + "\\n")
            time.sleep(1.0)  # the other process asks meanwhile
            return {{"made_by": sys.argv[1]}}

        folder, got = made_once(Factory(), "thing", make)
        print(folder, got["made_by"])
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, w], stdout=subprocess.PIPE, text=True)
             for w in ("gw0", "gw1")]
    outs = [p.communicate(timeout=60)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len((tmp_path / "shared-thing" / "makes.txt").read_text().split()) == 1
    assert outs[0] == outs[1] and outs[0][0] == str(tmp_path / "shared-thing")


def test_the_summary_sums_by_unit_and_kind_and_writes_weights(tmp_path):
    times = tmp_path / "t.jsonl"
    rows = [{"test": "tests/a.py::x", "group": "tests/a.py", "integration": False,
             "wall_s": 1.5, "cpu_s": 0.5, "worker": "gw0"},
            {"test": "tests/s.py::y", "group": SLURM_GROUP, "integration": True,
             "wall_s": 30.0, "cpu_s": 2.0, "worker": "gw1"},
            {"test": "tests/a.py::z", "group": "tests/a.py", "integration": True,
             "wall_s": 4.0, "cpu_s": 3.0, "worker": "gw0"}]
    times.write_text("".join(json.dumps(r) + "\n" for r in rows))
    weights = tmp_path / "weights.json"
    out = subprocess.run([sys.executable, str(REPO / "scripts/test_times.py"), str(times),
                          "--write", "--weights", str(weights)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "3 tests, 2 units: wall 36 s, CPU 6 s" in out.stdout
    assert "unit tests: 1, wall 2 s" in out.stdout and "integration tests: 2, wall 34 s" in out.stdout
    assert "worker busy: gw0 6 s, gw1 30 s" in out.stdout
    lines = [line.split() for line in out.stdout.splitlines() if line.endswith(("a.py", "slurm"))]
    assert [line[-1] for line in lines] == [SLURM_GROUP, "tests/a.py"]  # longest first
    assert json.loads(weights.read_text()) == {SLURM_GROUP: 30.0, "tests/a.py": 5.5}
    empty = tmp_path / "none.jsonl"
    empty.write_text("")
    assert subprocess.run([sys.executable, str(REPO / "scripts/test_times.py"), str(empty)],
                          capture_output=True, text=True, timeout=60).returncode == 1


def test_under_xdist_each_file_is_one_unit_and_the_cluster_tests_one_group(tmp_path):
    """The plugins in a real ``-n 2 --dist loadgroup`` run (a worker's options are not the
    controller's: the groups must be set where the worker collects)."""
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        import pytest
        pytest_plugins = ["tests.infra.workers", "tests.infra.timing"]

        @pytest.fixture(scope="session")
        def slurm_cluster():
            return "cluster"
    """))
    (tmp_path / "test_a.py").write_text(
        "def test_one(): pass\n\ndef test_two(slurm_cluster): pass\n")
    (tmp_path / "test_b.py").write_text(
        "def test_three(): pass\n\ndef test_four(slurm_cluster): pass\n")
    times = tmp_path / "times.jsonl"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-n", "2", "--dist", "loadgroup", "-o", "addopts=", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HOPPERLAB_TEST_TIMES": str(times)})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = [json.loads(line) for line in times.read_text().splitlines()]
    group = {r["test"].split("@")[0].split("::")[1]: r["group"] for r in rows}
    assert group == {"test_one": "test_a.py", "test_two": SLURM_GROUP,
                     "test_three": "test_b.py", "test_four": SLURM_GROUP}
    workers = {r["worker"] for r in rows if r["group"] == SLURM_GROUP}
    assert len(workers) == 1  # one worker owns the cluster


def test_the_slurm_group_and_a_head_start_file_keep_the_runs_priority_the_others_go_lower():
    assert niceness(SLURM_GROUP, False, 0, 5) == 0
    assert niceness("tests/node/test_image.py", True, 0, 5) == 0
    assert niceness("tests/a/test_x.py", False, 0, 5) == 5
    assert niceness("tests/a/test_x.py", False, 10, 5) == 15
    assert niceness("tests/a/test_x.py", False, 17, 5) == 19  # the kernel's lowest priority
    assert niceness("tests/a/test_x.py", False, 3, 0) == 3  # steps 0: every unit alike


def test_the_nice_steps_come_from_the_environment_and_a_bad_value_is_one_line():
    assert nice_steps({}) == 5
    assert nice_steps({NICE_ENV: "0"}) == 0 and nice_steps({NICE_ENV: " 7 "}) == 7
    for bad in ("five", "-1", "20"):
        with pytest.raises(pytest.UsageError, match=f"{NICE_ENV}={bad!r}"):
            nice_steps({NICE_ENV: bad})


def test_under_xdist_a_head_start_unit_runs_at_the_runs_priority_and_the_others_lower(tmp_path):
    """What each test's process (and so what it starts) really runs at, in a real ``-n 2 --dist
    loadgroup`` run: the Slurm group's and the marked file's tests at the run's nice value, the
    other file's 3 steps lower. The marked file sorts first, so that no worker has to go back up
    (which needs root)."""
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        import pytest
        pytest_plugins = ["tests.infra.workers"]

        @pytest.fixture(scope="session")
        def slurm_cluster():
            return "cluster"
    """))
    record = textwrap.dedent("""
        import os
        from pathlib import Path

        def _note(name):
            with (Path(__file__).parent / "nice.txt").open("a") as f:
                f.write(f"{name} {os.getpriority(os.PRIO_PROCESS, 0)}\\n")
    """)
    (tmp_path / "test_0_image.py").write_text(
        "import pytest\npytestmark = pytest.mark.head_start\n" + record
        + "\ndef test_marked(): _note('marked')\n")
    (tmp_path / "test_a.py").write_text(
        record + "\ndef test_plain(): _note('plain')\n"
        "\ndef test_cluster(slurm_cluster): _note('cluster')\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder",
                          "-o", "addopts=", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, NICE_ENV: "3"})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    base = os.getpriority(os.PRIO_PROCESS, 0)
    got = dict(line.split() for line in (tmp_path / "nice.txt").read_text().splitlines())
    assert got == {"cluster": str(base), "marked": str(base), "plain": str(min(19, base + 3))}
