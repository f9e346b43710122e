"""The scheduler backends' room (issue 31 item 1): a backend is its folder under
hopperlab/backends/, found by the registry; sites are validated from the declarations; the job
asks one "where am I"; the in-process debug backend runs a site's jobs end to end."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from hopperlab import backends
from hopperlab.config.matrix import load_matrix
from hopperlab.config.spec import RunSpec, spec_data_fingerprint
from hopperlab.core.errors import SpecError
from tests.helpers import REPO, copy_project, hopperlab

TRIVIAL = "selftest/trivial/ok"
SITE = {"poll_interval_s": 0.2,
        "resources": {"smoke": {"gpus": 0, "cpus": 1, "mem_gb": 1, "time_min": 5},
                      "full": {"gpus": 0, "cpus": 1, "mem_gb": 1, "time_min": 5}}}

#: a backend of the tests, in a folder of its own: a declaration with a settings block and
#: its executor module (submitit's DebugExecutor: it really runs, in-process)
TOY_INIT = '''
from dataclasses import dataclass

from hopperlab.backends.base import BackendInfo


@dataclass(frozen=True)
class ToySettings:
    queue: str = "main"
    priority: int = 0


BACKEND = BackendInfo(
    name="toy", summary="a backend of the tests", executor="hopperlab.backends.toy.executor",
    read_environment=lambda environ: None, settings=ToySettings, result_keys=("queue",),
    multi_task=False, in_process=True, placement="in the test's process",
    profiler_reach="none")
'''
TOY_EXECUTOR = '''
from hopperlab.backends.base import Launcher


class ToyLauncher(Launcher):
    def make_executor(self, req, log):
        import submitit

        log(f"toy: queue {req.settings.queue}")
        return submitit.DebugExecutor(folder=req.folder)


LAUNCHER = ToyLauncher()
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return copy_project(tmp_path_factory.mktemp("backends") / "project")


def _site(project: Path, name: str, **keys) -> None:
    (project / "configs/sites" / f"{name}.yaml").write_text(yaml.safe_dump({**SITE, **keys}))


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """A backend folder outside the package, on the package's path: as if it were added."""
    folder = tmp_path / "extra" / "toy"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(textwrap.dedent(TOY_INIT))
    (folder / "executor.py").write_text(textwrap.dedent(TOY_EXECUTOR))
    monkeypatch.setattr(backends, "__path__", [*backends.__path__, str(tmp_path / "extra")])
    backends.forget()
    yield
    monkeypatch.undo()
    backends.forget()


def _folders() -> list[str]:
    """The backends of the package, by its folders (what the registry must find)."""
    return sorted(p.parent.name for p in Path(backends.__file__).parent.glob("*/__init__.py")
                  if not p.parent.name.startswith("_"))


def test_the_registry_finds_every_backend_folder():
    assert backends.names() == _folders() and backends.names()
    for info in backends.all_backends():
        launcher = backends.launcher(info.name)  # its executor module loads and says LAUNCHER
        assert callable(launcher.make_executor)
    slurm, local, debug = (backends.backend(n) for n in ("slurm", "local", "debug"))
    assert (slurm.spans_nodes, local.spans_nodes, debug.multi_task) == (True, False, False)
    assert (slurm.profiler_reach, local.profiler_reach, debug.profiler_reach) == \
        ("node", "here", "none")


