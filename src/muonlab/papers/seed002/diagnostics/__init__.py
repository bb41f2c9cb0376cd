"""The seed 002 diagnostics: one `muonlab diagnose` tool per module (its COMMAND), listed in the
pack's DIAGNOSTICS; they run on the shared harness of muonlab.diagnostics."""
