"""Typed kernel params (``npu_program.params``): each kernel record's declarations agree with the op it runs (an
ATen op's schema, an NPU op's attributes and defaults), are plain data, and drive the checks and the IR decoding."""

from __future__ import annotations

import ast
import inspect
import json
import math
from pathlib import Path

import pytest
import torch

from npu_program.aten_params import ATEN_PARAMS
from npu_program.kernels import KERNELS
from npu_program.params import (
    INPUT,
    REQUIRED,
    TYPES,
    ParamError,
    check_params,
    declare,
    p,
    params_from_attrs,
    params_from_file,
    params_to_attrs,
    params_to_file,
)
from torch_ir.ops.npu import NPU_OPS

SRC = Path(__file__).resolve().parents[2] / "src"

# -- the declarations ---------------------------------------------------------------------------------------------

_BASE = {"bool": "bool", "int": "int", "SymInt": "int", "float": "float", "Scalar": "scalar", "number": "scalar",
         "str": "str", "ScalarType": "dtype", "Layout": "layout", "MemoryFormat": "memory_format", "Device": "device",
         "Tensor": "tensor"}
_LISTS = {"int": "ints", "SymInt": "ints", "float": "floats", "bool": "bools"}
_MEMORY_FORMATS = {0: "contiguous_format", 1: "preserve_format", 2: "channels_last", 3: "channels_last_3d"}


def _param_type(real_type: str) -> str:
    """A schema argument's type (``str(arg.real_type)``: ``Optional[List[int]]``, ``number``) as a param type."""
    if real_type in ("List[Tensor]", "List[Optional[Tensor]]"):
        return "inputs"
    optional = real_type.startswith("Optional[")
    inner = real_type[len("Optional["):-1] if optional else real_type
    kind = _LISTS[inner[5:-1]] if inner.startswith("List[") else _BASE[inner]
    return kind + "|null" if optional and kind != "tensor" else kind


def _schema_params(op: str) -> list[tuple[str, str, object]]:
    """(name, type, default) of each argument of the ATen op's schema, as the table must declare it."""
    _, name, overload = op.split(".")
    out = []
    for arg in getattr(getattr(torch.ops.aten, name), overload)._schema.arguments:
        kind = _param_type(str(arg.real_type))
        default = INPUT if kind in ("tensor", "inputs") else REQUIRED
        if default is REQUIRED and arg.has_default_value():
            default = arg.default_value
            if kind.startswith("memory_format") and isinstance(default, int):
                default = _MEMORY_FORMATS[default]
            default = list(default) if isinstance(default, tuple) else default
        out.append((arg.name, kind, default))
    return out


ATEN = sorted(name for name, record in KERNELS.items() if name.startswith("aten.") and record.host is None)


def test_every_aten_kernel_declares_its_schema() -> None:
    assert sorted(ATEN_PARAMS) == ATEN
    wrong = {}
    for op in ATEN:
        declared = [(d.name, d.type, d.default) for d in KERNELS[op].params.values()]
        if declared != _schema_params(op):
            wrong[op] = _schema_params(op)
    assert not wrong, "ATen kernels whose declarations differ from torch's schema (write these in " \
                      f"npu_program/aten_params.py): {wrong}"


@pytest.mark.parametrize("op", sorted(name for name in NPU_OPS if name in KERNELS))
def test_an_npu_kernel_declares_its_op_attributes_with_their_defaults(op: str) -> None:
    declared = KERNELS[op].params
    assert set(NPU_OPS[op].attrs) <= set(declared), f"{op}: attributes the record does not declare"
    for name, parameter in inspect.signature(NPU_OPS[op].impl).parameters.items():
        if name not in NPU_OPS[op].attrs or parameter.default is inspect.Parameter.empty:
            assert name not in NPU_OPS[op].attrs or declared[name].required, (op, name)
        elif declared[name].required:
            assert name == "has_bias", (op, name)  # the IR may leave it out; a program always says (lowering counts)
        else:
            assert declared[name].default == parameter.default, (op, name)


