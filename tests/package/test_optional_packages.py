"""Optional packages are optional: without any of them the package imports, every verb's help prints and
a run trains from already-tokenized data; a feature that needs one refuses in one line (exit 2) with the
command that installs it; the suite still collects, the tests that need one skipping with the reason.

Each check runs in a fresh interpreter where the packages are made unimportable (`sys.modules[name] =
None`: `import name` raises ModuleNotFoundError and importlib.util.find_spec(name) says None, exactly as
for a package that is not installed).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from muonlab.optional import OPTIONAL

TESTS = Path(__file__).parents[1]
# the optional runtime packages, and the test-only ones the layer tests need
EVERY = (*OPTIONAL, "grimp", "importlinter")
VERBS = ("prepare", "train", "arms", "methods", "sweep", "report", "paper", "diagnose", "demo", "doctor",
         "verify-reference")


def run_without(blocked, code: str, tmp_path: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    prelude = ("import sys\n"
               f"for _name in {tuple(blocked)!r}:\n"
               "    sys.modules[_name] = None\n")
    env_code = f"import os\nos.environ['MUONLAB_CACHE'] = {str(tmp_path / 'cache')!r}\n"
    return subprocess.run([sys.executable, "-c", prelude + env_code + code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=timeout)


# The scripts below run several cases in one interpreter: between cases muonlab and the named packages are forgotten
# (torch, imported once, is never blocked), so each case's imports run afresh, as in a new interpreter.
FORGET = """
import sys

def forget(names):
    for name in [m for m in sys.modules if m.split(".")[0] in ("muonlab", *names)]:
        del sys.modules[name]
"""

# Every module imported and every verb's help printed without each set of packages in turn, in one interpreter. The
# sets: all at once, then each alone (a module may import one only when another is there).
IMPORT_ALL_AND_HELP = FORGET + f"""
import contextlib, importlib, io, pkgutil

for blocked in BLOCKED_SETS:
    forget(EVERY)
    for name in blocked:
        sys.modules[name] = None
    import muonlab
    for info in pkgutil.walk_packages(muonlab.__path__, "muonlab."):
        if info.name != "muonlab.__main__":
            importlib.import_module(info.name)
    from muonlab.cli import main
    for argv in ([], *([verb] for verb in {VERBS!r}), ["diagnose", "conditioning"]):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                main([*argv, "--help"])
            except SystemExit as exc:
                assert exc.code == 0, (blocked, argv, exc.code)
        assert "usage: muonlab" in out.getvalue(), (blocked, argv)
    print("ok", ",".join(blocked))
"""


def test_every_module_imports_and_every_help_prints_without_each_optional_package(tmp_path):
    sets = [EVERY, *((name,) for name in OPTIONAL)]
    code = f"BLOCKED_SETS = {sets!r}\nEVERY = {EVERY!r}\n" + IMPORT_ALL_AND_HELP
    proc = run_without((), code, tmp_path)
    done = [line.removeprefix("ok ") for line in proc.stdout.splitlines() if line.startswith("ok ")]
    assert proc.returncode == 0 and done == [",".join(s) for s in sets], (done, proc.stderr[-3000:])


def test_a_run_trains_from_token_memmaps_without_any_optional_package(tmp_path):
    from muonlab.data.memmap_format import write_token_memmap

    rng = __import__("numpy").random.default_rng(0)
    data = tmp_path / "tokens"
    for name, n in (("train.bin", 20_000), ("val.bin", 4_000)):
        write_token_memmap(data / name, rng.integers(0, 300, size=n), 300, tokenizer="test-ids")
    code = (f"from muonlab.cli import main\n"
            f"raise SystemExit(main(['train', '--preset', 'tied-cpu', '--source', 'memmap', '--path', {str(data)!r},"
            f" '--num-steps', '3', '--runs-dir', {str(tmp_path / 'runs')!r}, '--json']))\n")
    proc = run_without(EVERY, code, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["status"] == "ok" and result["summary"]["num_steps"] == 3


# a feature that needs a package: (package, the code that asks for the feature, the extra named)
CLI_FEATURES = {
    "rustbpe": (["prepare", "--preset", "cpu-tiny"], None),  # the synthetic corpus's tokenizer is trained
    "submitit": (["sweep", "--arms", "baseline", "--seeds", "1", "--preset", "cpu-tiny", "--executor", "slurm"],
                 "slurm"),
    "transformers": (["train", "--preset", "hf-cpu", "--num-steps", "1"], "hf"),
    "matplotlib": (["demo"], None),  # refused before the demo trains, not after
}
LIBRARY_FEATURES = {
    "scipy": ("from muonlab.lab.stats import t_quantile\nt_quantile(3)", None),
    "matplotlib": ("from muonlab.lab.plots import plot_forest\nplot_forest([], 'f.png', 0.0005)", None),
    "kernels": ("from muonlab.model.attention import _load_fa3\n_load_fa3((9, 0), None)", "fa3"),
    "wandb": ("from muonlab.record.sinks import parse_sinks\nparse_sinks('wandb')", "sinks"),
    "tensorboard": ("from muonlab.record.sinks import parse_sinks\nparse_sinks('tensorboard')", "sinks"),
}


def _hint(package: str, extra: str | None) -> str:
    """The install command a refusal names: the extra, or (a dependency of muonlab itself) the package."""
    return f"pip install {package}" if extra is None else f"pip install 'muonlab[{extra}]'"


def test_core_dependencies_are_dependencies_and_the_rest_extras():
    """rustbpe, matplotlib and scipy come with `pip install muonlab` (the main job needs them); the packages a
    user may lack on purpose stay extras."""
    import tomllib

    project = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["project"]
    core = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in project["dependencies"]}
    extras = {d.split(">")[0].split("<")[0].strip() for name, ds in project["optional-dependencies"].items()
              if name not in ("all", "test") for d in ds}
    for package, (distribution, extra) in OPTIONAL.items():
        assert (distribution in core) == (extra is None) and (distribution in extras) == (extra is not None), package


def test_every_optional_package_has_a_feature_that_asks_for_it():
    assert {*CLI_FEATURES, *LIBRARY_FEATURES} == set(OPTIONAL)


# Every feature case in one interpreter (a fresh one each cost ~3 s of a core for the import of torch): between cases
# muonlab and every optional package are forgotten and the case's package blocked, so each case imports muonlab
# afresh without it; each has its own cache and working folder and its output captured.
FEATURE_CASES = FORGET + """
import contextlib, io, json, os, traceback

