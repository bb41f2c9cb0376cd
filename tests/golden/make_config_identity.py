"""Record every registered arm x preset's identity: its config hash and protocol id (or "refused" where the
arm cannot run under that preset), and the flag table (flag -> dotted key). The guard of a restructuring:
moving code must not move a run's identity, so a ledger written before it still resolves to the same runs.

    python tests/golden/make_config_identity.py          # (re)write config_identity.json
    python tests/golden/make_config_identity.py --check  # print what differs, exit 1 if anything does

An intended change is recorded again with the commit that makes it, naming the arms it moves.
Arguments-free and machine-independent: hashes are of the resolved settings, not of numbers a run makes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

GOLDEN = Path(__file__).with_name("config_identity.json")


def identity() -> dict[str, dict[str, str]]:
    from muonlab.arms import ARMS, resolve_config
    from muonlab.config import all_presets, flag_table
    from muonlab.errors import UsageError

    runs = {}
    for arm in sorted(ARMS):
        for preset in sorted(all_presets()):
            try:
                cfg = resolve_config(arm, preset)
            except UsageError:
                runs[f"{arm}|{preset}"] = "refused"
                continue
            runs[f"{arm}|{preset}"] = f"{cfg.config_hash()}|{cfg.protocol_id()}"
    return {"runs": runs, "flags": dict(sorted(flag_table().items()))}


def differences(recorded: dict, now: dict) -> list[str]:
    out = []
    for part in ("runs", "flags"):
        for key in sorted(set(recorded[part]) | set(now[part])):
            if recorded[part].get(key) != now[part].get(key):
                out.append(f"{part} {key}: {recorded[part].get(key)} -> {now[part].get(key)}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    now = identity()
    if args.check:
        diff = differences(json.loads(GOLDEN.read_text()), now)
        print("\n".join(diff) or "every arm x preset identity and flag unchanged")
        return 1 if diff else 0
    GOLDEN.write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v, indent=0, sort_keys=True)}"
                                         for k, v in now.items()) + "\n}\n")
    print(f"wrote {GOLDEN}: {len(now['runs'])} arm x preset identities, {len(now['flags'])} flags")
    return 0


if __name__ == "__main__":
    sys.exit(main())
