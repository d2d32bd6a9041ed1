"""Token ids outside an EMBEDDING's table are an error on every path, as in eager PyTorch (issue 26, item 1).

An id past the vocabulary used to wrap modulo the table's rows after ``normalize``, so a compiled program
(CPU or WebGPU, even with ``validate=True``) silently returned another token's embedding. Now an id must
lie in [0, rows), or, for a lookup that came from ONNX Gather, in [-rows, rows) with a negative id counting
from the end exactly as onnxruntime does; anything else raises an error naming the id, the table's size and
where it was read.
"""

from __future__ import annotations

import numpy as np
import pytest
import safetensors.torch
import torch
from onnx import TensorProto, helper
from torch import nn

import npu_compiler
import torch_ir
from npu_compiler.passes import normalize
from npu_runtime import Device, Executor, load_weights
from npu_runtime.device import RuntimeInputError
from npu_runtime.executor import DispatchError
from npu_tools.cli import main
from tests.onnx.graphs import FLOAT, INT64, make_model, ort_run
from tests.webgpu.kernels import needs_gpu
from torch_ir.errors import ExecutionError, TorchIRError
from torch_ir.inputs import random_inputs
from torch_ir.weights import module_state

VOCAB, DIM, SEQ = 16, 4, 3
INT32 = TensorProto.INT32
BACKENDS = ["cpu", pytest.param("webgpu", marks=needs_gpu)]
OUT_OF_RANGE = [VOCAB, VOCAB + 100]


class TinyLM(nn.Module):
    """An embedding and a projection: the shape of a language model's first and last layers."""

    def __init__(self, shift: int = 0) -> None:
        super().__init__()
        self.shift = shift
        self.emb, self.fc = nn.Embedding(VOCAB, DIM), nn.Linear(DIM, 5)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # shift != 0: the ids the embedding reads are computed inside the program, not a graph input
        return self.fc(self.emb(input_ids + self.shift if self.shift else input_ids))


def tiny_lm(shift: int = 0) -> tuple[nn.Module, torch_ir.NPU_IR]:
    torch.manual_seed(0)
    model = TinyLM(shift).eval()
    ir = torch_ir.extract_ir(model, (torch.tensor([[1, 2, 3]]),), model_name="tiny_lm", allow_real_weights=True)
    return model, ir


def ids_with(bad: int) -> np.ndarray:
    return np.array([[1, bad, 2]], dtype=np.int64)


def compiled(model: nn.Module, ir: torch_ir.NPU_IR, backend: str, validate: bool = False,
             fallback: str | None = None):
    program = npu_compiler.compile(ir, target=backend, fallback=fallback)
    device = Device(backend)
    return Executor(program, device, validate=validate), load_weights(module_state(model), program, device)


def output(executor: Executor, weights, ids: np.ndarray) -> np.ndarray:
    (result,) = executor.run({executor.program.input_specs[0].name: ids}, weights=weights).values()
    return result.to_numpy()


def embedding_nodes(ir: torch_ir.NPU_IR) -> list:
    return [n for n in ir.nodes if n.op_type == "EMBEDDING"]


# -- a PyTorch source: ids in [0, rows) ---------------------------------------------------------------------------

def test_eager_and_the_extracted_ir_raise_for_an_id_past_the_table():
    model, ir = tiny_lm()
    with pytest.raises(IndexError):
        model(torch.from_numpy(ids_with(VOCAB)))
    with pytest.raises(ExecutionError):
        torch_ir.IRExecutor(ir, model.state_dict()).run([torch.from_numpy(ids_with(VOCAB))])


@pytest.mark.parametrize("bad", [*OUT_OF_RANGE, -1])
def test_the_normalized_ir_raises_with_the_node_the_id_and_the_table_size(bad):
    model, ir = tiny_lm()
    normalized = normalize(ir)
    (node,) = embedding_nodes(normalized)
    assert not node.attrs.get("negative_wraps")  # PyTorch's embedding: a negative id is an error too
    with pytest.raises(ExecutionError, match=rf"(?s){node.name}.*EMBEDDING.*id {bad}\b.*{VOCAB} rows"):
        torch_ir.IRExecutor(normalized, model.state_dict()).run([torch.from_numpy(ids_with(bad))])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("validate", [False, True], ids=["plain", "validate"])
