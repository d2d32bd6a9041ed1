"""The allow-list of ATen ops a file may run: complete for this torch, refusing by name, guards that hold.

The fuzzing of every allowed op is tests/security/test_op_fuzz.py; here: the list against the installed torch,
and each guard against the attack it stops, through the reference executor as a file would reach it.
"""

from __future__ import annotations

import pytest
import torch

from torch_ir import IRExecutor
from torch_ir.errors import ExecutionError, LimitExceededError, UnsafeInputError
from torch_ir.ir import NPU_IR, OpNode, TensorMeta
from torch_ir.ops import allowlist
from torch_ir.ops.registry import bind_kernel, is_supported, resolve_overload


def _functional_tensor_overloads(packet: str) -> set[str]:
    ns, name = packet.split(".")
    found = set()
    for overload in getattr(getattr(torch.ops, ns), name).overloads():
        op = resolve_overload(f"{packet}.{overload}")
        schema = op._schema if op is not None else None
        if schema is not None and not schema.is_mutable and any("Tensor" in str(r.type) for r in schema.returns):
            found.add(f"{packet}.{overload}")
    return found


def test_every_overload_of_a_listed_op_is_reviewed():
    """A torch upgrade that adds an overload to a listed op fails here until the overload has a line (allowed,
    guarded or refused) in torch_ir/ops/allowed_ops.txt; a line for an overload torch no longer has fails too."""
    reviewed = set(allowlist.reviews())
    packets = {op.rsplit(".", 1)[0] for op in reviewed}
    installed = set().union(*(_functional_tensor_overloads(p) for p in packets))
    assert not installed - reviewed, f"overloads of listed ops with no review: {sorted(installed - reviewed)}"
    assert not reviewed - installed, f"reviewed overloads this torch does not have: {sorted(reviewed - installed)}"


def test_the_list_is_read_as_written():
    reviews = allowlist.reviews()
    assert len(allowlist.allowed_ops()) > 700
    assert reviews["aten.add.Tensor"] == allowlist.Review("aten.add.Tensor")
    assert reviews["aten.empty.memory_format"].guard == "zeroed"
    assert "backward" in reviews["aten.max_pool2d_with_indices_backward.default"].refused


@pytest.mark.parametrize(("op_type", "rule"), [
    ("aten.max_pool2d_with_indices_backward.default", "reviewed and refused: a backward"),
    ("aten.adaptive_max_pool2d_backward.default", "not on the reviewed allow-list"),
    ("aten.max_pool3d_with_indices_backward.default", "not on the reviewed allow-list"),
    ("aten._embedding_bag_dense_backward.default", "not on the reviewed allow-list"),
    ("aten._reshape_alias.default", "not on the reviewed allow-list"),
    ("aten.bincount.default", "not on the reviewed allow-list"),
    ("aten.from_file.default", "reads or writes files"),
    ("aten.resize_as.default", "uninitialized"),
])
def test_ops_off_the_list_are_refused_by_name(op_type, rule):
    node = OpNode("n", op_type, [TensorMeta("x", [4], "float32")], [TensorMeta("y", [4], "float32")], {})
    with pytest.raises(UnsafeInputError, match=rule) as info:
        bind_kernel(node, torch.device("cpu"))
    assert op_type in str(info.value)
    assert not is_supported(op_type)


def one_node(op_type: str, attrs: dict, inputs: list[TensorMeta], out_shape: list[int]) -> NPU_IR:
    y = TensorMeta("y", out_shape, "float32", role="output")
    return NPU_IR(model_name="hostile", graph_inputs=inputs, graph_outputs=[y], weights=[],
                  nodes=[OpNode("n0", op_type, inputs, [y], attrs)])


def test_empty_gives_zeros_not_process_memory():
    """aten.empty as an output used to hand out whatever the allocator held (freed tensors, strings)."""
    secret = torch.full([4096], 1234.5)  # freed just before: its memory is what empty would reuse
    del secret
    ir = one_node("aten.empty.memory_format", {"size": [4096]}, [], [4096])
    (out,) = IRExecutor(ir, {}).run([])
    assert out.shape == (4096,) and bool((out == 0).all())


