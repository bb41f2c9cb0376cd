"""The experiment lab: ledger, provenance (and, later, arms, sweeps, statistics, reports)."""
