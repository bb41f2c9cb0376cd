"""The seed papers, one pack each (`papers/<seed>/`): its arms (`arms.py`, registered with muonlab.arms.register
as a plug-in registers its own), its printed tables (`tables.json`, read by muonlab.lab.paper), the numbers it
prints that its diagnostics show beside their own (`printed.py`), and its diagnostics (`diagnostics/`, one
`muonlab diagnose` tool per module, on the shared harness of muonlab.diagnostics).

A pack registers itself (muonlab.arms.register_pack) in its `__init__`; muonlab.arms imports the built-in
packs (its BUILTIN_PAPER_PACKS) by name when it is first imported. A new paper is a new pack: its folder and
its name in that list (or, outside the package, a plug-in that registers a PaperPack).
"""
