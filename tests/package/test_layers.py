"""The layer order of docs/design.md ("Shape of the code"): imports point down, never up.

The order is the import-linter `layers` contract in pyproject.toml (`lint-imports` checks the
same); these tests check it over muonlab's real import graph, lazy imports inside functions
included, and show that it catches an upward import, an unplaced top-level module and a
stale exception.
"""

from __future__ import annotations

from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp", reason="the layer tests need grimp (pip install 'muonlab[test]')")
pytest.importorskip("importlinter", reason="the layer tests need import-linter (pip install 'muonlab[test]')")
from importlinter import api  # noqa: E402
from importlinter.contracts.layers import LayersContract  # noqa: E402
from importlinter.domain.helpers import MissingImport  # noqa: E402

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def layers_contract(**extra) -> LayersContract:
    config = api.read_configuration(str(PYPROJECT))
    (options,) = [c for c in config["contracts_options"] if c["id"] == "layers"]
    return LayersContract(name=options["name"], session_options=config["session_options"],
                          contract_options={**options, **extra})


def import_graph() -> grimp.ImportGraph:
    return grimp.build_graph("muonlab", cache_dir=None)


def violations(check) -> list[str]:
    """One line per illegal import: 'importer -> imported (line N)'."""
    lines = []
    for dependency in check.metadata["invalid_dependencies"]:
        for route in dependency["routes"]:
            for link in route["chain"]:
                where = ", ".join(map(str, link["line_numbers"]))
                lines.append(f"{link['importer']} -> {link['imported']} (line {where})")
    return lines + [f"{m} is in no layer" for m in check.metadata["undeclared_modules"]]


def test_imports_follow_the_layers():
    check = layers_contract().check(import_graph(), verbose=False)
    assert check.kept, "imports against the layer order:\n" + "\n".join(violations(check))
    # and without exceptions: pyproject.toml names no import that may point up
    config = api.read_configuration(str(PYPROJECT))
    (options,) = [c for c in config["contracts_options"] if c["id"] == "layers"]
    assert "ignore_imports" not in options and check.ignored_import_count == 0


@pytest.mark.parametrize("importer, imported", [
    ("muonlab.record.ledger", "muonlab.lab.stats"),  # the record below the lab
    ("muonlab.train.run", "muonlab.lab.sweep"),  # the train <-> lab cycle this layout removed
    ("muonlab.record.rundir", "muonlab.train.checkpoint"),
    ("muonlab.optim.muon_adamw", "muonlab.model.gpt"),  # the optimizer works on any model
    ("muonlab.data.store", "muonlab.config"),
    ("muonlab.lab.sweep", "muonlab.diagnostics.runs"),  # only the CLI imports diagnostics
    ("muonlab.errors", "muonlab.device"),
    ("muonlab.lab.sweep", "muonlab.demo"),  # siblings of one layer stay independent
])
def test_an_upward_import_breaks_the_contract(importer, imported):
    graph = import_graph()
    graph.add_import(importer=importer, imported=imported, line_number=1, line_contents=f"import {imported}")
    check = layers_contract().check(graph, verbose=False)
    assert not check.kept
    assert f"{importer} -> {imported} (line 1)" in violations(check)


def test_a_new_top_level_module_must_be_placed_in_a_layer():
    graph = import_graph()
    graph.add_module("muonlab.unplaced")
    check = layers_contract().check(graph, verbose=False)
    assert not check.kept
    assert violations(check) == ["muonlab.unplaced is in no layer"]


def test_an_exception_that_matches_no_import_fails_the_check():
    """Were an exception added, it must name an import that exists (the record's old one does not)."""
    contract = layers_contract(ignore_imports=["muonlab.record.rundir -> muonlab.config"])
    with pytest.raises(MissingImport, match="muonlab.record.rundir -> muonlab.config"):
        contract.check(import_graph(), verbose=False)