@pytest.mark.parametrize("bad", [*OUT_OF_RANGE, -1])
def test_a_compiled_program_refuses_an_id_outside_the_table(backend, validate, bad):
    model, ir = tiny_lm()
    executor, weights = compiled(model, ir, backend, validate)
    with pytest.raises(RuntimeInputError, match=rf"input 'input_ids'.*id {bad}\b.*{VOCAB} rows.*dispatch \d+ "
                                                 r"\(EMBEDDING, node '[^']+'\)"):
        output(executor, weights, ids_with(bad))
    # the ids at the table's edges are fine, and give eager's numbers
    edges = np.array([[0, VOCAB - 1, 5]], dtype=np.int64)
    with torch.no_grad():
        expected = model(torch.from_numpy(edges)).numpy()
    np.testing.assert_allclose(output(executor, weights, edges), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ids_computed_inside_the_program_are_checked_by_the_reference(backend):
    """Ids the program computes never pass the copy-in check: the CPU kernel (the reference) raises for them,
    and on WebGPU, where a shader cannot raise, ``validate=True`` does."""
    model, ir = tiny_lm(shift=VOCAB)
    executor, weights = compiled(model, ir, backend, validate=backend == "webgpu")
    ids = np.zeros((1, SEQ), dtype=np.int64)  # VOCAB after the shift
    with pytest.raises(DispatchError, match=rf"dispatch \d+ \(EMBEDDING, node '[^']+'\).*id {VOCAB}\b.*"
                                            rf"{VOCAB} rows"):
        output(executor, weights, ids)


def test_an_explicit_modulo_in_the_model_keeps_wrapping_as_eager():
    """``emb(ids % V)`` in a PyTorch model wraps every id, past the table too: that remainder is the model's,
    not ONNX Gather's, so normalize keeps it rather than folding it into the lookup (and, with no remainder
    kernel in the table, the host runs it)."""

    class Wrapped(TinyLM):
        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.fc(self.emb(input_ids % VOCAB))

    torch.manual_seed(0)
    model = Wrapped().eval()
    ir = torch_ir.extract_ir(model, (torch.tensor([[1, 2, 3]]),), model_name="wrapped", allow_real_weights=True)
    assert "aten.remainder.Scalar" in {n.op_type for n in normalize(ir).nodes}
    executor, weights = compiled(model, ir, "cpu", fallback="cpu")
    ids = ids_with(VOCAB + 3)
    with torch.no_grad():
        expected = model(torch.from_numpy(ids)).numpy()
    np.testing.assert_allclose(output(executor, weights, ids), expected, rtol=1e-5, atol=1e-6)


def test_random_inputs_of_a_normalized_ir_stay_inside_a_small_table():
    """Seeded inputs (bisect, verify, the CLI's random ids) index an EMBEDDING's table as they do eager's."""
    torch.manual_seed(0)
    model = nn.Embedding(3, DIM).eval()
    ir = torch_ir.extract_ir(model, (torch.zeros(1, 32, dtype=torch.int64),), model_name="small_table",
                             allow_real_weights=True)
    (ids,) = random_inputs(normalize(ir), seed=0)
    assert 0 <= int(ids.min()) and int(ids.max()) < 3


# -- an ONNX source: ids in [-rows, rows), a negative one counting from the end ---------------------------------

def onnx_gather(ids_type: int = INT64):
    """Gather(table, ids) -> MatMul: ONNX's embedding lookup, as exporters write it."""
    rng = np.random.default_rng(0)
    inits = {"table": rng.standard_normal((VOCAB, DIM), dtype=np.float32),
             "proj": rng.standard_normal((DIM, 5), dtype=np.float32)}
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["rows"], axis=0),
             helper.make_node("MatMul", ["rows", "proj"], ["y"])]
    proto = make_model(nodes, [("input_ids", ids_type, [1, SEQ])], [("y", FLOAT, [1, SEQ, 5])], inits)
    ir, weights = torch_ir.import_onnx(proto, model_name="gather")
    return proto, ir, weights


