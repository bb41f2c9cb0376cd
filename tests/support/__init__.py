"""Helpers shared by several test modules (plain modules: no test module imports another)."""
