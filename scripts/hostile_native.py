"""Hostile corpus, second pass: native ATen kernels that trust their index, size or stride arguments.

Each IR is one node over a graph input ``x`` and, where the op needs indices, an int64 weight holding the hostile
values (its own ``.safetensors`` beside the IR). Before the allow-list, these wrote the heap
(``max_pool2d_with_indices_backward`` with an index one past its buffer), copied process memory into outputs
(``_reshape_alias`` past its storage, ``empty``), or read outside their inputs (``segment_reduce(unsafe=True)``).
Now each is refused by name (not on the list), refused by its guard, or (``empty``) runs and gives zeros; the
allowed ops that look unsafe by name (``_unsafe_masked_index_put_accumulate``, ``fractional_max_pool2d`` with
samples outside [0, 1)) run: their kernels keep inside their inputs. The programs are the same ops as host
dispatches of a ``.npubin``, refused before anything runs.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from make_hostile_corpus import BASE_INPUT, BASE_WEIGHTS, Case, CliCall, _Builder, decode_npubin_parts, npubin_bytes

UNSAFE = "UnsafeInputError"
NOT_LISTED = r"allow-list"


def _run_ir(case: Case, d: Path) -> None:
    """The IR through the reference executor, its inputs seeded (the hostile values are in its weights)."""
    import torch

    import torch_ir

    ir = torch_ir.load_ir(d / case.file)
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn([int(s) for s in t.shape], generator=gen) for t in ir.graph_inputs]
    weights = d / case.weights if (d / case.weights).exists() else {}
    outputs = torch_ir.IRExecutor(ir, weights).run(inputs)
    if case.id == "nat_empty_is_zeros":  # runs, and must not hand out uninitialized memory
        assert all(bool((o == 0).all()) for o in outputs), "aten.empty gave memory that is not zeroed"


def _run_program(case: Case, d: Path) -> None:
    import numpy as np

    from npu_compiler.compiled_program import CompiledProgram
    from npu_runtime import Device, Executor, load_weights

    program = CompiledProgram.load(d / case.file)
    device = Device()
    x = np.load(d / BASE_INPUT)
    Executor(program, device).run({"x": x}, weights=load_weights(d / BASE_WEIGHTS, program, device))


API: dict[str, Callable[[Case, Path], None]] = {"native.ir": _run_ir, "native.program": _run_program}


def _tensor(name: str, shape: list[int], dtype: str, role: str) -> dict[str, Any]:
    return {"name": name, "shape": shape, "dtype": dtype, "role": role}


def _ir(op: str, attrs: dict[str, Any], inputs: list[dict[str, Any]], out_shape: list[int],
        extra_outputs: list[dict[str, Any]] = ()) -> dict[str, Any]:
    outs = [_tensor("y", out_shape, "float32", "output"), *extra_outputs]
    weights = [t for t in inputs if t["role"] == "weight"]
    return {"format": "torch_ir", "ir_version": "1.0", "model_name": "native", "producer": {},
            "graph_inputs": [t for t in inputs if t["role"] == "input"], "graph_outputs": outs,
            "weights": weights, "weight_name_mapping": {t["name"]: t["name"] for t in weights},
            "nodes": [{"name": "n0", "op_type": op, "inputs": inputs, "outputs": outs, "attrs": attrs}]}


def _add_ir(b: _Builder, cid: str, description: str, doc: dict[str, Any], weights: dict[str, Any] | None,
            error: str | None, message: str, cli: bool = True) -> None:
    from safetensors.numpy import save_file

    base_doc = json.loads(b.path("tiny.json").read_text())
    doc["format"], doc["ir_version"] = base_doc["format"], base_doc["ir_version"]
    file = b.write_ir(f"{cid}.json", doc)
    weights_file = f"{cid}.safetensors"
    if weights:
        save_file(weights, str(b.path(weights_file)))
    # compile exits 1 when it refuses a model's ops
    calls = [CliCall(["compile", "{dir}/" + file, "--fallback", "cpu", "-o", "out.npubin"], 1)] if cli else []
    b.add(Case(cid, "native_op", description, [file], "native.ir", error, message, calls, isolate=True,
               weights=weights_file))


def _pool_backward_cases(b: _Builder) -> None:
    import numpy as np

    def idx(shape: list[int], value: int) -> dict[str, Any]:
        return {"idx": np.full(shape, value, dtype=np.int64)}

    x4, g4 = _tensor("x", [1, 1, 4, 4], "float32", "input"), _tensor("go", [1, 1, 2, 2], "float32", "input")
    i4 = _tensor("idx", [1, 1, 2, 2], "int64", "weight")
    pool = {"kernel_size": [2, 2], "stride": [2, 2], "padding": [0, 0], "dilation": [1, 1], "ceil_mode": False}
    _add_ir(b, "nat_maxpool2d_backward", "max_pool2d_with_indices_backward with an index one past its buffer",
            _ir("aten.max_pool2d_with_indices_backward.default", pool, [g4, x4, i4], [1, 1, 4, 4]),
            idx([1, 1, 2, 2], 16),
            UNSAFE, r"max_pool2d_with_indices_backward.*(refused|allow-list)")
    _add_ir(b, "nat_adaptive_maxpool2d_backward", "adaptive_max_pool2d_backward with indices far past the input",
            _ir("aten.adaptive_max_pool2d_backward.default", {}, [g4, x4, i4], [1, 1, 4, 4]),
            idx([1, 1, 2, 2], 1 << 40), UNSAFE, NOT_LISTED)
    x5, g5 = _tensor("x", [1, 1, 4, 4, 4], "float32", "input"), _tensor("go", [1, 1, 2, 2, 2], "float32", "input")
    i5 = _tensor("idx", [1, 1, 2, 2, 2], "int64", "weight")
    pool3 = {"kernel_size": [2, 2, 2], "stride": [2, 2, 2], "padding": [0, 0, 0], "dilation": [1, 1, 1],
             "ceil_mode": False}
    _add_ir(b, "nat_maxpool3d_backward", "max_pool3d_with_indices_backward with a negative index",
            _ir("aten.max_pool3d_with_indices_backward.default", pool3, [g5, x5, i5], [1, 1, 4, 4, 4]),
            idx([1, 1, 2, 2, 2], -5), UNSAFE, r"refused|allow-list")
    grad = _tensor("go", [2, 3], "float32", "input")
    ints = [_tensor(n, [2], "int64", "weight") for n in ("indices", "offset2bag", "bag_size", "maximum_indices")]
    weights = {n: np.array([1 << 40, -(1 << 40)], dtype=np.int64) for n in
               ("indices", "offset2bag", "bag_size", "maximum_indices")}
    _add_ir(b, "nat_embedding_bag_dense_backward", "_embedding_bag_dense_backward with indices past the table",
            _ir("aten._embedding_bag_dense_backward.default", {"num_weights": 4, "scale_grad_by_freq": False,
                                                                "mode": 0, "per_sample_weights": None},
                [grad, *ints], [4, 3]), weights, UNSAFE, NOT_LISTED)


def _leak_cases(b: _Builder) -> None:
    import numpy as np

    x = _tensor("x", [4], "float32", "input")
    _add_ir(b, "nat_reshape_alias_leak", "_reshape_alias viewing 4096 elements of a 4-element input (heap leak)",
            _ir("aten._reshape_alias.default", {"size": [4096], "stride": [1]}, [x], [4096]), None, UNSAFE,
            NOT_LISTED)
    _add_ir(b, "nat_as_strided_past_storage", "as_strided past its input's storage",
            _ir("aten.as_strided.default", {"size": [4096], "stride": [1], "storage_offset": None}, [x], [4096]),
            None, "TorchIRError", r"storage|outside", cli=False)
    _add_ir(b, "nat_as_strided_negative_stride", "as_strided with a negative stride reaching before its input",
            _ir("aten.as_strided.default", {"size": [4], "stride": [-1000], "storage_offset": 3}, [x], [4]),
            None, "TorchIRError", r"negative|stride", cli=False)
    _add_ir(b, "nat_empty_is_zeros", "aten.empty as an output: runs, and gives zeros, not process memory",
            _ir("aten.empty.memory_format", {"size": [1024], "dtype": None, "layout": None, "device": None,
                                             "pin_memory": None, "memory_format": None}, [], [1024]),
            None, None, "", cli=False)
    lengths = _tensor("lengths", [2], "int64", "weight")
    _add_ir(b, "nat_segment_reduce_unsafe", "segment_reduce(unsafe=True) with lengths far past its data",
            _ir("aten.segment_reduce.default", {"reduce": "sum", "indices": None, "offsets": None, "axis": 0,
                                                "unsafe": True, "initial": None}, [x, lengths], [2]),
            {"lengths": np.array([1 << 20, 3], dtype=np.int64)}, "TorchIRError", r"segment|length", cli=False)
    mask, index = _tensor("mask", [2], "bool", "weight"), _tensor("index", [2], "int64", "weight")
    values = _tensor("values", [2], "float32", "weight")
    _add_ir(b, "nat_unsafe_masked_index_put", "_unsafe_masked_index_put_accumulate with indices far past its "
            "input: allowed, as ATen clamps them; runs without writing outside it",
            _ir("aten._unsafe_masked_index_put_accumulate.default", {"indices": [2]}, [x, mask, index, values], [4]),
            {"mask": np.array([True, True]), "index": np.array([1 << 30, 5], dtype=np.int64),
             "values": np.ones(2, np.float32)}, None, "", cli=False)
    samples = _tensor("samples", [1, 1, 2], "float32", "weight")
    x2 = _tensor("x", [1, 1, 8, 8], "float32", "input")
    _add_ir(b, "nat_fractional_pool_samples", "fractional_max_pool2d with random samples of 1e9: allowed, as ATen "
            "keeps its windows inside the input",
            _ir("aten.fractional_max_pool2d.default", {"kernel_size": [2, 2], "output_size": [4, 4]},
                [x2, samples], [1, 1, 4, 4], [_tensor("i", [1, 1, 4, 4], "int64", "output")]),
            {"samples": np.full([1, 1, 2], 1e9, np.float32)}, None, "", cli=False)


def _host_dispatch_cases(b: _Builder) -> None:
    """The base program with its first dispatch turned into a host dispatch of a native op that trusts indices."""
    header, blob = decode_npubin_parts(b.path("tiny.npubin").read_bytes())
    first = header["dispatches"][0]
    for cid, op, params in [
            ("nat_host_maxpool_backward", "aten.max_pool2d_with_indices_backward.default",
             {"kernel_size": [2, 2], "stride": [2, 2], "padding": [0, 0], "dilation": [1, 1], "ceil_mode": False}),
            ("nat_host_bincount", "aten.bincount.default", {"minlength": 1 << 36}),
            ("nat_host_reshape_alias", "aten._reshape_alias.default", {"size": [1 << 20], "stride": [1]})]:
        doc = copy.deepcopy(header)
        dispatch = doc["dispatches"][0]
        dispatch.update(kernel=op, params=params, host=dispatch.get("host") or "a hostile host dispatch")
        name = f"{cid}.npubin"
        b.path(name).write_bytes(npubin_bytes(doc, blob))
        b.add(Case(cid, "native_op", f"a host dispatch of {op} in place of {first['kernel']}", [name],
                   "native.program", "TorchIRError", r"(allow-list|refused|host)",
                   [CliCall(["run", "{dir}/" + name, "--weights", "{dir}/" + BASE_WEIGHTS,
                             "--input", "x={dir}/" + BASE_INPUT], 2)], isolate=True))


def build(b: _Builder) -> None:
    """Add this family's cases to ``b``."""
    _pool_backward_cases(b)
    _leak_cases(b)
    _host_dispatch_cases(b)
