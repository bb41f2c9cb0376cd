"""The experiment lab: arms x seeds sweeps, paired statistics and reports with plots, over the run
record (`muonlab.record`: ledger, provenance, results.tsv, metric sinks)."""
