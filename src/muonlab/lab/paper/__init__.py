"""`muonlab paper`: the seed papers' tables as data, and a scorecard of a ledger's runs against them."""

from muonlab.lab.paper.scorecard import format_scorecard, score_table, scorecard
from muonlab.lab.paper.tables import PaperTable, load_tables, select_tables

__all__ = ["PaperTable", "format_scorecard", "load_tables", "score_table", "scorecard", "select_tables"]
