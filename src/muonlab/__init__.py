"""muonlab: controlled small-scale LLM pretraining research with the Muon optimizer family."""

__version__ = "0.1.0"
