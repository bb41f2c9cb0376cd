"""`python -m muonlab.cli`, as `muonlab` (and `python -m muonlab`); importing it runs nothing."""

from muonlab.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