@pytest.mark.integration
def test_a_new_backend_is_its_folder(project, toy, tmp_path):
    """Nothing but the folder: the site names it, its settings block is typed and checked
    from its declaration, its result keys join the fingerprint, its executor runs the job."""
    assert "toy" in backends.names()
    _site(project, "toy-site", executor="toy", toy={"queue": "fast"})
    matrix = load_matrix(project, {"site": "toy-site", "families": "selftest", "only": TRIVIAL,
                                   "results_dir": str(tmp_path / "r")})
    spec = matrix.get(TRIVIAL)
    assert spec.site.own_settings.queue == "fast" and spec.site.poll_interval_s == 0.2
    data = json.loads(json.dumps(spec.to_dict(), default=str))
    assert data["site"]["toy"] == {"queue": "fast", "priority": 0}
    assert RunSpec.from_dict(data).site.own_settings == spec.site.own_settings
    moved = json.loads(json.dumps(data))
    moved["site"]["toy"]["queue"] = "slow"
    assert spec_data_fingerprint(moved) != spec_data_fingerprint(data)
    moved["site"]["toy"] = {"queue": "fast", "priority": 7}  # not a result key
    assert spec_data_fingerprint(moved) == spec_data_fingerprint(data)

    _site(project, "toy-bad", executor="toy", toy={"queue": "fast", "colour": "red"})
    with pytest.raises(SpecError, match=r"toy-bad.yaml: toy.colour: unknown key of a site's toy "
                                        r"block; expected one of: priority, queue"):
        load_matrix(project, {"site": "toy-bad", "families": "selftest", "only": TRIVIAL})
    _site(project, "toy-type", executor="toy", toy={"priority": "high"})
    with pytest.raises(SpecError, match=r"toy-type.yaml: toy.priority: expected int"):
        load_matrix(project, {"site": "toy-type", "families": "selftest", "only": TRIVIAL})

    from hopperlab.run.submit import submit
    lines: list[str] = []
    assert submit(matrix, TRIVIAL, log=lines.append) == 0, lines
    assert "toy: queue fast" in lines
    rec = json.loads((tmp_path / "r" / TRIVIAL / "record.json").read_text())
    assert rec["status"] == "ok"


def test_an_unknown_executor_names_the_file_and_key_and_the_choices(project):
    _site(project, "flux-site", executor="flux")
    with pytest.raises(SpecError) as err:
        load_matrix(project, {"site": "flux-site", "families": "selftest"})
    assert str(err.value) == (f"{project}/configs/sites/flux-site.yaml: executor: unknown "
                              f"executor 'flux'; expected one of: {', '.join(_folders())}")


def test_a_slurm_block_is_checked_from_the_backends_declaration(project):
    _site(project, "slurm-bad", executor="slurm", slurm={"partition": "gpu",
                                                         "extra_sbatch": {"exclusive": [1]}})
    with pytest.raises(SpecError, match=r"slurm-bad.yaml: slurm: extra_sbatch.exclusive: "
                                        r"expected a string, a whole number or true/false"):
        load_matrix(project, {"site": "slurm-bad", "families": "selftest"})
    _site(project, "slurm-typo", executor="slurm", slurm={"partion": "gpu"})
    with pytest.raises(SpecError, match=r"slurm-typo.yaml: slurm.partion: unknown key"):
        load_matrix(project, {"site": "slurm-typo", "families": "selftest"})


def test_where_am_i_asks_the_backend_that_started_the_task():
    slurm_env = {"SLURM_JOB_ID": "77", "SLURM_CPUS_PER_TASK": "8", "SLURM_JOB_PARTITION": "gpu"}
    # a local job on a node held through Slurm: placed by submitit, given CPUs by Slurm
    here = backends.where_am_i({**slurm_env, "SUBMITIT_LOCAL_NTASKS": "2",
                                "SUBMITIT_LOCAL_GLOBALID": "1", "SUBMITIT_LOCAL_JOB_ID": "5"})
    assert (here.launcher, here.rank, here.world_size, here.cpus) == ("local", 1, 2, 8)
    assert here.record["job_id"] == "77" and here.record["partition"] == "gpu"
    alone = backends.where_am_i(slurm_env)  # a process of the allocation, not an srun task
    assert (alone.launcher, alone.world_size, alone.cpus_source) == \
        ("none", 1, "SLURM_CPUS_PER_TASK")
    nothing = backends.where_am_i({})
    assert (nothing.world_size, nothing.cpus, nothing.record) == (1, None, None)


