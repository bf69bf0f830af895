"""Shared fixtures: launching real Horovod ranks from pytest."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

import criteo_samples

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def signal_when_ready(script: str, ready: str, timeout: float = 60) -> tuple[int, str, str]:
    """Runs ``python -c script``, sends it SIGTERM once it printed the line ``ready``; returns (status, out, err)."""
    process = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=worker_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == ready
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=timeout)
    return process.returncode, stdout, stderr


def worker_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO + os.pathsep + env.get("PYTHONPATH", "")})
    env.update(extra or {})
    return env


# TensorFlow 2.21 writes these two lines at import whatever TF_CPP_MIN_LOG_LEVEL says (absl's logs
# before its initialisation go to stderr): they are TensorFlow's, not the output a test checks.
_TENSORFLOW_IMPORT_LOG = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|I\d{4} [\d:.]+ +\d+ port\.cc:\d+\] oneDNN custom operations are on\..*)$")


def own_lines(text: str) -> list[str]:
    """The lines of a process's output without TensorFlow's import-time log lines."""
    return [line for line in text.strip().splitlines() if not _TENSORFLOW_IMPORT_LOG.match(line)]


def one_each(args: list[str]) -> list[str]:
    """``args`` with each ``--name=value`` flag once, the last value in the first one's place.

    Tests add a case's flags after a shared list (TINY_MODEL's ``--learning_rate``, then a diverging
    one); main.py refuses a flag given twice with different values, so the override replaces it here.
    """
    merged, place = [], {}
    for argument in args:
        name = argument.split("=", 1)[0] if argument.startswith("--") and "=" in argument else None
        if name in place:
            merged[place[name]] = argument
            continue
        if name is not None:
            place[name] = len(merged)
        merged.append(argument)
    return merged


def launch(num_ranks: int, args: list[str], timeout: float = 600, check: bool = True, env: dict | None = None):
    """Runs ``horovodrun -np N --gloo python ARGS`` on localhost; returns the CompletedProcess.

    horovodrun exits non-zero when any rank does, so one exit code covers every rank; with
    ``check`` a failure shows the tail of the combined output.
    """
    command = [HOROVODRUN, "-np", str(num_ranks), "-H", f"localhost:{num_ranks}", "--gloo", sys.executable, *one_each(args)]
    completed = subprocess.run(
        command, cwd=REPO, env=worker_env(env), capture_output=True, text=True, timeout=timeout
    )
    if check and completed.returncode != 0:
        tail = (completed.stdout + completed.stderr)[-6000:]
        pytest.fail(f"horovodrun -np {num_ranks} failed with exit code {completed.returncode}:\n{tail}")
    return completed


def launch_cases(world_size: int, worker: str, cases: list[dict], directory, timeout: float = 900,
                 env: dict | None = None) -> list[dict]:
    """Runs ``worker`` (a script ending in :func:`tests.case_runs.run_cases_on_this_rank`) on
    ``world_size`` ranks over ``cases`` (``env``: extra environment); returns every rank's records, rank by rank."""
    import json

    cases_path = os.path.join(str(directory), "cases.json")
    with open(cases_path, "w") as handle:
        json.dump(cases, handle)
    launch(world_size, [worker, cases_path, str(directory)], timeout=timeout, env=env)
    records = []
    for rank in range(world_size):
        with open(os.path.join(str(directory), f"rank{rank}.json")) as handle:
            records.extend(json.load(handle))
    return records


