#!/usr/bin/env bash
# Make bench/llm/llamacpp/.venv: llama-cpp-python built from its PyPI source distribution for this CPU
# (GGML_NATIVE: the peer gets every ISA extension this machine has, as a user building it here would),
# plus what llama.cpp's convert_hf_to_gguf.py needs (torch CPU, transformers, sentencepiece, its own gguf-py).
# The sdist is kept unpacked in .build/ because the converter and gguf-py live in its vendor/llama.cpp tree.
# Its own venv, so the toolkit's .venv never sees llama.cpp's pins. Takes ~10 minutes on 2 vCPUs. Safe to rerun.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# torch first and pinned: the CPU build the toolkit uses; an unpinned one would pull the CUDA packages.
.venv/bin/python -m pip install --quiet "torch==2.13.0" "numpy>=2" "sentencepiece>=0.1.98,<0.3.0" \
    "transformers>=4.57,<6" tokenizers "protobuf>=4.21,<5" safetensors
mkdir -p .build
SRC=.build/llama_cpp_python-$VERSION
if [ ! -d "$SRC" ]; then
    .venv/bin/python -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d .build
    tar xzf ".build/llama_cpp_python-$VERSION.tar.gz" -C .build
fi
# The converter's gguf-py (matching its tensor names and types) as the venv's gguf package.
.venv/bin/python -m pip install --quiet "$SRC/vendor/llama.cpp/gguf-py"
if ! .venv/bin/python -c "import llama_cpp" 2>/dev/null; then
    # LLAVA_BUILD off: the multimodal library is not measured and costs build minutes.
    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF ${CMAKE_ARGS:-}" CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-2} \
        .venv/bin/python -m pip install --verbose --no-cache-dir "$SRC" > .build/build.log 2>&1 \
        || { tail -40 .build/build.log; echo "llama-cpp-python build failed: full log in .build/build.log"; exit 1; }
fi
ln -sfn "llama_cpp_python-$VERSION/vendor/llama.cpp" .build/llama.cpp
echo "set up .venv: $(.venv/bin/python -c 'import llama_cpp, torch, transformers; print("llama_cpp", llama_cpp.__version__, "torch", torch.__version__, "transformers", transformers.__version__)')"
