"""``npu_compiler.compile``: what it refuses (all at once, with reasons), the lowering facts it promises
(views, NHWC copies, a CONV taking its residual add and when it writes over it), the memory plan, the public
interface of the program, and determinism. Numbers are compared with PyTorch eager through the CPU runtime.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import npu_compiler
import torch_ir
from npu_compiler.compiler import CompileError, CompileOptions, UnsupportedOpsError
from npu_compiler.library import is_op_supported
from npu_compiler.memory import check_plan, lifetimes, no_reuse_bytes
from npu_program.kernels import kernels_where
from npu_runtime import Device, Executor, load_weights
from npu_tools.cli import main as torch_ir_cli
from torch_ir.weights import module_state

from ..helpers import assert_outputs_close, build_pair, randomize_batch_norm

VIEW_OPS = kernels_where(view=True)


def extract(meta: nn.Module, *shapes, dtype=torch.float32, **kw) -> torch_ir.NPU_IR:
    args = tuple(torch.randn(*s, dtype=dtype, device="meta") for s in shapes)
    return torch_ir.extract_ir(meta, args, model_name=type(meta).__name__, **kw)


def compile_pair(factory, *shapes, seed: int = 0, options: CompileOptions | None = None):
    """(program, real model) for a small module, BatchNorms randomized so folding shows."""
    meta, real = build_pair(factory, seed)
    randomize_batch_norm(real, seed + 1)
    return npu_compiler.compile(extract(meta, *shapes), options=options), real


def run(program, real: nn.Module, *inputs: torch.Tensor) -> list[torch.Tensor]:
    device = Device()
    weights = load_weights(module_state(real), program, device)
    names = [s.name for s in program.input_specs]
    outs = Executor(program, device).run(dict(zip(names, [x.numpy() for x in inputs])), weights=weights)
    return [torch.from_numpy(outs[s.name].to_numpy()) for s in program.output_specs]


def check_against_eager(program, real: nn.Module, *shapes, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(*s, generator=gen) for s in shapes]
    with torch.no_grad():
        expected = real(*inputs)
    assert_outputs_close(run(program, real, *inputs), expected)


def kernels(program) -> list[str]:
    """Kernel names, a CONV that took its residual add written ``CONV+residual``."""
    return [d.kernel + ("+residual" if d.params.get("has_residual") else "") for d in program.dispatches]


# ------------------------------------------------------------------------------------ refusals


class HistogramAndErfinv(nn.Module):
    """histc stays on the host by its kernel record; erfinv has no record at all."""

    def forward(self, x):
        return torch.histc(x, bins=4) + 1.0, torch.erfinv(torch.tanh(x))


def test_unsupported_ops_are_all_listed_and_nothing_is_written(tmp_path, capsys):
    ir = extract(HistogramAndErfinv(), (2, 5))
    ir_path, path = tmp_path / "scan.json", tmp_path / "model.npubin"
    ir.save(str(ir_path))
    # `torch-ir compile` writes the program once compile returns; a refusal must leave nothing behind
    assert torch_ir_cli(["compile", str(ir_path), "-o", str(path)]) == 1
    assert not path.exists() and list(tmp_path.iterdir()) == [ir_path]  # no program, no temporary file
    err = capsys.readouterr().err
    assert "aten.histc.default" in err and "aten.erfinv.default" in err and "nothing written" in err
    # the control: the same command on a model it can compile does write the file
    supported_ir = tmp_path / "linear.json"
    extract(build_pair(Linear)[0], (2, 8)).save(str(supported_ir))
    assert torch_ir_cli(["compile", str(supported_ir), "-o", str(path)]) == 0
    assert path.is_file() and npu_compiler.CompiledProgram.load(path).model_name == "Linear"

    with pytest.raises(UnsupportedOpsError) as info:
        npu_compiler.compile(ir)
    by_op = {op: (node, reason) for node, op, reason in info.value.unsupported}
    assert set(by_op) == {"aten.histc.default", "aten.erfinv.default"}
    assert "stays on the host CPU: a histogram" in by_op["aten.histc.default"][1]
    assert "not in the NPU kernel library" in by_op["aten.erfinv.default"][1]
    for op, (node, reason) in by_op.items():
        assert f"{node} ({op}): {reason}" in str(info.value)
    assert "2 of" in str(info.value) and "partition" in str(info.value)
    assert isinstance(info.value, CompileError)


def test_is_op_supported_by_op_type():
    assert is_op_supported("GEMM")
    assert is_op_supported("CONV")
    assert is_op_supported("aten.add.Tensor")
    assert not is_op_supported("aten.histc.default")
    assert is_op_supported("KV_UPDATE")  # writes a state slot in place (npu_compiler.state)
    assert not is_op_supported("not.an.op")


class Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))


def test_float64_is_refused_naming_the_dtype():
    with torch.device("meta"):
        meta = Linear().double()
    ir = extract(meta, (2, 8), dtype=torch.float64)
    with pytest.raises(UnsupportedOpsError) as info:
        npu_compiler.compile(ir)
    assert info.value.unsupported
    assert all("float64" in reason for _, _, reason in info.value.unsupported)
    assert "float64" in str(info.value)


def test_symbolic_shapes_are_refused():
    with torch.device("meta"):
        meta = Linear()
    batch = torch.export.Dim("batch", min=1, max=16)
    ir = extract(meta, (2, 8), dynamic_shapes=({0: batch},))
    assert not ir.graph_inputs[0].is_static
    with pytest.raises(CompileError, match=r"symbolic input dimensions \(batch.*--bind batch=1") as info:
        npu_compiler.compile(ir)
    assert len(str(info.value).splitlines()) == 1  # once, not once per node


def test_symbolic_shapes_bound_at_compile_run_as_the_model():
    with torch.device("meta"):
        meta = Linear()
    batch = torch.export.Dim("batch", min=1, max=16)
    ir = extract(meta, (2, 8), dynamic_shapes=({0: batch},))
    model = Linear().eval()
    x = torch.randn(3, 8)
    for program in (npu_compiler.compile(ir, bind={"batch": 3}), npu_compiler.compile(ir, input_shapes={"x": [3, 8]})):
        assert program.input_specs[0].shape == [3, 8]
        device = Device()
        weights = load_weights(module_state(model), program, device)
        out = Executor(program, device).run({"x": x.numpy()}, weights=weights)
        torch.testing.assert_close(torch.from_numpy(out[program.output_specs[0].name].to_numpy()), model(x))
    for bad, rule in [({"bind": {"batch": 99}}, "outside the range"), ({"bind": {"seq": 2}}, "no symbol 'seq'"),
                      ({"bind": {"batch": 2}, "input_shapes": {"x": [3, 8]}}, "bound twice"),
                      ({"input_shapes": {"x": [3, 9]}}, "dimension 1 is 8")]:
        with pytest.raises(CompileError, match=rule):
            npu_compiler.compile(ir, **bad)


def test_unknown_target_lists_the_targets():
    with torch.device("meta"):
        meta = Linear()
    ir = extract(meta, (2, 8))
    with pytest.raises(ValueError, match=r"unknown target 'tpu-9000'.*registered targets: .*cpu"):
        npu_compiler.compile(ir, target="tpu-9000")


# ------------------------------------------------------------------------------------ lowering facts


class ReshapeMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(12, 12), nn.Linear(4, 3)

    def forward(self, x):  # x: [2, 12]
        h = torch.relu(self.a(x))
        return self.b(h.reshape(2, 3, 4))


def test_reshape_of_a_contiguous_activation_is_an_alias():
    program, real = compile_pair(ReshapeMLP, (2, 12))
    assert not set(kernels(program)) & VIEW_OPS
    assert kernels(program) == ["GEMM", "GEMM"]
    (view,) = program.memory.aliases
    assert program.tensors[view].shape == [2, 3, 4]
    assert view not in program.memory.offsets
    check_against_eager(program, real, (2, 12))


class ConvFlatten(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 4, 3), nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        return self.fc(torch.flatten(self.conv(x), 1))


def test_flatten_after_an_nhwc_conv_is_a_dispatch():
    program, real = compile_pair(ConvFlatten, (1, 3, 8, 8))
    conv = next(d for d in program.dispatches if d.kernel == "CONV")
    assert program.tensors[conv.outputs[0]].layout == "NHWC"
    assert program.input_specs[0].layout == "NHWC"
    (flat,) = [d for d in program.dispatches if d.kernel in VIEW_OPS]
    assert flat.inputs == conv.outputs and program.tensors[flat.outputs[0]].layout is None
    assert not program.memory.aliases
    check_against_eager(program, real, (1, 3, 8, 8))


def conv_bn(cin: int, cout: int, k: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout))


class DownsampleBlock(nn.Module):
    """A ResNet basic block whose shortcut is a strided 1x1 conv: both operands of the add are convs."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = conv_bn(4, 8, 3, 2), conv_bn(8, 8, 3)
        self.shortcut = conv_bn(4, 8, 1, 2)

    def forward(self, x):
        h = torch.relu(self.conv1(x))
        return torch.relu(self.conv2(h) + self.shortcut(x))


