"""The runtime picks (issue 31, items 2 and 4): a DynamicProgram run at lengths on and between its bucket edges
equals eager PyTorch (or onnxruntime) on the CPU and WebGPU backends; outputs have the actual shapes; one weight
set serves every variant; each bad shape gets one clear error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from npu_compiler import Buckets, compile, load_program
from npu_runtime import Device, Executor, RuntimeInputError, load_weights
from npu_runtime.dynamic import DynamicExecutor
from torch_ir.verify.tolerance import default_tolerance
from torch_ir.weights import module_state

from ..webgpu.kernels import needs_gpu
from .models import bert, bert_inputs, mean_pool, vit, vit_onnx

pytest.importorskip("transformers")

SEQ_BUCKETS = [64, 128, 256, 512]


def close(ours: np.ndarray, ref: torch.Tensor) -> None:
    """float32's tolerance, scaled to the output's magnitude."""
    rtol, atol = default_tolerance(torch.float32)
    ref = ref.detach().numpy()
    assert ours.shape == ref.shape
    bound = atol + rtol * float(np.abs(ref).max())
    assert float(np.abs(ours - ref).max()) <= bound


@pytest.fixture(scope="module")
def bert_dynamic(tmp_path_factory):
    model, ir = bert()
    program = compile(ir, target="cpu", dynamic=Buckets({"seq": SEQ_BUCKETS, "batch": [1, 2]},
                                                        weights=module_state(model)))
    path = tmp_path_factory.mktemp("bert") / "bert.npubin"
    program.save(path)
    return model, ir, load_program(path)


@pytest.mark.parametrize(("batch", "seq", "bucket"), [
    (1, 8, (1, 64)), (1, 63, (1, 64)), (2, 64, (2, 64)), (1, 65, (1, 128)), (2, 200, (2, 256)), (1, 256, (1, 256)),
    (2, 511, (2, 512)), (1, 512, (1, 512))])
def test_bert_at_lengths_on_and_between_bucket_edges_equals_eager(bert_dynamic, batch, seq, bucket):
    model, _, program = bert_dynamic
    executor = Executor(program)
    assert isinstance(executor, DynamicExecutor)
    inputs = bert_inputs(batch, seq, seed=seq)
    outputs = executor.run({k: v.numpy() for k, v in inputs.items()}, weights=module_state(model))
    assert (executor.last_variant.sizes["batch"], executor.last_variant.sizes["seq"]) == bucket
    with torch.no_grad():
        ref = model(**inputs)
    close(outputs["output_0"].to_numpy(), ref.last_hidden_state)
    close(outputs["output_1"].to_numpy(), ref.pooler_output)


def test_one_weight_set_and_one_arena_serve_every_variant(bert_dynamic):
    model, _, program = bert_dynamic
    executor = Executor(program)
    weights = load_weights(module_state(model), program)
    for seq in (10, 100, 300, 20):
        inputs = bert_inputs(1, seq, seed=seq)
        executor.run({k: v.numpy() for k, v in inputs.items()}, weights=weights)
    assert executor.bound is weights and len(executor.executors) == 3  # seq 64, 128, 512 made on first use
    arenas = {id(e.arena) for e in executor.executors.values()}
    assert arenas == {id(executor.arena)}
    assert int(executor.arena.numel()) == program.arena_bytes == max(v.program.arena_bytes for v in program.variants)


def test_shapes_no_bucket_serves_are_refused_with_one_clear_error(bert_dynamic):
    model, _, program = bert_dynamic
    executor = Executor(program)
    weights = module_state(model)
    ids = np.ones((1, 20), np.int64)
    with pytest.raises(RuntimeInputError, match="seq=513.*outside every bucket.*seq 8..512"):
        executor.run({"input_ids": np.ones((1, 513), np.int64), "attention_mask": np.ones((1, 513), np.int64)},
                     weights=weights)
    with pytest.raises(RuntimeInputError, match="batch=3.*outside every bucket"):
        executor.run({"input_ids": np.ones((3, 20), np.int64), "attention_mask": np.ones((3, 20), np.int64)},
                     weights=weights)
    with pytest.raises(RuntimeInputError, match="symbol 'seq' is bound twice with different sizes: 20 .* and 21"):
        executor.run({"input_ids": ids, "attention_mask": np.ones((1, 21), np.int64)}, weights=weights)
    with pytest.raises(RuntimeInputError, match="takes 2 dimensions"):
        executor.run({"input_ids": ids[0], "attention_mask": ids[0]}, weights=weights)


def test_a_symbol_that_cannot_be_padded_runs_only_at_its_bucket_sizes():
    model, ir = mean_pool()
    program = compile(ir, dynamic=Buckets({"seq": [8, 16]}, weights=module_state(model)))
    executor = Executor(program)
    for seq in (8, 16):
        x = torch.randn(2, seq, 16)
        with torch.no_grad():
            close(executor.run({"x": x.numpy()}, weights=module_state(model))["output"].to_numpy(), model(x))
    with pytest.raises(RuntimeInputError, match=r"no bucket of 'mean_pool' serves seq=12.*seq is served only at its "
                                                r"bucket sizes \(padding seq from 2 to 8 changes output"):
        executor.run({"x": np.zeros((2, 12, 16), np.float32)})


def test_vit_with_a_dynamic_batch_equals_eager():
    model, ir = vit()
    program = compile(ir, dynamic=Buckets({"batch": [1, 4, 8]}, weights=module_state(model)))
    executor = Executor(program)
    for batch in (1, 3, 4, 5, 8):
        x = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(batch))
        out = executor.run({"pixel_values": x.numpy()}, weights=module_state(model))["output"].to_numpy()
        with torch.no_grad():
            close(out, model(pixel_values=x).logits)


@pytest.mark.parametrize("target", ["cpu", pytest.param("webgpu", marks=needs_gpu)])
def test_the_dynamic_batch_onnx_vit_a_user_exported_equals_onnxruntime(tmp_path, target):
    ort = pytest.importorskip("onnxruntime")
    from torch_ir import import_onnx
    from torch_ir.frontends.onnx import onnx_specializer

    path = vit_onnx(tmp_path / "vit.onnx")
    ir, weights = import_onnx(path)
    assert ir.graph_inputs[0].shape[0] == "batch"
    program = compile(ir, target=target, dynamic=Buckets({"batch": [1, 2, 4]}, weights=weights,
                                                         specialize=onnx_specializer(path, ir)))
    assert program.padding["batch"].allowed
    device = Device(target)
    executor = Executor(program, device)
    bound = load_weights(weights, program, device)
    session = ort.InferenceSession(str(path))
    for batch in (1, 2, 3, 4):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 32, 32)).astype(np.float32)
        out = executor.run({"pixel_values": x}, weights=bound)["output"].to_numpy()
        close(out, torch.from_numpy(session.run(None, {"pixel_values": x})[0]))


@pytest.mark.slow
@needs_gpu
def test_bert_buckets_on_webgpu_equal_eager():
    model, ir = bert()
    program = compile(ir, target="webgpu", dynamic=Buckets({"seq": [64, 512], "batch": [2]},
                                                           weights=module_state(model)))
    assert program.target == "webgpu" and all(v.program.memory.alignment == 256 for v in program.variants)
    device = Device("webgpu")
    executor = Executor(program, device)
    weights = load_weights(module_state(model), program, device)
    for batch, seq in ((1, 8), (2, 64), (1, 100), (2, 512)):
        inputs = bert_inputs(batch, seq, seed=seq)
        outputs = executor.run({k: v.numpy() for k, v in inputs.items()}, weights=weights)
        with torch.no_grad():
            ref = model(**inputs)
        close(outputs["output_0"].to_numpy(), ref.last_hidden_state)
        close(outputs["output_1"].to_numpy(), ref.pooler_output)


@needs_gpu
def test_vit_batch_buckets_on_webgpu_equal_eager():
    model, ir = vit()
    program = compile(ir, target="webgpu", dynamic=Buckets({"batch": [2, 4]}, weights=module_state(model)))
    device = Device("webgpu")
    executor = Executor(program, device)
    weights = load_weights(module_state(model), program, device)
    for batch in (1, 3, 4):
        x = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(batch))
        out = executor.run({"pixel_values": x.numpy()}, weights=weights)["output"].to_numpy()
        with torch.no_grad():
            close(out, model(pixel_values=x).logits)
