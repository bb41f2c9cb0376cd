"""The start-up of the warm-start fork server (muonlab.lab.warm_start preloads it; nothing else imports it): what a
`muonlab train` imports, imported once here, then the server's objects frozen out of the garbage collector.

A run forked from the server then imports no module of muonlab and no package it had not (tests/lab/test_warm_start.py).
The freeze: without it a forked run's first `gc.collect()` (train.loop, at step 0, as upstream) walks every object
it inherited (about 290,000: torch and muonlab) and writes to each one's header, so the fork copies those pages
too; `gc.freeze()` before forking is what Python's gc documentation advises a forking server for that reason.
"""

import gc

import muonlab.cli.context  # noqa: F401  (what a run imports once its command line is read)
import muonlab.config.plugin_code  # noqa: F401
import muonlab.data.loaders  # noqa: F401
import muonlab.data.prepare  # noqa: F401
import muonlab.families  # noqa: F401
import muonlab.lab.request  # noqa: F401
import muonlab.optim.step0  # noqa: F401
import muonlab.record.ledger  # noqa: F401
import muonlab.record.rundir  # noqa: F401
import muonlab.train.loop  # noqa: F401
import muonlab.train.run  # noqa: F401
from muonlab.cli.parser import VERBS, verb_module

for _verb in VERBS:  # the parser imports every verb's module (cli.parser.build_parser)
    verb_module(_verb)
gc.collect()
gc.freeze()
