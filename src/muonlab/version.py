"""muonlab's version, in a module of its own: records read it without importing the package's root
(whose `load_run` reaches up to the training layer)."""

__version__ = "0.1.0"