def test_declarations_are_plain_json_of_the_closed_type_set() -> None:
    for record in KERNELS.values():
        for decl in record.params.values():
            assert set(decl.types) <= TYPES, (record.name, decl)
            assert decl.doc or record.name.startswith("aten."), f"{record.name}.{decl.name} has no doc"
            default = None if decl.default in (REQUIRED, INPUT) else decl.default
            json.dumps([decl.name, decl.type, default, decl.doc, decl.choices], allow_nan=False)


def test_a_bad_declaration_is_refused_when_the_table_is_built() -> None:
    with pytest.raises(ValueError, match="unknown type"):
        p("x", "complex")
    with pytest.raises(ValueError, match="default 'two' is not a int"):
        p("x", "int", "two")
    with pytest.raises(ValueError, match="declared twice"):
        declare(p("x", "int"), p("x", "bool"))


# -- checking -----------------------------------------------------------------------------------------------------

GELU = KERNELS["aten.gelu.default"].params
CONV = KERNELS["CONV"].params
CAT = KERNELS["aten.cat.default"].params
CONV_OK = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "has_bias": False}


@pytest.mark.parametrize(("decls", "params", "message"), [
    (GELU, {"approximate": "tanh", "approximatee": "tanh"}, r"'approximatee' is not a param of the kernel"),
    (GELU, {"approximate": "sigmoid"}, r"param 'approximate' is 'sigmoid', expected one of 'none', 'tanh'"),
    (GELU, {"approximate": {"dtype": "float32"}}, r"param 'approximate' is \{'dtype'"),
    (CONV, {**CONV_OK, "groups": True}, r"param 'groups' is True, expected int"),
    (CONV, {**CONV_OK, "groups": 1.0}, r"param 'groups' is 1.0, expected int"),
    (CONV, {**CONV_OK, "groups": 1 << 70}, r"param 'groups' is \d+, expected int"),
    (CONV, {**CONV_OK, "stride": [1, "1"]}, r"param 'stride' is \[1, '1'\], expected a list of ints"),
    (CONV, {**CONV_OK, "bn_eps": "1e-5"}, r"param 'bn_eps' is '1e-5', expected float or null"),
    (CONV, {"stride": [1, 1], "padding": [1, 1], "has_bias": True}, r"lacks the required param 'dilation'"),
    (KERNELS["GEMM"].params, {"trans_b": True}, r"lacks the required param 'has_bias' \(bool\)"),
    (CAT, {"tensors": [0, 2], "dim": 0}, r"param 'tensors' is \[0, 2\], expected a list of input positions"),
    (KERNELS["aten._to_copy.default"].params, {"dtype": "float99"}, r"param 'dtype' is 'float99', expected dtype"),
    (KERNELS["aten._to_copy.default"].params, {"dtype": "int4"}, r"param 'dtype' is 'int4'"),  # no torch dtype
    (GELU, ["approximate"], r"params must be an object"),
])
def test_the_checker_names_the_param_and_the_rule(decls, params, message) -> None:
    with pytest.raises(ParamError, match=message):
        check_params(decls, params, 2, "dispatch 3 (K)")


def test_the_checker_accepts_what_the_declarations_allow() -> None:
    check_params(CONV, {**CONV_OK, "bn_eps": 1e-5, "activation": "relu", "groups": 2}, 2, "d")
    check_params(CONV, {**CONV_OK, "bn_eps": 1}, 2, "d")  # JSON has one number type
    check_params(CAT, {"tensors": [0, 1, None]}, 2, "d")
    check_params(KERNELS["aten.clamp.default"].params, {"min": -math.inf, "max": None}, 1, "d")
    check_params(KERNELS["aten.add.Tensor"].params, {"other": 1.0, "alpha": 2}, 1, "d")  # a tensor given as a number
    check_params(KERNELS["QKV_PROJ"].params, {"splits": [8, 4, 4], "has_bias": [True, False, True]}, 7, "d")
    check_params(KERNELS["QKV_PROJ"].params, {"splits": [8, 4, 4], "has_bias": False}, 4, "d")


