"""Error types that the CLI turns into one clear line and an exit status.

`UsageError` (exit 2) is for input the user can fix before running: unknown options,
impossible shapes, missing files. `MuonlabError` (exit 1) is for failures at run time:
a corrupted shard, an interrupted download, a diverged run; `CorruptInput` (exit 1) is every
damaged file, in one class.
"""


class MuonlabError(Exception):
    """A runtime failure; the CLI prints `error: <message>` and exits 1."""

    exit_code = 1


class CorruptInput(MuonlabError):
    """A file that exists but cannot be read as what it claims to be (damaged weights, a truncated array or
    archive, a malformed ledger line, a corrupted shard): exit 1, the message naming the file and what to do."""


class UsageError(MuonlabError):
    """Bad input or configuration; the CLI prints `error: <message>` and exits 2."""

    exit_code = 2
