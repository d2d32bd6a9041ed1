#!/usr/bin/env bash
# The peers' own environment for bench/runtime/precision.py: OpenVINO and onnxruntime in
# bench/runtime/peers/.venv, never in the package's dependencies (issue 30, item 3).
#
#     bash bench/runtime/peers/setup.sh          # makes (or refreshes) the venv
#
# Versions are pinned so that two runs of the benchmark compare the same peers; move them together, and say
# which in the results you publish. Python 3.11: the newest both engines ship wheels for here.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$HERE/.venv"
PYTHON="${PYTHON:-python3.11}"

OPENVINO_VERSION=2026.4.1
ONNXRUNTIME_VERSION=1.32.0
NUMPY_VERSION=2.4.6

if ! command -v "$PYTHON" >/dev/null; then
    echo "setup.sh: $PYTHON not found; install Python 3.11 or set PYTHON=/path/to/python3.11" >&2
    exit 1
fi
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet \
    "openvino==$OPENVINO_VERSION" "onnxruntime==$ONNXRUNTIME_VERSION" "numpy==$NUMPY_VERSION"
"$VENV/bin/python" -c "import numpy, onnxruntime, openvino; \
print('peers:', 'openvino', openvino.__version__, 'onnxruntime', onnxruntime.__version__, 'numpy', numpy.__version__)"
