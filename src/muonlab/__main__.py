from muonlab.cli import main
from muonlab.train.distributed import exit_rank, launched_as_rank

code = main()
if launched_as_rank():  # a rank of a multi-process run ends without interpreter finalization (exit_rank says why)
    exit_rank(int(code or 0))
raise SystemExit(code)