class CaseLaunches:
    """Equivalence cases run on several world sizes: one ``horovodrun`` launch per world size runs
    every case meant for it (TensorFlow's start-up on oversubscribed ranks dominates, so cases share
    a launch). A case may name its ``world_sizes`` (default: all of them): the 4-rank launch, the
    costliest on 2 cores, runs the cases whose plan changes at 4 ranks (an empty rank, 4 slices),
    not every optimizer again."""

    def __init__(self, worker: str, cases: list[dict], world_sizes=(2, 3, 4), env: dict | None = None,
                 prepare=None):
        self.worker, self.cases, self.world_sizes, self.env = worker, cases, tuple(world_sizes), env
        self.prepare = prepare  # tmp_path_factory -> extra env, run once before the first launch
        self._records: dict[int, list[dict]] = {}
        self._prepared: dict | None = None

    def sizes_of(self, case: dict) -> tuple:
        return tuple(n for n in self.world_sizes if n in case.get("world_sizes", self.world_sizes))

    def params(self) -> list:
        """``(world_size, case name)`` pairs for ``pytest.mark.parametrize("world_size,case", ...)``."""
        return [pytest.param(n, c["name"], id=f"{c['name']}-{n}") for c in self.cases for n in self.sizes_of(c)]

    def records(self, world_size: int, tmp_path_factory, case: str | None = None) -> list[dict]:
        """Every rank's records at ``world_size`` (of ``case`` only when given)."""
        if world_size not in self._records:
            if self._prepared is None:
                self._prepared = self.prepare(tmp_path_factory) if self.prepare else {}
            directory = tmp_path_factory.mktemp(f"{os.path.splitext(os.path.basename(self.worker))[0]}_np{world_size}")
            cases = [c for c in self.cases if world_size in self.sizes_of(c)]
            self._records[world_size] = launch_cases(world_size, self.worker, cases, directory,
                                                     env={**(self.env or {}), **self._prepared})
        records = self._records[world_size]
        return records if case is None else [r for r in records if r["case"] == case]


def run_python(args: list[str], timeout: float = 600, check: bool = True, env: dict | None = None):
    """Runs ``python ARGS`` in the repository with quiet TensorFlow logs."""
    completed = subprocess.run(
        [sys.executable, *one_each(args)], cwd=REPO, env=worker_env(env), capture_output=True, text=True, timeout=timeout
    )
    if check and completed.returncode != 0:
        pytest.fail(f"python {' '.join(args)} failed with exit code {completed.returncode}:\n{(completed.stdout + completed.stderr)[-6000:]}")
    return completed


def make_synthetic_small(directory, seed: int, num_train: int = 200_000, num_valid: int = 50_000):
    """A learnable dataset of feature_specs/synthetic_small.yaml's shape in ``directory``."""
    from tf_dlrm.data.synthetic import generate
    from tf_dlrm.spec.feature_spec import FeatureSpec

    spec = FeatureSpec.load(os.path.join(REPO, "feature_specs", "synthetic_small.yaml"), check_files=False)
    generate(spec, str(directory), num_train_samples=num_train, num_valid_samples=num_valid, seed=seed)
    return directory


@pytest.fixture
def horovodrun():
    return launch


@pytest.fixture(scope="session")
def generated_criteo(tmp_path_factory) -> criteo_samples.Samples:
    """Rows in the Criteo TSV and Kaggle CSV layouts, written by the tests (see tests/criteo_samples.py)."""
    return criteo_samples.generated_samples(tmp_path_factory.mktemp("criteo_generated"))


@pytest.fixture(scope="session")
def real_criteo() -> criteo_samples.Samples:
    """The real Criteo samples from $TF_DLRM_CRITEO_SAMPLES; the test skips with one line when absent."""
    return criteo_samples.real_samples()


def pytest_configure(config):
    # Registered here, not in pyproject.toml: scripts/install.sh reinstalls when pyproject.toml changes.
    config.addinivalue_line("markers", "integration: starts a process (horovodrun, main.py, python -m, Spark); "
                                       "set by this file's rule (see is_integration), or by hand")
    config.addinivalue_line("markers", "real_data: reads the real Criteo samples ($TF_DLRM_CRITEO_SAMPLES); "
                                       "generated rows cover the same code")


REAL = pytest.param("real", marks=pytest.mark.real_data)