results = {}
for case in CASES:
    forget(EVERY)
    sys.modules[case["package"]] = None
    os.environ["MUONLAB_CACHE"] = case["cache"]
    os.makedirs(case["cwd"], exist_ok=True)
    os.chdir(case["cwd"])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if "argv" in case:
                from muonlab.cli import main
                code = main(case["argv"])
            else:
                exec(case["code"], {"__name__": "feature_case"})
                code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
    results[case["id"]] = {"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}
with open(RESULTS, "w") as f:
    json.dump(results, f)
"""


def _library_probe(code: str) -> str:
    return (f"from muonlab.errors import UsageError\n"
            f"try:\n" + "".join(f"    {line}\n" for line in code.splitlines()) +
            f"except UsageError as exc:\n    print(type(exc).__name__, exc)\nelse:\n    print('no error')\n")


@pytest.fixture(scope="module")
def feature_results(tmp_path_factory) -> dict[str, dict]:
    """Each feature case's exit status, stdout and stderr, by id ("cli-PACKAGE" or "library-PACKAGE")."""
    root = tmp_path_factory.mktemp("features")
    cases = [{"id": f"cli-{package}", "package": package, "argv": argv} for package, (argv, _) in CLI_FEATURES.items()]
    cases += [{"id": f"library-{package}", "package": package, "code": _library_probe(code)}
              for package, (code, _) in LIBRARY_FEATURES.items()]
    for case in cases:
        case.update(cache=str(root / case["id"] / "cache"), cwd=str(root / case["id"]))
    results = root / "results.json"
    code = f"CASES = {cases!r}\nEVERY = {EVERY!r}\nRESULTS = {str(results)!r}\n" + FEATURE_CASES
    proc = run_without((), code, root)
    assert proc.returncode == 0 and results.is_file(), proc.stderr[-3000:]
    return {"root": root, **json.loads(results.read_text())}


@pytest.mark.parametrize("package", sorted(CLI_FEATURES))
def test_a_verb_that_needs_a_missing_package_says_what_to_install(package, feature_results):
    _, extra = CLI_FEATURES[package]
    result = feature_results[f"cli-{package}"]
    assert result["returncode"] == 2, result["stderr"][-2000:]
    lines = result["stderr"].strip().splitlines()
    assert len(lines) == 1 and _hint(package, extra) in lines[0] and package in lines[0], result["stderr"]
    runs = feature_results["root"] / f"cli-{package}" / "cache" / "runs"
    assert not runs.exists() or not any(runs.iterdir())


@pytest.mark.parametrize("package", sorted(LIBRARY_FEATURES))
def test_a_library_feature_that_needs_a_missing_package_says_what_to_install(package, feature_results):
    _, extra = LIBRARY_FEATURES[package]
    result = feature_results[f"library-{package}"]
    assert result["returncode"] == 0, result["stderr"][-2000:]
    assert _hint(package, extra) in result["stdout"] and "\n" not in result["stdout"].strip(), result["stdout"]


def test_the_suite_collects_without_the_optional_packages(tmp_path):
    # --assert=plain: what is checked is that every module imports; rewriting its asserts is most of a collection's time
    code = (f"import pytest\nraise SystemExit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', "
            f"'-p', 'no:xdist', '--assert=plain', {str(TESTS)!r}]))\n")
    proc = run_without(EVERY, code, tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "error" not in proc.stdout.lower().split("tests collected")[-1], proc.stdout[-3000:]
    assert " tests collected" in proc.stdout or " test collected" in proc.stdout, proc.stdout[-2000:]
