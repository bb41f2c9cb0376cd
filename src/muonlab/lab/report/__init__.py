"""Experiment report from a run ledger (`muonlab report`): per-arm mean ± SD, paired contrasts
against a baseline arm with 95% t-intervals and a preregistered decision, failed runs, protocol
warnings, plots.

One job per module, in the order the data flows: `loading` (ledger lines -> records, run
directories -> curves), `protocol` (do the compared runs share one protocol?), `analysis`
(grouping, per-arm statistics, contrasts, decisions), `render` (Markdown and terminal text),
`output` (report.json, report.md, plots) and `build` (the verb's entry: analyse, then write).
"""

from muonlab.lab.report.analysis import DEFAULT_THRESHOLD, analyse
from muonlab.lab.report.build import build_report, run_report
from muonlab.lab.report.loading import load_ledger
from muonlab.lab.report.output import write_report
from muonlab.lab.report.render import format_text, render_markdown

__all__ = ["DEFAULT_THRESHOLD", "analyse", "build_report", "format_text", "load_ledger", "render_markdown",
           "run_report", "write_report"]