@pytest.fixture(scope="session", params=["generated", REAL])
def criteo(request) -> criteo_samples.Samples:
    """Each test that takes it runs on the generated rows and again on the real samples (skipped when absent)."""
    return request.getfixturevalue(f"{request.param}_criteo")


@pytest.fixture(scope="session", params=[REAL if criteo_samples.preferred_source() == "real" else "generated"])
def criteo_real_or_generated(request) -> criteo_samples.Samples:
    """For the costly tests (a process or a Spark session each): one run, on the real samples where present
    (the test id says ``real``), else on the generated rows (``generated``)."""
    return request.getfixturevalue(f"{request.param}_criteo")


# Under pytest-xdist (`make test` runs `-n 2 --dist loadfile`) a test file is one unit of work, so
# module- and session-level caches (a launch whose records many tests read) run once, not once per
# worker; the files below share `tests/checkpoint/checkpoint_runs.py`'s cached launches and form one unit.
SHARED_RUN_FILES = {
    "tests/checkpoint/test_checkpoint.py", "tests/cli/test_export.py", "tests/cli/test_modes.py",
    "tests/checkpoint/test_resume.py", "tests/train/test_model_family_runs.py"}
# Slowest first (from `pytest --durations=0` on the 2-core CI machine's kind), so that the last unit
# a worker picks up is a short one and the two workers end together.
SLOWEST_UNITS = (
    "tests/embedding/test_equivalence.py", "tests/train/test_main_training.py",
    "tests/embedding/test_split_tables.py", "checkpoint_runs", "tests/embedding/dynamic/test_dynamic_main_checkpoint.py",
    "tests/embedding/dynamic/test_dynamic_equivalence.py", "tests/train/test_amp_xla.py", "tests/embedding/test_hot_row_sync.py",
    "tests/models/test_model_family_equivalence.py", "tests/test_dockerfile.py", "tests/bad_inputs/test_bad_inputs.py",
    "tests/test_docs_commands.py",
    "tests/embedding/test_two_layers.py", "tests/checkpoint/test_table_larger_than_a_process.py",
    "tests/embedding/dynamic/test_dynamic_main.py", "tests/train/test_multi_hot_training.py", "tests/bad_inputs/test_resilient.py",
    "tests/benchmarks/test_benchmarks_smoke.py", "tests/embedding/dynamic/test_dynamic_checkpoint.py",
    "tests/benchmarks/test_step_breakdown.py", "tests/bad_inputs/test_signals.py",
    "tests/embedding/test_dedup_exchange.py", "tests/bad_inputs/test_checkpoint_safety.py",
    # The unit tier's slowest (`make test-unit` balances on these too).
    "tests/embedding/test_plan_never_refuses.py", "tests/preprocessing/test_criteo_local.py",
    "tests/ops/test_repeated_rows_kernels.py", "tests/embedding/test_embedding_bag_training.py",
    "tests/data/test_split_tfrecords.py", "tests/embedding/test_weighted_sequence.py",
)