def test_as_strided_cannot_view_past_its_storage():
    """ATen checks an as_strided view against its storage (``_reshape_alias``, which does not, is off the list)."""
    x = TensorMeta("x", [4], "float32", role="input")
    for attrs, rule in [({"size": [4096], "stride": [1]}, "out of bounds for storage"),
                        ({"size": [2], "stride": [-1], "storage_offset": 3}, "[Nn]egative strides")]:
        with pytest.raises(ExecutionError, match=rule):
            IRExecutor(one_node("aten.as_strided.default", attrs, [x], attrs["size"]), {}).run([torch.ones(4)])
    ok = {"size": [2, 2], "stride": [1, 2]}
    (out,) = IRExecutor(one_node("aten.as_strided.default", ok, [x], [2, 2]), {}).run([torch.arange(4.0)])
    torch.testing.assert_close(out, torch.arange(4.0).as_strided([2, 2], [1, 2]))


def test_segment_reduce_checks_its_lengths_even_when_told_not_to():
    x, lengths = TensorMeta("x", [4], "float32", role="input"), TensorMeta("lengths", [2], "int64", role="input")
    attrs = {"reduce": "sum", "axis": 0, "unsafe": True, "indices": None, "offsets": None}
    ir = one_node("aten.segment_reduce.default", attrs, [x, lengths], [2])
    with pytest.raises(ExecutionError, match="segment"):
        IRExecutor(ir, {}).run([torch.ones(4), torch.tensor([1 << 20, 3])])
    (out,) = IRExecutor(ir, {}).run([torch.arange(4.0), torch.tensor([1, 3])])
    torch.testing.assert_close(out, torch.tensor([0.0, 6.0]))  # the sums of [0] and [1, 2, 3], as torch defines


def test_unsafe_masked_index_clamps_what_its_mask_hides():
    """``_unsafe_masked_index`` is allowed as it is: ATen clamps its indices (pad decompositions rely on masked
    indices being out of range), so hostile indices read inside the tensor, equal to torch."""
    x, mask = TensorMeta("x", [4], "float32", role="input"), TensorMeta("mask", [2], "bool", role="input")
    index = TensorMeta("index", [2], "int64", role="input")
    ir = one_node("aten._unsafe_masked_index.default", {"indices": [2], "fill": 0.0}, [x, mask, index], [2])
    args = [torch.arange(4.0), torch.tensor([True, False]), torch.tensor([10**9, -(10**9)])]
    (out,) = IRExecutor(ir, {}).run(args)
    torch.testing.assert_close(out, torch.ops.aten._unsafe_masked_index(args[0], args[1], [args[2]], 0.0))
    torch.testing.assert_close(out, torch.tensor([3.0, 0.0]))  # the last element (clamped), the fill


def test_mvlgamma_order_is_bounded_before_its_work_is_allocated():
    """mvlgamma(x, p) builds numel * p terms: a file's p of 2**40 would ask for terabytes (or grind for minutes
    in the page allocator below the limit); it is refused by the allocation limit, and p < 1 as torch does."""
    x = TensorMeta("x", [4], "float32", role="input")
    with pytest.raises(LimitExceededError, match="mvlgamma of order p=1099511627776 over 4 elements needs 16.0 TiB"):
        IRExecutor(one_node("aten.mvlgamma.default", {"p": 1 << 40}, [x], [4]), {}).run([torch.full([4], 1e12)])
    with pytest.raises((ExecutionError, UnsafeInputError), match="p=0 must be at least 1"):
        IRExecutor(one_node("aten.mvlgamma.default", {"p": 0}, [x], [4]), {}).run([torch.full([4], 3.0)])
    (out,) = IRExecutor(one_node("aten.mvlgamma.default", {"p": 3}, [x], [4]), {}).run([torch.full([4], 3.0)])
    torch.testing.assert_close(out, torch.mvlgamma(torch.full([4], 3.0), 3))
