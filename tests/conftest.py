"""Shared pytest configuration: tests import the checkout they run in.

The serving-engine tests' summary ("LPC inside real serving engines": what was compared, what
it cost) is gathered here, in the process that prints the terminal summary, from the reports
of the tests that wrote it (`user_properties` named `ENGINE_REPORT`, attached by
tests/integrations/conftest.py): with pytest-xdist the tests run in worker processes, and
this root conftest is the one every process loads.

Each pytest-xdist worker runs its OpenMP libraries (scikit-learn's histogram gradient
boosting, torch) on one thread: two workers on two cores, each with an OpenMP team as wide as
the machine, made the access-model training tests 20x slower than alone (OpenMP threads
waiting at barriers for a team member descheduled by the other worker) and the default suite
509 s instead of 196 s. Set before anything here imports numpy, scikit-learn or torch; a
value already in the environment is kept.
"""

from __future__ import annotations

import atexit
import gc
import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest

try:
    from hypothesis import settings
except ModuleNotFoundError:  # an engine's venv running only tests/integrations
    settings = None

if settings is not None:
    # Property tests are reproducible and independent of machine load: the examples come from
    # the test's own digest (`derandomize`, so no example database either) and no example has
    # a deadline. `HYPOTHESIS_PROFILE=explore` draws new examples on each run instead.
    settings.register_profile("lpc", deadline=None, derandomize=True, print_blob=True)
    settings.register_profile("explore", deadline=None, print_blob=True)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "lpc"))

# The collector, tuned for a test process. A worker holds some 700,000 tracked objects (torch,
# scikit-learn, pandas, the session's fixtures) while the tests allocate and drop millions of
# small ones; at CPython's default thresholds (700, 10, 10) it ran ~6,800 collections and spent
# ~9 s of a 90 s run in them, two thirds in full ones that walk every live object. Rarer
# collections (every 10,000 net allocations; a full one after 400 young ones) find the same
# garbage, later: ~3 s. At exit, frozen objects are left out of the final collection: the
# process is ending, and the walk over everything cost each worker about a second. Tests that
# need garbage gone call `gc.collect()` themselves.
gc.set_threshold(10_000, 20, 20)
atexit.register(gc.freeze)

ENGINE_REPORT = "lpc_engine_report"
_SUMMARY: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        _SUMMARY.extend(value for name, value in report.user_properties if name == ENGINE_REPORT)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _SUMMARY:
        return
    terminalreporter.section("LPC inside real serving engines")
    for line in _SUMMARY:
        terminalreporter.write_line(line)


RAY_WORKERS = 2  # the local Ray's processors (`local_ray`)
# Files that share a session fixture too costly to build twice run in one worker: the Ray files
# share one local Ray instead of starting one each (possibly at once, on the two cores); the
# embedder files share the imported e5 checkpoint and the loaded embedders
# (tests/predictor/conftest.py), instead of one worker waiting on the other's import; the
# prompt-tokens files share the MLP trained for `prompt_tokens_artifact` (~1.5 s).
SHARED_WORKER_FILES = {
    "tests/lpc/test_fleet_ray.py": "ray",
    "tests/training/test_retrain_ray.py": "ray",
    "tests/predictor/test_predictor_cli.py": "embedders",
    "tests/predictor/test_predictor_e5_import.py": "embedders",
    "tests/predictor/test_predictor_real_embedder.py": "embedders",
    "tests/predictor/test_predictor_server.py": "prompt-tokens",
    "tests/predictor/test_text_features.py": "prompt-tokens",
}

# Files too long for one worker, split in two: the tests named with one of the prefixes keep the
# file's scope (they share its module fixtures: the plugin's parity and agreement runs), the
# others (each starting engine processes of its own) go to the other scope, which the other
# worker can take.
SPLIT_FILES = {
    "tests/integrations/test_vllm_plugin.py": (
        "test_constant_p",
        "test_parity",
        "test_per_request",
        "test_equal_release",
    ),
}


def _scope_of(nodeid: str) -> str:
    """The scheduling unit of a test: its file, its file's group, or half of a split file."""
    path, _, name = nodeid.partition("::")
    prefixes = SPLIT_FILES.get(path)
    if prefixes is not None and not name.startswith(prefixes):
        return f"{path}::apart"
    return SHARED_WORKER_FILES.get(path, path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadfile`, each file whole to one worker (a module-scoped fixture is built once),
    with the files of one `SHARED_WORKER_FILES` group sent together and the `SPLIT_FILES` in
    two halves. Any other `--dist` is pytest-xdist's own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FileOrGroupScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope_of(nodeid)

    return FileOrGroupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that starts Ray from a file not listed would start a second one in its worker."""
    unlisted = sorted(
        {
            item.nodeid.split("::", 1)[0]
            for item in items
            if "local_ray" in getattr(item, "fixturenames", ())
            and item.nodeid.split("::", 1)[0] not in SHARED_WORKER_FILES
        }
    )
    if unlisted:
        raise pytest.UsageError(
            f"tests/conftest.py: {', '.join(unlisted)} use local_ray; add them to "
            "SHARED_WORKER_FILES"
        )


@pytest.fixture(scope="session", autouse=True)
def _own_token_cache(tmp_path_factory: pytest.TempPathFactory):
    """Each test session tokenises into a folder of its own (`LPC_CACHE_DIR`): no test writes
    into the checkout's `.cache/lpc`, or reads what an earlier run left there (a run in a
    used checkout then costs what it costs in a fresh clone). A value already in the
    environment is kept."""
    if os.environ.get("LPC_CACHE_DIR"):
        yield
        return
    os.environ["LPC_CACHE_DIR"] = str(tmp_path_factory.mktemp("lpc-cache"))
    try:
        yield
    finally:
        del os.environ["LPC_CACHE_DIR"]


@pytest.fixture(scope="session")
def local_ray():
    """A local Ray for the tests that fan out on it, or a loud skip when it cannot start.
    Started once per process: its files run in one worker (`SHARED_WORKER_FILES`)."""
    try:
        import ray
    except ModuleNotFoundError:
        pytest.skip("RAY NOT TESTED: Ray is not installed (pip install 'lpc[ray]')")
    try:
        ray.init(num_cpus=RAY_WORKERS, include_dashboard=False, log_to_driver=False)
    except Exception as error:  # any failure to start is a reason to skip, stated
        pytest.skip(f"RAY NOT TESTED: a local Ray could not start: {error}")
    yield ray
    ray.shutdown()
