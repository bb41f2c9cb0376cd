"""muonlab: controlled small-scale LLM pretraining research with the Muon optimizer family."""

from muonlab.version import __version__  # noqa: F401  (the package's version)


def load_run(run_dir, step=None, device="cpu", vocab_size=None):
    """A finished run's model with its final weights, or those of the checkpoint after `step` steps
    (muonlab.train.load). Imported here on first use, so `import muonlab` stays light."""
    from muonlab.train.load import load_run as load  # noqa: PLC0415

    return load(run_dir, step=step, device=device, vocab_size=vocab_size)