def test_downsample_block_fuses_one_conv_into_the_add():
    program, real = compile_pair(DownsampleBlock, (1, 4, 10, 10))
    assert sorted(kernels(program)) == ["CONV", "CONV", "CONV+residual"]
    (fused,) = [d for d in program.dispatches if d.params.get("has_residual")]
    assert fused.params["activation"] == "relu"
    assert fused.outputs == [program.output_specs[0].name]
    check_against_eager(program, real, (1, 4, 10, 10))


class IdentityBlock(nn.Module):
    """stem -> h; relu(conv2(relu(conv1(h))) + h), with h read once more after the add when ``reuse``."""

    def __init__(self, reuse: bool = False):
        super().__init__()
        self.reuse = reuse
        self.stem, self.conv1, self.conv2 = conv_bn(3, 8, 3), conv_bn(8, 8, 3), conv_bn(8, 8, 3)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        y = torch.relu(self.conv2(torch.relu(self.conv1(h))) + h)
        return y * h if self.reuse else y


def test_conv_add_is_in_place_when_the_residual_dies_there():
    program, real = compile_pair(IdentityBlock, (1, 3, 8, 8))
    assert kernels(program) == ["CONV", "CONV", "CONV+residual"]
    stem, _, fused = program.dispatches
    assert fused.inputs[-1] == stem.outputs[0]
    assert fused.params.get("inplace_residual") is True
    assert program.memory.aliases[fused.outputs[0]] == stem.outputs[0]
    check_against_eager(program, real, (1, 3, 8, 8))


