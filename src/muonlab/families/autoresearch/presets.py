"""Protocol presets of the autoresearch family (dotted keys of the run config)."""

from __future__ import annotations

_PROTOCOL = {  # seed papers' protocol (seed 002 §2.2; seed 000 §4): T 2048, vocab 8192, 64 x 4 = 524,288 tokens/step
    "train.sequence_len": 2048, "train.device_batch_size": 64, "train.total_batch_size": 2**19,
    "train.num_steps": 953, "train.eval_tokens": 40 * 2**19, "schedule.warmup_ratio": 0.0,
    "record.checkpoint_every": 200, "data.source": "climbmix", "data.vocab_size": 8192,
}
# the CPU presets stay on the CPU on a GPU machine too: their numbers (the tests' bitwise checks)
# and the world sizes they run at (2 gloo ranks) must not depend on the GPUs there
_CPU_SMALL = {"runtime.device": "cpu", "runtime.precision": "fp32", "runtime.compile": "off",
              "record.log_every": 1}

PRESETS = {
    # depth 8, 953 fixed steps, zero warmup, ClimbMix (50,332,176 scaling parameters)
    "gpu-d8": {**_PROTOCOL, "model.depth": 8},
    # the same protocol at depth 6 (26,345,772 scaling parameters)
    "gpu-d6": {**_PROTOCOL, "model.depth": 6},
    # upstream autoresearch as published: 5-minute budget, device batch 128
    "upstream": {**_PROTOCOL, "model.depth": 8, "train.device_batch_size": 128, "train.num_steps": None,
                 "train.time_budget": 300.0},
    # the CPU demo: embedded stdlib corpus, 2 layers x 128 wide (upstream's aspect ratio 64, head dim 64),
    # T 256, vocab 2048, 650 steps of 4,096 tokens. At a fixed ~4 minutes on 2 cores, many steps of a small
    # model beat few of a large one (holdout BPB / xz: 4 x 256 for 200 steps 0.88, 4 x 128 for 390 steps
    # 0.82, 3 x 128 for 500 steps 0.79, this 0.78; batch 32 at 4 x 128 for 220 steps 0.83). stdlib files
    # are ~2,600 tokens long, so they are cut at line breaks into pieces that fit a 257-token row (or
    # best-fit packing would drop all but each file's head)
    "cpu-demo": {"model.depth": 2, "model.aspect_ratio": 64, "model.head_dim": 64, "train.sequence_len": 256,
                 "train.device_batch_size": 16, "train.total_batch_size": 16 * 256, "train.num_steps": 650,
                 "train.untimed_steps": 2, "optim.muon_momentum_warmup_steps": 150, "train.eval_tokens": 2**17,
                 **_CPU_SMALL, "record.log_every": 10, "data.source": "stdlib", "data.vocab_size": 2048,
                 "data.max_doc_chars": 768},
    # a seconds-long configuration for tests and smoke checks
    "cpu-tiny": {"model.depth": 2, "model.aspect_ratio": 32, "model.head_dim": 32, "train.sequence_len": 64,
                 "train.device_batch_size": 4, "train.total_batch_size": 4 * 64 * 2, "train.num_steps": 12,
                 "train.untimed_steps": 1, "optim.muon_momentum_warmup_steps": 10, "train.eval_tokens": 4 * 64 * 4,
                 **_CPU_SMALL, "data.source": "synthetic", "data.vocab_size": 300, "data.synthetic_bytes": 200_000},
}
