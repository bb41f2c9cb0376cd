"""The suite's own rules: no test module imports another (shared helpers live in tests/support,
fixtures in conftest.py)."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_test_module_imports_another():
    test_modules = {p.stem for p in TESTS.glob("test_*.py")} | {"conftest"}
    offenders = {p.name: sorted(_imported_modules(p) & test_modules)
                 for p in sorted(TESTS.glob("test_*.py")) if _imported_modules(p) & test_modules}
    support = {p.name: sorted(_imported_modules(p) & test_modules) for p in (TESTS / "support").glob("*.py")
               if _imported_modules(p) & test_modules}
    assert not offenders and not support, {**offenders, **support}
