"""`muonlab doctor`: acceptance checks of a machine. `--gpu` (muonlab.doctor.gpu) checks every
CUDA path on one GPU within about 8 minutes and writes one JSON file.

Modules: `gpu` (the sections, their time budget, the JSON and the summary), `runs` (the short
`muonlab train` runs the throughput and preset sections start), `selection` (which presets target
a GPU, which arms stand for every method and model family in the compile check).
"""