# -- the IR's encoding --------------------------------------------------------------------------------------------


def test_attributes_decode_to_plain_params_with_the_defaults_filled() -> None:
    to_copy = KERNELS["aten._to_copy.default"].params
    params = params_from_attrs(to_copy, {"dtype": {"dtype": "float16"}, "memory_format": {
        "memory_format": "channels_last"}, "device": {"device": "cpu"}}, "node 'n'")
    assert params == {"dtype": "float16", "layout": None, "device": "cpu", "pin_memory": None, "non_blocking": False,
                      "memory_format": "channels_last"}
    clamp = params_from_attrs(KERNELS["aten.clamp.default"].params, {"min": {"float": "-inf"}}, "n")
    assert clamp == {"min": -math.inf, "max": None}
    # tensor arguments are not filled: absent, the op reads them from its inputs
    assert params_from_attrs(KERNELS["aten.add.Tensor"].params, {}, "n") == {"alpha": 1}
    assert params_from_attrs(GELU, {}, "n") == {"approximate": "none"}


@pytest.mark.parametrize(("attrs", "message"), [
    ({"approximatee": "tanh"}, r"node 'n': attribute 'approximatee' is not a param of the kernel \(it takes self, "
                               r"approximate\)"),
    ({"approximate": {"sym": "s0"}}, r"param 'approximate': the symbolic size 's0' has no value.*bind"),
    ({"approximate": {"pickle": "x"}}, r"param 'approximate': \{'pickle': 'x'\} is not a tagged value"),
    ({"approximate": {"dtype": 1}}, r"is not a tagged value"),
    ({"approximate": [[[[[[[[[[[[[[[[[["x"]]]]]]]]]]]]]]]]]]}, r"nested more than 16 deep"),
])
def test_attributes_that_are_no_params_are_refused(attrs, message) -> None:
    with pytest.raises(ParamError, match=message):
        params_from_attrs(GELU, attrs, "node 'n'")


def test_every_test_record_round_trips_through_the_plain_params() -> None:
    """The kernel test table's params are IR attributes: decoded, checked, and encoded back they are the same."""
    for record in KERNELS.values():
        for test in record.tests:
            params = params_from_attrs(record.params, test.params, record.name)
            if "has_bias" in record.params and "has_bias" not in params:
                params["has_bias"] = True  # what lowering counts from the inputs (required in a program)
            check_params(record.params, params, len(test.inputs), record.name)
            back = params_to_attrs(record.params, params)
            assert {k: back[k] for k in test.params} == test.params, record.name


def test_a_non_finite_float_is_a_string_in_a_file_only_where_a_number_is_declared() -> None:
    clamp = KERNELS["aten.clamp.default"].params
    assert params_to_file({"min": -math.inf, "max": math.inf}) == {"min": "-inf", "max": "inf"}
    assert params_from_file(clamp, {"min": "-inf", "max": None}) == {"min": -math.inf, "max": None}
    assert params_from_file(GELU, {"approximate": "inf"}) == {"approximate": "inf"}  # a string param keeps it
    assert params_to_attrs(clamp, {"min": -math.inf, "max": 6}) == {"min": {"float": "-inf"}, "max": 6}


# -- no torch -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", ["params", "aten_params", "kernels", "check", "npubin"])
def test_the_param_schema_and_its_checker_import_neither_torch_nor_the_ir_decoder(module: str) -> None:
    tree = ast.parse((SRC / "npu_program" / f"{module}.py").read_text())
    names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert not [n for n in names if n == "torch" or n.startswith(("torch.", "torch_ir.ops"))], names
