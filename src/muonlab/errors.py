"""Error types that the CLI turns into one clear line and an exit status.

`UsageError` (exit 2) is for input the user can fix before running: unknown options,
impossible shapes, missing files. `MuonlabError` (exit 1) is for failures at run time:
a corrupted shard, an interrupted download, a diverged run.
"""


class MuonlabError(Exception):
    """A runtime failure; the CLI prints `error: <message>` and exits 1."""

    exit_code = 1


class UsageError(MuonlabError):
    """Bad input or configuration; the CLI prints `error: <message>` and exits 2."""

    exit_code = 2
