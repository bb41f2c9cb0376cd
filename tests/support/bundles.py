"""Where the upstream reference bundles are: shipped with the project, and shared beside the checkout."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# shared/ sits beside the checkout (../shared), as laid out for sessions and CI
SHARED_REFERENCE = REPO.parent / "shared" / "reference"

# Upstream reference bundles. The small ones in tests/golden ship with the project (recorded by
# tests/golden/record_upstream_bundles.py from upstream's own train.py) and are always tested, so a
# missing one fails instead of skipping; the larger shared ones are added where ../shared exists.
PRECISIONS = ("fp32", "bf16")
SHIPPED_BUNDLES = {p: REPO / "tests" / "golden" / f"upstream_d2e32_{p}.pt" for p in PRECISIONS}
SHARED_BUNDLES = {p: SHARED_REFERENCE / f"autoresearch_d2_{p}.pt" for p in PRECISIONS}


def reference_bundles(precision: str) -> list[Path]:
    shared = SHARED_BUNDLES[precision]
    return [SHIPPED_BUNDLES[precision]] + ([shared] if shared.exists() else [])
