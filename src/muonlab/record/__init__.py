"""The run record, below training: run directories, the ledger with provenance, metric sinks and
the results.tsv export. Training writes it; the lab and diagnostics read it; it imports neither."""
