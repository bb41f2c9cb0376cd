"""The experiment lab: arms x seeds sweeps, the run ledger with provenance, paired statistics,
reports with plots, results.tsv export and optional metric sinks."""
