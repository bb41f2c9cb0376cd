"""Experiment report from a run ledger (`muonlab report`): one study per protocol, each with
per-arm mean ± SD, paired contrasts against a baseline arm with 95% t-intervals, p-values and a
preregistered decision, requested contrasts (differences-of-differences, retention ratios,
single-seed decisions), failed runs, protocol warnings, plots; and contrasts across protocols.

One job per module, in the order the data flows: `loading` (ledger lines -> records, run
directories -> curves), `selection` (--where), `protocol` (recorded settings, consistency
checks), `grouping` (records -> protocols), `requests` (the asked-for contrasts), `study` (one
protocol's statistics), `across` (one contrast in two protocols), `analysis` (the whole
ledger), `render` (Markdown), `text` (terminal), `output` (report.json, report.md, plots) and
`build` (the verb's entry: analyse, then write).
"""

from muonlab.lab.report.analysis import DEFAULT_THRESHOLD, analyse
from muonlab.lab.report.build import build_report, run_report
from muonlab.lab.report.loading import load_ledger
from muonlab.lab.report.output import write_report
from muonlab.lab.report.render import render_markdown
from muonlab.lab.report.text import format_text

__all__ = ["DEFAULT_THRESHOLD", "analyse", "build_report", "format_text", "load_ledger", "render_markdown",
           "run_report", "write_report"]
