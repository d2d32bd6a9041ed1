"""Where onnxruntime is not the exact oracle of ONNX's integer ops.

On an x86 CPU with AVX2 but no VNNI (nor AMX), onnxruntime's u8·s8 integer kernels (QLinearConv, QLinearMatMul,
MatMulInteger, and the fused QDQ kernels built on them) sum pairs of products in int16 with saturation
(``vpmaddubsw``): MatMulInteger of uint8 255s and int8 127s is then not the integer product
(``tests/quant/test_ort_oracle.py`` shows it). The tests that compare our integer kernels with onnxruntime bit for bit
skip those cases there; on every other CPU they run. Our kernels' exactness is tested against the reference
executor and numpy everywhere.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH_RUNTIME = Path(__file__).resolve().parents[1] / "bench" / "runtime"


def bench_runtime(name: str) -> ModuleType:
    """``bench/runtime/<name>.py``, imported as its scripts import each other (bench is no package: the folder on the
    path while it loads, so its own imports of sibling modules resolve)."""
    sys.path.insert(0, str(BENCH_RUNTIME))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH_RUNTIME))


def bench_qdq() -> ModuleType:
    """``bench/runtime/qdq.py``: its ``ort_int8_saturates`` is what the benchmark says."""
    return bench_runtime("qdq")


#: onnxruntime's u8·s8 integer kernels saturate on this CPU
U8S8_SATURATES = bench_qdq().ort_int8_saturates()


def skip_if_u8s8_saturates(a_dtype: str = "uint8", b_dtype: str = "int8") -> None:
    """Skip a comparison with onnxruntime's integer kernels where its uint8 x int8 products saturate here."""
    if U8S8_SATURATES and (a_dtype, b_dtype) == ("uint8", "int8"):
        pytest.skip("onnxruntime's uint8 x int8 kernels saturate int16 pairs on this x86 CPU without VNNI "
                    "(vpmaddubsw): not the exact oracle here (tests/quant/test_ort_oracle.py)")
