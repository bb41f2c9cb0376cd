#!/usr/bin/env bash
# The GPU acceptance check from a checkout, on a GPU node's own PyTorch image, offline.
#
#   benchmarks/gpu_acceptance.sh OUTDIR [OPTION ...]
#                                              run it: OUTDIR/gpu_check.json and OUTDIR/gpu_check.log; the
#                                              options go to `muonlab doctor --gpu` (a partial rerun:
#                                              --skip pytest,throughput, --budget-s 200, ...)
#   benchmarks/gpu_acceptance.sh --plan        the sections and their time limits (no GPU needed)
#   benchmarks/gpu_acceptance.sh --fetch-wheels [DIR]
#                                              where the package index is reachable: download the
#                                              wheels a GPU image lacks into DIR (default wheels/gpu)
#
# Nothing of the project is installed: the image's Python and torch import muonlab from src/
# (PYTHONPATH). The few packages such an image lacks (rustbpe, which trains the runs' tokenizer)
# come as wheels in MUONLAB_WHEELS (default: wheels/gpu in the checkout), installed with
# `pip --no-index --no-deps --target` into a temporary folder removed at exit. PYTHON names the
# interpreter (default python3). The check's sections fit in 8 minutes (`--plan`), within the
# 8.5 minutes this script may take; without a CUDA device it says so in one line and exits 0.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WHEELS="${MUONLAB_WHEELS:-$ROOT/wheels/gpu}"
# the wheels a GPU image commonly lacks, at the versions requirements/lock.txt holds
FETCHED=(rustbpe)

usage() {
    echo "usage: $0 OUTDIR [doctor option ...] | --plan | --fetch-wheels [DIR]" >&2
    exit 2
}

export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"

case "${1:-}" in
    --plan)
        [ $# -eq 1 ] || usage
        exec "$PYTHON" -m muonlab doctor --gpu --plan
        ;;
    --fetch-wheels)
        [ $# -le 2 ] || usage
        dest="${2:-$ROOT/wheels/gpu}"
        mkdir -p "$dest"
        pins=()
        for name in "${FETCHED[@]}"; do
            pin="$(grep -i "^$name==" "$ROOT/requirements/lock.txt")" || { echo "error: $name is not in requirements/lock.txt" >&2; exit 1; }
            pins+=("$pin")
        done
        # CPython 3.12 on x86-64 Linux: the GPU images' interpreter (PYTHON_VERSION to change it)
        exec "$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version "${PYTHON_VERSION:-3.12}" \
            --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 -d "$dest" "${pins[@]}"
        ;;
    ""|-*)
        usage
        ;;
esac
OUTDIR="$1"
shift  # what follows goes to `muonlab doctor --gpu`

if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)' 2>/dev/null; then
    echo "no CUDA device found: the GPU acceptance check ran nothing and wrote nothing"
    exit 0
fi

mkdir -p "$OUTDIR"
SITE="$(mktemp -d "${TMPDIR:-/tmp}/muonlab-gpu-site.XXXXXX")"
trap 'rm -rf "$SITE"' EXIT
shopt -s nullglob
wheels=("$WHEELS"/*.whl)
if [ ${#wheels[@]} -gt 0 ]; then
    "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "${wheels[@]}"
    export PYTHONPATH="$PYTHONPATH:$SITE"  # after src/ and the image's own: only what is missing comes from here
fi
if ! "$PYTHON" -c 'import rustbpe' 2>/dev/null; then
    echo "warning: rustbpe is neither in this Python nor in $WHEELS: the runs that train a tokenizer will fail" \
         "($0 --fetch-wheels, where the package index is reachable)" >&2
fi

set +e
"$PYTHON" -m muonlab doctor --gpu --out "$OUTDIR/gpu_check.json" "$@" 2>&1 | tee "$OUTDIR/gpu_check.log"
status=${PIPESTATUS[0]}
exit "$status"
