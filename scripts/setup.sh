#!/usr/bin/env bash
# Set up a virtual environment in .venv with everything the toolkit and its tests need.
# torch is pinned first to the CPU build (2.13.0): an unpinned torch would pull several GB of
# CUDA packages. Everything else then resolves against it. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[test]"
echo "set up .venv: $(.venv/bin/python -c 'import torch, torch_ir; print("torch", torch.__version__, "torch_ir", torch_ir.__version__)')"