@pytest.mark.integration
def test_a_debug_site_runs_its_jobs_in_process_end_to_end(project, tmp_path):
    """executor: debug in a site: `hopperlab submit` runs the job in its own process (no
    submitit folder of a subprocess, no job id), through the same settling as any run."""
    _site(project, "inproc", executor="debug")
    results = tmp_path / "r"
    out = hopperlab(["submit", TRIVIAL, "--no-upload", "--config", "site=inproc",
                     "families=selftest", f"only={TRIVIAL}", f"results_dir={results}"], project)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "via debug" in out.stdout + out.stderr
    run_dir = results / TRIVIAL
    rec = json.loads((run_dir / "record.json").read_text())
    assert rec["status"] == "ok" and rec["slurm"] is None
    spec = json.loads((run_dir / "spec.json").read_text())
    # only the site's own backend's settings enter the spec (issue 38): no Slurm block here
    assert spec["site"]["executor"] == "debug" and "slurm" not in spec["site"]
    history = [json.loads(ln) for ln in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [h["event"] for h in history if h.get("attempt") == 1][:1] == ["start"]
    assert not [h for h in history if h["event"] == "submitted"]  # nothing a scheduler holds
    # a distributed run is refused before anything runs, naming the site file and key
    two = hopperlab(["submit", "selftest/distributed/ok", "--no-upload", "--config",
                     "site=inproc", "families=selftest", "only=selftest/distributed/ok",
                     f"results_dir={results}"], project)
    assert two.returncode != 0 and "inproc.yaml: executor" in two.stderr, two.stderr[-2000:]
    assert "2 tasks, but the debug executor runs in-process" in two.stderr


def _package_trees():
    import ast

    package = Path(backends.__file__).parents[1]
    for path in sorted(package.rglob("*.py")):
        yield path.relative_to(package).as_posix(), ast.parse(path.read_text())


def test_no_backend_name_is_compared_and_slurm_variables_stay_in_its_folder():
    """Outside backends/, the backend is asked (its caps), never compared by name; the
    scheduler's variables are read only by backends/slurm (its jobenv), and so are its words
    for how a job ended (OUT_OF_MEMORY, NODE_FAIL: its launcher reads them)."""
    import ast

    compared, slurm_vars, slurm_words = [], [], []
    for rel, tree in _package_trees():
        if rel.startswith("backends/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Attribute) and s.attr == "executor" or
                       isinstance(s, ast.Name) and s.id == "executor" for s in sides):
                    compared.append(f"{rel}:{node.lineno}")
            if isinstance(node, ast.Call) and node.args and \
                    isinstance(node.args[0], ast.Constant) and \
                    str(node.args[0].value).startswith("SLURM_"):
                slurm_vars.append(f"{rel}:{node.lineno}")
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and \
                    str(node.slice.value).startswith("SLURM_"):
                slurm_vars.append(f"{rel}:{node.lineno}")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and any(
                    w in node.value for w in ("OUT_OF_MEMORY", "NODE_FAIL", "DUE TO TIME LIMIT",
                                              "DEADLINE", "--container-image", "neither sacct")):
                slurm_words.append(f"{rel}:{node.lineno}")
    assert compared == [], "executor compared by name:\n" + "\n".join(compared)
    assert slurm_vars == [], "SLURM_* read outside backends/slurm:\n" + "\n".join(slurm_vars)
    assert slurm_words == [], "Slurm's job states read outside backends/slurm:\n" + \
        "\n".join(slurm_words)


def test_only_the_scheduler_that_kills_a_job_says_why():
    """Memory kills, node failures and stop lines are the scheduler's words: Slurm's launcher
    reads them; a local job that prints them is not classified by them."""
    said = "slurmstepd: error: Step 11.0 exceeded memory limit (2118524 > 1048576)"
    slurm, local = backends.launcher("slurm"), backends.launcher("local")
    assert "exceeding its memory limit" in slurm.memory_kill("CANCELLED by 0", said)
    assert slurm.memory_kill("COMPLETED", said) is None
    assert slurm.memory_kill("OUT_OF_MEMORY", "").startswith("Slurm ended the job OUT_OF_MEMORY")
    assert "NODE_FAIL" in slurm.node_failure("NODE_FAIL")
    assert slurm.node_failure("FAILED") is None and "CANCELLED" in slurm.stop_words
    assert local.memory_kill("OUT_OF_MEMORY", said) is None
    assert local.node_failure("NODE_FAIL") is None and local.stop_words == ()


def _every_spec(root: Path) -> dict[str, tuple[str, str]]:
    """Every run of the matrix on every site of the project (at smoke scale; at full scale
    too on the Slurm site): its spec.json text and its fingerprint."""
    out = {}
    for site in sorted(p.stem for p in (root / "configs/sites").glob("*.yaml")):
        for scale in ("smoke", "full") if site == "slurm" else ("smoke",):
            for key, spec in load_matrix(root, {"site": site, "scale": scale}).runs.items():
                data = json.loads(json.dumps(spec.to_dict(), default=str))
                out[f"{site}/{scale}/{key}"] = (json.dumps(data, sort_keys=True),
                                                spec_data_fingerprint(data))
    return out


def test_adding_a_backend_changes_no_existing_spec_or_fingerprint(toy_before):
    """Issue 38: a backend's settings block entered every run's spec.json and fingerprint on
    every site (a toy backend with one setting made 80 of 80 local runs rerun). Only the
    site's own backend's block is kept now."""
    before, after = toy_before
    assert len(before) > 100 and after == before


@pytest.fixture
def toy_before(request):
    before = _every_spec(REPO)
    request.getfixturevalue("toy")
    assert "toy" in backends.names()
    return before, _every_spec(REPO)


def test_a_spec_json_of_cdf1dfb_is_adopted_not_redone(project, tmp_path):
    """spec.json changed in issue 38 (other backends' blocks left out): a results folder made
    before (tests/data/cdf1dfb: written by main at cdf1dfb) reads back, and its finished runs
    are adopted, not rerun."""
    from hopperlab.core import rundir as record
    from hopperlab.run.submit import adoptable_record

    for site in ("local", "slurm"):
        old = json.loads((REPO / "tests/data/cdf1dfb" / f"spec-{site}.json").read_text())
        assert "slurm" in old["site"]  # every backend's block, whatever the site's backend
        matrix = load_matrix(project, {"site": site, "families": "selftest",
                                       "only": "selftest/faults/ok",
                                       "results_dir": str(tmp_path / site)})
        spec = matrix.get("selftest/faults/ok")
        new = spec.to_dict()
        assert ("slurm" in new["site"]) == (site == "slurm")  # only the site's own block now
        assert RunSpec.from_dict(old).site.own_settings == spec.site.own_settings
        assert spec_data_fingerprint(old) == spec_data_fingerprint(
            json.loads(json.dumps(new, default=str)))
        run_dir = Path(matrix.root) / spec.run_dir
        record.write_json_atomic(run_dir / record.SPEC_FILE, old)
        record.write_record(run_dir, {"key": spec.key, "attempt": 1, "status": "ok",
                                      "reason": None, "metrics": {}})
        (run_dir / record.HISTORY_FILE).write_text(
            json.dumps({"attempt": 1, "event": "start"}) + "\n" +
            json.dumps({"attempt": 1, "event": "end"}) + "\n")
        rec = adoptable_record(matrix, spec, run_dir)
        assert rec is not None and rec["status"] == "ok", site


PLUGIN_INIT = TOY_INIT.replace('name="toy"', 'name="plugtoy"').replace(
    "hopperlab.backends.toy.executor", "hl_plugtoy.executor").replace(
    "settings=ToySettings,", "settings=ToySettings, settings_key=\"plugtoy\",")


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A backend from outside the package: a distribution on sys.path whose entry point in
    the group hopperlab.backends names its package (as submitit's plugins are found)."""
    import sys

    site_dir = tmp_path / "site-packages"
    (site_dir / "hl_plugtoy").mkdir(parents=True)
    (site_dir / "hl_plugtoy/__init__.py").write_text(textwrap.dedent(PLUGIN_INIT))
    (site_dir / "hl_plugtoy/executor.py").write_text(textwrap.dedent(TOY_EXECUTOR))
    dist = site_dir / "hl_plugtoy-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hl-plugtoy\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        f"[{backends.ENTRY_POINT_GROUP}]\nplugtoy = hl_plugtoy\n")
    monkeypatch.syspath_prepend(str(site_dir))
    backends.forget()
    yield
    monkeypatch.undo()
    for name in [m for m in sys.modules if m.startswith("hl_plugtoy")]:
        del sys.modules[name]
    backends.forget()


def test_a_backend_plugged_in_through_an_entry_point_runs_a_job(project, plugin, tmp_path):
    assert "plugtoy" in backends.names() and backends.backend("plugtoy").name == "plugtoy"
    _site(project, "plug-site", executor="plugtoy", plugtoy={"queue": "fast"})
    matrix = load_matrix(project, {"site": "plug-site", "families": "selftest", "only": TRIVIAL,
                                   "results_dir": str(tmp_path / "r")})
    spec = matrix.get(TRIVIAL)
    assert spec.site.own_settings.queue == "fast"

    from hopperlab.run.submit import submit
    lines: list[str] = []
    assert submit(matrix, TRIVIAL, log=lines.append) == 0, lines
    assert "toy: queue fast" in lines
    rec = json.loads((tmp_path / "r" / TRIVIAL / "record.json").read_text())
    assert rec["status"] == "ok"