def test_conv_add_is_not_in_place_when_the_residual_is_read_later():
    program, real = compile_pair(lambda: IdentityBlock(reuse=True), (1, 3, 8, 8))
    assert kernels(program) == ["CONV", "CONV", "CONV+residual", "aten.mul.Tensor"]
    stem, _, fused, mul = program.dispatches
    assert fused.inputs[-1] == stem.outputs[0] and stem.outputs[0] in mul.inputs
    assert not fused.params.get("inplace_residual")
    assert fused.outputs[0] not in program.memory.aliases
    check_against_eager(program, real, (1, 3, 8, 8))


class SelfResidual(nn.Module):
    """relu(conv(h) + h): the residual is also the convolution's own input."""

    def __init__(self):
        super().__init__()
        self.stem, self.conv = conv_bn(3, 8, 3), conv_bn(8, 8, 3)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        return torch.relu(self.conv(h) + h)


def test_conv_add_is_not_in_place_over_its_own_input():
    program, real = compile_pair(SelfResidual, (1, 3, 8, 8))
    assert kernels(program) == ["CONV", "CONV+residual"]
    stem, fused = program.dispatches
    assert fused.inputs[0] == fused.inputs[-1] == stem.outputs[0]
    assert not fused.params.get("inplace_residual")  # writing over h while the conv reads h corrupts it
    check_against_eager(program, real, (1, 3, 8, 8))