def onnx_compiled(backend: str, validate: bool = False, ids_type: int = INT64):
    proto, ir, weights = onnx_gather(ids_type)
    program = npu_compiler.compile(ir, target=backend)
    device = Device(backend)
    return proto, Executor(program, device, validate=validate), load_weights(weights, program, device)


def test_an_onnx_gather_normalizes_to_an_embedding_whose_negative_ids_wrap():
    _, ir, weights = onnx_gather()
    normalized = normalize(ir)
    (node,) = embedding_nodes(normalized)
    assert node.attrs == {"negative_wraps": True}
    assert "aten.remainder.Scalar" not in {n.op_type for n in normalized.nodes}
    with pytest.raises(ExecutionError, match=rf"(?s)id {VOCAB}\b.*{VOCAB} rows"):
        torch_ir.IRExecutor(normalized, weights).run([torch.from_numpy(ids_with(VOCAB))])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("validate", [False, True], ids=["plain", "validate"])
def test_onnx_negative_ids_wrap_exactly_as_onnxruntime(backend, validate):
    proto, executor, weights = onnx_compiled(backend, validate)
    for ids in ([[-1, -VOCAB, 3]], [[0, VOCAB - 1, -7]]):
        array = np.array(ids, dtype=np.int64)
        (expected,) = ort_run(proto, [torch.from_numpy(array)])
        np.testing.assert_allclose(output(executor, weights, array), expected.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [*OUT_OF_RANGE, -VOCAB - 1])
def test_onnx_ids_outside_minus_rows_to_rows_are_an_error_as_in_onnxruntime(backend, bad):
    proto, executor, weights = onnx_compiled(backend)
    with pytest.raises(Exception, match="out of data bounds"):  # noqa: PT011 - onnxruntime's own error type
        ort_run(proto, [torch.from_numpy(ids_with(bad))])
    with pytest.raises(RuntimeInputError, match=rf"id {bad}\b.*{VOCAB} rows.*\[-{VOCAB}, {VOCAB}\)"):
        output(executor, weights, ids_with(bad))


@pytest.mark.parametrize("backend", BACKENDS)
def test_onnx_int32_ids_are_checked_through_the_cast_to_int64(backend):
    """The importer casts int32 ids to int64 before the lookup; the input is still checked where it enters."""
    proto, executor, weights = onnx_compiled(backend, ids_type=INT32)
    ids = np.array([[-1, 2, VOCAB - 1]], dtype=np.int32)
    (expected,) = ort_run(proto, [torch.from_numpy(ids)])
    np.testing.assert_allclose(output(executor, weights, ids), expected.numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeInputError, match=rf"input 'input_ids'.*id {VOCAB}\b.*{VOCAB} rows"):
        output(executor, weights, ids_with(VOCAB).astype(np.int32))


# -- the CLI ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [VOCAB, -1])
def test_torch_ir_run_with_an_id_outside_the_table_exits_2_with_one_line(tmp_path, capsys, bad):
    model, ir = tiny_lm()
    program, weights = tmp_path / "tiny_lm.npubin", tmp_path / "tiny_lm.safetensors"
    npu_compiler.compile(ir).save(program)
    safetensors.torch.save_file(model.state_dict(), weights)
    ids = tmp_path / "ids.npy"
    np.save(ids, ids_with(bad))
    assert main(["run", str(program), "--weights", str(weights), "--input", f"input_ids={ids}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"id {bad} " in err and f"{VOCAB} rows" in err and "EMBEDDING" in err and "input_ids" in err
    np.save(ids, ids_with(VOCAB - 1))
    assert main(["run", str(program), "--weights", str(weights), "--input", f"input_ids={ids}"]) == 0


def test_every_error_is_a_torch_ir_error():
    assert issubclass(RuntimeInputError, TorchIRError) and issubclass(DispatchError, TorchIRError)
