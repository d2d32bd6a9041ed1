"""Where onnxruntime is not the exact oracle of ONNX's integer ops.

On an x86 CPU with AVX2 but no VNNI (nor AMX), onnxruntime's u8·s8 integer kernels (QLinearConv, QLinearMatMul,
MatMulInteger, and the fused QDQ kernels built on them) sum pairs of products in int16 with saturation
(``vpmaddubsw``): MatMulInteger of uint8 255s and int8 127s is then not the integer product
(``tests/quant/test_ort_oracle.py`` shows it). The tests that compare our integer kernels with onnxruntime bit for bit
skip those cases there; on every other CPU they run. Our kernels' exactness is tested against the reference
executor and numpy everywhere.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def bench_qdq():
    """``bench/runtime/qdq.py`` by path (bench is no package): its ``ort_int8_saturates`` is what the benchmark says."""
    path = Path(__file__).resolve().parents[1] / "bench" / "runtime" / "qdq.py"
    spec = importlib.util.spec_from_file_location("bench_runtime_qdq", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: onnxruntime's u8·s8 integer kernels saturate on this CPU
U8S8_SATURATES = bench_qdq().ort_int8_saturates()


def skip_if_u8s8_saturates(a_dtype: str = "uint8", b_dtype: str = "int8") -> None:
    """Skip a comparison with onnxruntime's integer kernels where its uint8 x int8 products saturate here."""
    if U8S8_SATURATES and (a_dtype, b_dtype) == ("uint8", "int8"):
        pytest.skip("onnxruntime's uint8 x int8 kernels saturate int16 pairs on this x86 CPU without VNNI "
                    "(vpmaddubsw): not the exact oracle here (tests/quant/test_ort_oracle.py)")