def test_fusion_can_be_turned_off():
    program, real = compile_pair(IdentityBlock, (1, 3, 8, 8), options=CompileOptions(fuse=False))
    assert kernels(program) == ["CONV", "CONV", "CONV", "aten.add.Tensor", "aten.relu.default"]
    check_against_eager(program, real, (1, 3, 8, 8))


# ------------------------------------------------------------------------------------ memory


class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([DownsampleBlock(), IdentityBlock()])
        self.blocks[1].stem = conv_bn(8, 8, 3)  # the identity block takes the downsample block's 8 channels
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean((2, 3)))


def _lifetimes(program):
    memory = program.memory
    sizes = {n: s.nbytes for n, s in program.tensors.items() if n not in memory.aliases and n not in program.constants}
    return lifetimes([(d.inputs, d.outputs) for d in program.dispatches], sizes,
                     live_in=[s.name for s in program.input_specs], live_out=[s.name for s in program.output_specs],
                     aliases=memory.aliases)


def test_memory_plan_reuses_and_passes_the_independent_check():
    program, real = compile_pair(Tower, (1, 4, 12, 12))
    memory = program.memory
    lives = _lifetimes(program)
    check_plan(lives, memory.offsets, memory.arena_bytes, alignment=memory.alignment)
    assert memory.no_reuse_bytes == no_reuse_bytes(lives, memory.alignment)
    assert memory.arena_bytes < memory.no_reuse_bytes  # this chain of blocks has tensors that can share
    check_against_eager(program, real, (1, 4, 12, 12))


def test_naive_strategy_reuses_nothing():
    program, real = compile_pair(Tower, (1, 4, 12, 12), options=CompileOptions(memory_strategy="naive"))
    memory = program.memory
    assert memory.arena_bytes == memory.no_reuse_bytes
    check_plan(_lifetimes(program), memory.offsets, memory.arena_bytes, alignment=memory.alignment)
    check_against_eager(program, real, (1, 4, 12, 12))


# ------------------------------------------------------------------------------------ interface


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.left, self.right = nn.Linear(6, 6), nn.Linear(6, 2), nn.Linear(6, 3)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return self.left(h), self.right(h)


def test_public_output_names():
    one, _ = compile_pair(Linear, (2, 8))
    assert [s.name for s in one.output_specs] == ["output"]
    two, real = compile_pair(TwoHeads, (2, 6))
    assert [s.name for s in two.output_specs] == ["output_0", "output_1"]
    assert [s.shape for s in two.output_specs] == [[2, 2], [2, 3]]
    check_against_eager(two, real, (2, 6))
    kept, _ = compile_pair(TwoHeads, (2, 6), options=CompileOptions(public_output_names=False))
    assert not {s.name for s in kept.output_specs} & {"output", "output_0", "output_1"}


def test_weight_keys_are_state_dict_keys():
    program, real = compile_pair(Tower, (1, 4, 12, 12))
    state = module_state(real)
    assert set(program.weight_keys) == {w.name for w in program.weight_specs}
    assert set(program.weight_keys.values()) <= set(state)
    for spec in program.weight_specs:
        key = program.weight_keys[spec.name]
        assert list(state[key].shape) == spec.shape and str(state[key].dtype) == f"torch.{spec.dtype}"
    assert {"head.weight", "head.bias", "blocks.0.shortcut.0.weight", "blocks.0.shortcut.1.running_var"} \
        <= set(program.weight_keys.values())


def test_compiling_twice_gives_identical_files(tmp_path):
    with torch.device("meta"):
        meta = Tower()
    first, second = tmp_path / "a.npubin", tmp_path / "b.npubin"
    npu_compiler.compile(extract(meta, (1, 4, 12, 12))).save(first)
    npu_compiler.compile(extract(meta, (1, 4, 12, 12))).save(second)
    assert first.read_bytes() == second.read_bytes()
