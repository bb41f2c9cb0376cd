import os
from pathlib import Path

# Under pytest-xdist every core has its worker, each on one thread (below), and so is every process a test starts
# (a run, a sweep's runs, torchrun's ranks, SLURM's tasks): torch reads OMP_NUM_THREADS at import, inductor its
# compile workers when its config loads. Their default, a thread per core, oversubscribed the cores the workers
# already fill (the files that start runs took a fifth more CPU and a third more time, measured). A user's own
# values are kept; a test of the product's thread defaults clears them (tests/lab/test_sweep_slots.py).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
# every run imports torch._dynamo (with sympy), even uncompiled (muonlab.lab.warm_start says why): ~2 s of a core,
# imported once here, so that no test's CPU budget pays it by being its worker's first run
import torch._dynamo  # noqa: F401
# so too the Hugging Face models the families build (~1 s of a core, where transformers is installed): a worker's first
# import was charged to whichever fast test built one first (2.2-2.5 CPU s in a slow hour, over the fast budget)
for _module in ("transformers.models.llama.modeling_llama", "transformers.models.qwen2.modeling_qwen2",
                "transformers.models.t5gemma2.modeling_t5gemma2"):
    try:
        __import__(_module)
    except ImportError:  # an optional package; its tests skip, saying why
        break
from muonlab.host_memory import retain_freed_host_memory
from support.bundles import PRECISIONS, reference_bundles  # tests/ is on sys.path
from support.budget import TierBudget, heaviest_units_first
from support.ranks import one_thread as single_thread

pytest_plugins = ["pytester"]  # tests/suite/test_suite_layout.py runs small suites of its own

RAM_TEMP_MIN_FREE = 4 << 30  # /dev/shm with less room left: the disk's temporary folder


def _ram_temp_root() -> str | None:
    """Linux's RAM-backed /dev/shm, where it exists with room and the user named no temporary folder: the
    suite's runs write their checkpoints and weights through fsync'd atomic writes (several GB in all), which
    on a disk cost a flush each and here a copy. Passed tests' folders are removed as they end
    (tmp_path_retention_policy), so the RAM held is the running tests'."""
    named = any(os.environ.get(name) for name in ("TMPDIR", "PYTEST_DEBUG_TEMPROOT"))
    if named or os.environ.get("MUONLAB_TEST_TMP") == "disk":
        return None
    try:
        free = os.statvfs("/dev/shm")
    except OSError:
        return None
    if not os.access("/dev/shm", os.W_OK | os.X_OK) or free.f_bavail * free.f_frsize < RAM_TEMP_MIN_FREE:
        return None
    return "/dev/shm"


if (_root := _ram_temp_root()) is not None:
    os.environ["PYTEST_DEBUG_TEMPROOT"] = _root  # pytest's tmp_path root alone (torch's caches stay on disk)

# The tests compute on the host as a CPU run does: freed tensors' memory kept for the next (muonlab.host_memory;
# with glibc's defaults a third of a tied-head run's time went to faulting fresh pages in)
retain_freed_host_memory()

# Under pytest-xdist every core has its worker: one thread each (tiny models gain nothing from
# more, and oversubscribed cores slow everything); a single process may use two.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Never touch the user's real cache from tests."""
    monkeypatch.setenv("MUONLAB_CACHE", str(tmp_path / "cache"))


@pytest.fixture(autouse=True)
def _forget_defined_arms():
    """An arm a test defines (an experiment file's, --arm-name) leaves the registry with it: the tests that
    walk every registered arm see the registry, not what earlier tests of the worker defined."""
    from muonlab.arms import ARMS

    before = set(ARMS)
    yield
    for name in set(ARMS) - before:
        del ARMS[name]


@pytest.fixture
def one_thread(monkeypatch):
    """Train on one thread, here and in child processes (OMP_NUM_THREADS): tiny models run
    fastest so on a shared machine, and runs in and out of process compare bit for bit."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with single_thread():
        yield


@pytest.fixture
def cuda() -> torch.device:
    """The CUDA device: a test that asks for it, itself or through a fixture, is the gpu tier (support.tiers),
    skipped at collection where no CUDA device exists (pytest_collection_modifyitems below)."""
    return torch.device("cuda")


@pytest.fixture
def forget_plugins():
    """The plug-ins a test registers leave the registries with it: their options would otherwise stay
    settings of the run config (optim.prepolar, model.plugin_variants) for the later tests of the process."""
    from muonlab import plugins
    from muonlab.lab import plugin_methods
    from muonlab.model import REGISTRY
    from muonlab.optim import extensions

    conditioners, variants, loaded = set(extensions.prepolars()), set(REGISTRY), set(plugins._LOADED)
    yield
    for item in set(plugins._LOADED) - loaded:
        plugins.forget(item)
        plugin_methods._METHODS.pop(item, None)
    for name in set(extensions.prepolars()) - conditioners:
        extensions.unregister_prepolar(name)
    for name in set(REGISTRY) - variants:
        del REGISTRY[name]


def _bundle_id(path: Path) -> str:
    return ("shipped-" if path.parent.name == "golden" else "shared-") + path.stem


@pytest.fixture(params=[b for p in PRECISIONS for b in reference_bundles(p)], ids=_bundle_id)
def reference_bundle(request) -> Path:
    """Every upstream bundle, either precision."""
    return request.param


@pytest.fixture(params=reference_bundles("fp32"), ids=_bundle_id)
def fp32_reference_bundle(request) -> Path:
    """Every fp32 upstream bundle (the tight tolerances the mutation tests rely on)."""
    return request.param


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test that reaches a feature whose optional package is not installed is skipped with the reason
    (the feature's own one-line refusal), not failed: `make test` installs them all, a GPU image may not."""
    from muonlab.optional import MissingPackage

    try:
        return (yield)
    except MissingPackage as exc:
        pytest.skip(f"optional package missing: {exc}")


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook (the suite also runs without xdist)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` (make test): a file to a worker, but a spread file's tests one by one (support.scheduling)."""
    from support.scheduling import make_scheduler

    return make_scheduler(config, log)


def pytest_configure(config):
    config.pluginmanager.register(TierBudget(), "muonlab-tier-budget")  # the suite's own time budget


def pytest_collection_modifyitems(config, items):
    heaviest_units_first(items, config.rootpath)
    if not torch.cuda.is_available():  # before a gpu test's fixtures are set up (a run some of them train)
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