def work_unit(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "checkpoint_runs" if path in SHARED_RUN_FILES else path


# Test tiers. A test is `integration` when it, a fixture it uses, or a helper under tests/ or benchmarks/
# it calls (followed through the names its code refers to) starts a process: one of the launch helpers
# above, the subprocess module, or a Spark session (a JVM). The rest is the unit tier (`make test-unit`,
# `pytest -m "not integration"`); there a test that starts a process anyway fails (see
# pytest_runtest_protocol), so a classification this rule gets wrong shows up, not a slow unit tier.
PROCESS_NAMES = frozenset({"subprocess", "launch", "launch_cases", "run_python", "horovodrun", "spark_engine",
                           "make_session", "pyspark", "Popen"})
TIER_PROGRAMS = frozenset({"horovodrun", "mpirun", "spark-submit", "java", "bash", "sh", "docker", "hadolint"})
HELPER_ROOTS = (os.path.join(REPO, "tests") + os.sep, os.path.join(REPO, "benchmarks") + os.sep)


def _names(code) -> set[str]:
    """Global, attribute and imported names that ``code`` and the functions nested in it refer to."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if hasattr(constant, "co_names"):
            names |= _names(constant)
    return names


def _is_helper(value) -> bool:
    source = getattr(value, "__file__", None) or getattr(getattr(value, "__code__", None), "co_filename", None)
    if source is None and not isinstance(value, type(sys)):  # a class, or an instance of one (CaseLaunches)
        kind = value if isinstance(value, type) else type(value)
        source = getattr(sys.modules.get(kind.__module__), "__file__", None)
    return bool(source) and os.path.abspath(source).startswith(HELPER_ROOTS)


def starts_processes(function, seen: set | None = None) -> bool:
    """Whether ``function`` refers, directly or through helpers under tests/ and benchmarks/, to PROCESS_NAMES."""
    seen = set() if seen is None else seen
    if id(function) in seen:
        return False
    seen.add(id(function))
    if isinstance(function, type(sys)):  # a helper module: any of its functions or classes
        members = [v for v in vars(function).values() if callable(v) and _is_helper(v)]
        return any(starts_processes(member, seen) for member in members)
    if isinstance(function, type):
        return any(starts_processes(v, seen) for v in vars(function).values() if callable(v))
    if not callable(function) and hasattr(function, "__dict__"):  # an instance: its class and callable attributes
        return starts_processes(type(function), seen) or any(
            starts_processes(v, seen) for v in vars(function).values() if callable(v) and _is_helper(v))
    function = getattr(function, "__wrapped__", function)
    code = getattr(function, "__code__", None)
    if code is None:
        return False
    names = _names(code)
    if names & PROCESS_NAMES:
        return True
    scope = getattr(function, "__globals__", {})
    return any(starts_processes(helper, seen) for name in names if name in scope for helper in _helpers_in(scope[name]))


def _helpers_in(value) -> list:
    """``value`` if it is a helper, or the helpers held in a dict, list or tuple of them."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [v for v in value if not isinstance(v, (str, bytes, int, float)) and _is_helper(v)]
    return [value] if _is_helper(value) else []


def is_integration(item) -> bool:
    if starts_processes(getattr(item, "function", None)):
        return True
    fixture_info = getattr(item, "_fixtureinfo", None)
    for definitions in (fixture_info.name2fixturedefs.values() if fixture_info else ()):
        for definition in definitions:
            if definition.argname == "horovodrun" or (_is_helper(definition.func) and starts_processes(definition.func)):
                return True
    return False


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_integration(item):
            item.add_marker(pytest.mark.integration)
        if "real_criteo" in item.fixturenames:
            item.add_marker(pytest.mark.real_data)
    rank = {unit: position for position, unit in enumerate(SLOWEST_UNITS)}
    items.sort(key=lambda item: rank.get(work_unit(item.nodeid), len(rank)))  # stable: file order kept in a unit


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A unit-tier test (not marked integration) that starts a process fails, naming the command."""
    if item.get_closest_marker("integration") is not None:
        return (yield)
    original = subprocess.Popen.__init__

    def refuse(self, args, *rest, **kwargs):
        # Libraries may run small probes (numpy.testing runs lscpu); what the tier excludes is a test's own
        # Python, horovodrun, shell or Spark (JVM) process.
        program = os.path.basename(str(args if isinstance(args, (str, bytes, os.PathLike)) else args[0]).split()[0])
        if program.startswith("python") or program in TIER_PROGRAMS:
            raise RuntimeError(f"{item.nodeid} is in the unit tier but started a process: {args!r}. Mark it "
                               "@pytest.mark.integration (or call a helper that tests/conftest.py recognises).")
        original(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = refuse
    try:
        return (yield)
    finally:
        subprocess.Popen.__init__ = original


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with :func:`work_unit` as the unit, in collection order (slowest first)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False  # keep the slowest-first order of the collection
    return WorkUnitScheduling(config, log)
