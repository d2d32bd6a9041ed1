"""A quantization spec: everything needed to compute with one quantized tensor.

A tensor whose ``TensorMeta.quant`` is a :class:`QuantSpec` holds integers (or fp8 codes) of ``spec.dtype``;
its real value is ``(q - zero_point) * scale`` with the scale and zero point chosen by the spec's granularity:

* per tensor: ``axis`` is None, one scale;
* per channel: ``axis`` names the channel dimension, one scale per index along it;
* per group: ``axis`` and ``group_size`` g, one scale per g consecutive elements along ``axis`` (ONNX's blocked
  quantization, GPTQ/AWQ groups): the scale tensor has the tensor's shape with ``axis`` divided by g;
* a block layout (``block``: GGUF's ``q8_0``, ``q4_0``, ``q5_0``, ``q4_K``, ``q6_K``): scales live inside the packed
  data.
  Such a tensor is a weight-only layout: its dtype is the float type its values are computed in, its bytes are
  the blocks (:func:`stored`), ``spec.dtype`` names the codes inside (``BLOCK_CODES``), and reading it means
  dequantizing its blocks (``torch_ir.quant.blocks``, bit-exact with ggml).

Scales and zero points are either named tensors (a weights-file tensor or an IR constant) or constants written
in the spec. ``zero_point`` None means symmetric (zero point 0). ``method`` is how a float becomes a step when
quantizing: ``divide`` (``x / scale``, ONNX) or ``multiply_inverse`` (``x * (1 / scale)``, PyTorch's
quantized_decomposed ops); both round half to even and saturate. Nothing here imports torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import IRValidationError

#: Quantized element types: name -> (smallest, largest) code, bits per element.
QTYPES: dict[str, tuple[float, float, int]] = {
    "int8": (-128, 127, 8), "uint8": (0, 255, 8), "int16": (-32768, 32767, 16), "uint16": (0, 65535, 16),
    "int32": (-(2 ** 31), 2 ** 31 - 1, 32),  # a bias at scale x_scale * w_scale
    "int4": (-8, 7, 4), "uint4": (0, 15, 4),  # stored packed two per byte, low nibble first
    "float8_e4m3fn": (-448.0, 448.0, 8), "float8_e5m2": (-57344.0, 57344.0, 8),
}
PACKED = frozenset({"int4", "uint4"})
SCALE_DTYPES = ("float32", "float16", "bfloat16")
METHODS = ("divide", "multiply_inverse")
#: GGUF block layouts (elements per block); their scales are inside the data.
BLOCKS = {"q8_0": 32, "q4_0": 32, "q5_0": 32, "q4_K": 256, "q6_K": 256}
#: Bytes per block of each layout (GGML's ``block_q8_0`` ...; ``torch_ir.quant.blocks`` has every GGML type, and its
#: tests hold these rows to it) and the type of the codes inside (Q5_0's 5-bit codes, 16 subtracted, and Q6_K's
#: 6-bit codes, 32 subtracted, fit int8: there is no 5- or 6-bit type).
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q5_0": 22, "q4_K": 144, "q6_K": 210}
BLOCK_CODES = {"q8_0": "int8", "q4_0": "int4", "q5_0": "int8", "q4_K": "uint4", "q6_K": "int8"}
#: What a block-quantized tensor holds: the float values its blocks dequantize to (a weight-only layout).
BLOCK_VALUE_DTYPES = ("float32", "float16", "bfloat16")

Scale = str | float | tuple[float, ...]
ZeroPoint = str | int | tuple[int, ...] | None


@dataclass(frozen=True)
class QuantSpec:
    """How one tensor is quantized (module docstring)."""

    dtype: str
    scale: Scale = 1.0
    zero_point: ZeroPoint = None
    axis: int | None = None
    group_size: int | None = None
    block: str | None = None
    scale_dtype: str = "float32"
    method: str = "divide"

    @property
    def granularity(self) -> str:
        if self.block is not None:
            return "block"
        if self.axis is None:
            return "tensor"
        return "channel" if self.group_size is None else "group"

    @property
    def symmetric(self) -> bool:
        zp = self.zero_point
        return zp is None or (not isinstance(zp, str) and all(v == 0 for v in _values(zp)))

    @property
    def bits(self) -> int:
        return QTYPES[self.dtype][2]

    @property
    def is_float(self) -> bool:
        return self.dtype.startswith("float8")

    def qrange(self) -> tuple[float, float]:
        lo, hi, _ = QTYPES[self.dtype]
        return lo, hi

    def names(self) -> list[str]:
        """The tensors this spec reads its scale and zero point from."""
        return [v for v in (self.scale, self.zero_point) if isinstance(v, str)]

    def to_dict(self) -> dict[str, Any]:
        d = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}
        return {k: v for k, v in d.items() if v is not None and (k, v) not in _DEFAULTS}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "quant") -> QuantSpec:
        """A spec from its JSON form; an IRValidationError naming ``where`` for anything malformed."""
        if not isinstance(d, dict):
            raise IRValidationError(f"{where}: expected a quantization spec object, got {type(d).__name__}")
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise IRValidationError(f"{where}: unknown field(s) {sorted(unknown)}; a quantization spec has "
                                 f"{sorted(cls.__dataclass_fields__)}")
        if "dtype" not in d:
            raise IRValidationError(f"{where}: a quantization spec needs a dtype (one of {', '.join(QTYPES)})")
        fields = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()}
        spec = cls(**fields)
        check_spec(spec, where)
        return spec


_DEFAULTS = {("scale_dtype", "float32"), ("method", "divide")}


def _values(v: Any) -> tuple:
    return v if isinstance(v, tuple) else (v,)


def _fail(where: str, rule: str) -> None:
    raise IRValidationError(f"{where}: {rule}")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_spec(spec: QuantSpec, where: str) -> None:
    """The spec's own rules: a known type, granularity fields that agree, finite positive constant scales, zero
    points that are integers inside the type's range (fp8: none)."""
    if spec.dtype not in QTYPES:
        _fail(where, f"quantized dtype {spec.dtype!r} is not one of {', '.join(QTYPES)}")
    if spec.scale_dtype not in SCALE_DTYPES:
        _fail(where, f"scale_dtype {spec.scale_dtype!r} is not one of {', '.join(SCALE_DTYPES)}")
    if spec.method not in METHODS:
        _fail(where, f"method {spec.method!r} is not one of {', '.join(METHODS)}")
    if spec.axis is not None and (not isinstance(spec.axis, int) or isinstance(spec.axis, bool)):
        _fail(where, f"axis must be an integer or null, got {spec.axis!r}")
    if spec.group_size is not None:
        if spec.axis is None:
            _fail(where, "group_size needs an axis (the dimension the groups run along)")
        if not isinstance(spec.group_size, int) or isinstance(spec.group_size, bool) or spec.group_size < 1:
            _fail(where, f"group_size must be a positive integer, got {spec.group_size!r}")
    if spec.block is not None and spec.block not in BLOCKS:
        _fail(where, f"block layout {spec.block!r} is not one of {', '.join(BLOCKS)}")
    _check_scale(spec, where)
    _check_zero_point(spec, where)


def _check_scale(spec: QuantSpec, where: str) -> None:
    if isinstance(spec.scale, str):
        if not spec.scale:
            _fail(where, "scale names no tensor (an empty name)")
        return
    values = _values(spec.scale)
    if not values or not all(_is_number(v) and math.isfinite(v) and v > 0 for v in values):
        _fail(where, f"constant scales must be finite numbers > 0, got {_short(spec.scale)}")
    if spec.axis is None and len(values) != 1:
        _fail(where, f"a per-tensor spec has one scale, got {len(values)}")


def _check_zero_point(spec: QuantSpec, where: str) -> None:
    zp = spec.zero_point
    if zp is None or isinstance(zp, str):
        if isinstance(zp, str) and not zp:
            _fail(where, "zero_point names no tensor (an empty name)")
        return
    if spec.is_float:
        _fail(where, f"{spec.dtype} has no zero point (got {_short(zp)}); leave zero_point out")
    lo, hi = spec.qrange()
    values = _values(zp)
    bad = [v for v in values if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi]
    if bad:
        _fail(where, f"zero point {_short(bad[0])} is outside {spec.dtype}'s range [{int(lo)}, {int(hi)}]")
    if not isinstance(spec.scale, str) and len(values) != len(_values(spec.scale)):
        _fail(where, f"{len(values)} zero point(s) for {len(_values(spec.scale))} scale(s)")


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def param_shape(spec: QuantSpec, shape: list[Any]) -> list[Any]:
    """The shape a scale or zero-point tensor of ``spec`` has for a quantized tensor of ``shape``: [] per tensor,
    [C] per channel, the tensor's shape with ``axis`` divided by the group size per group."""
    if spec.axis is None or spec.block is not None:
        return []
    axis = spec.axis % len(shape)
    if spec.group_size is None:
        return [shape[axis]]
    out = list(shape)
    out[axis] = shape[axis] // spec.group_size if isinstance(shape[axis], int) else shape[axis]
    return out


def check_fits(spec: QuantSpec, shape: list[Any], dtype: str, where: str,
               param_shapes: dict[str, list[Any]] | None = None) -> None:
    """That ``spec`` fits a tensor of ``shape`` and ``dtype``: the tensor holds the spec's type, the axis is one
    of its dims, a group divides its axis, a block layout divides the last dim, and every scale or zero point
    (constants, or the named tensors' shapes in ``param_shapes``) has the shape the granularity needs."""
    if spec.block is not None:
        _check_block_fits(spec, shape, dtype, where)
        return
    if dtype != spec.dtype:
        _fail(where, f"the tensor is {dtype} but its quantization spec says {spec.dtype}; a quantized tensor holds "
                     "the spec's type (dequantize it to get floats)")
    rank = len(shape)
    if spec.axis is not None and not -rank <= spec.axis < rank:
        _fail(where, f"axis {spec.axis} is out of range for a rank-{rank} tensor {list(shape)}")
    if spec.dtype in PACKED and rank and isinstance(shape[-1], int) and shape[-1] % 2:
        _fail(where, f"{spec.dtype} is stored two per byte along the last dim, which must be even (got {shape[-1]})")
    if spec.group_size is not None:
        size = shape[spec.axis % rank]
        if isinstance(size, int) and size % spec.group_size:
            _fail(where, f"group_size {spec.group_size} does not divide dim {spec.axis % rank} ({size}) of "
                         f"{list(shape)}")
    want = param_shape(spec, list(shape))
    numel = math.prod(d for d in want if isinstance(d, int))
    for field_name, value in (("scale", spec.scale), ("zero_point", spec.zero_point)):
        if value is None:
            continue
        if isinstance(value, str):
            got = (param_shapes or {}).get(value)
            if got is not None and [d for d in got if d != 1] != [d for d in want if d != 1]:
                _fail(where, f"{field_name} tensor {value!r} has shape {list(got)}; a {spec.granularity} spec of "
                             f"a {list(shape)} tensor needs {want}")
        elif len(_values(value)) not in (1, numel) or (spec.axis is not None and len(_values(value)) != numel):
            _fail(where, f"{len(_values(value))} constant {field_name}(s); a {spec.granularity} spec of a "
                         f"{list(shape)} tensor needs {numel}")


def _check_block_fits(spec: QuantSpec, shape: list[Any], dtype: str, where: str) -> None:
    """A block layout: float values, the layout's own code type, whole blocks along the last dim, no axis."""
    if dtype not in BLOCK_VALUE_DTYPES:
        _fail(where, f"a {spec.block} tensor holds the float values its blocks dequantize to "
                     f"({', '.join(BLOCK_VALUE_DTYPES)}), not {dtype}")
    if spec.dtype != BLOCK_CODES[spec.block]:
        _fail(where, f"{spec.block} blocks hold {BLOCK_CODES[spec.block]} codes, not {spec.dtype}")
    if spec.axis is not None or spec.group_size is not None or spec.zero_point is not None:
        _fail(where, f"a {spec.block} tensor's scales are inside its blocks: give no axis, group_size or zero_point")
    n = BLOCKS[spec.block]
    if not shape or not isinstance(shape[-1], int) or shape[-1] % n:
        _fail(where, f"block layout {spec.block} packs {n} elements per block: the last dim ({list(shape)}) "
                     "must be a multiple of it")


def stored(dtype: str, shape: list[Any], quant: QuantSpec | None = None) -> tuple[str, list[Any]]:
    """The dtype and shape a tensor of ``dtype`` and ``shape`` (quantized by ``quant``) is held in: a block layout
    as its blocks' bytes, ``uint8 [..., last / elements · bytes]``; 4-bit codes as uint8, two per byte along the
    last dim; every other type as it is."""
    if quant is not None and quant.block in BLOCKS and shape and isinstance(shape[-1], int):
        return "uint8", [*shape[:-1], shape[-1] // BLOCKS[quant.block] * BLOCK_BYTES[quant.block]]
    if dtype not in PACKED or not shape:
        return dtype, list(shape)
    last = shape[-1]
    return "uint8", [*shape[:-1], last // 2 if isinstance(last, int) else f"({last})//2"]


#: The ops that read or make a quantized tensor and where: op type -> (index of the quantized tensor, in inputs or
#: outputs, and the attribute naming its dtype).
_SPEC_NODES = {"QUANTIZE": ("outputs", "dtype"), "DEQUANTIZE": ("inputs", "dtype")}


def node_disagrees(op_type: str, attrs: dict[str, Any], inputs: list[Any], outputs: list[Any]) -> str | None:
    """Why a (de)quantize node's attributes say something else than its quantized tensor's spec, or None.

    The node's attributes are what runs; the spec is what the tensor declares to compilers and cost models:
    a difference would make one of them silently wrong."""
    where = _SPEC_NODES.get(op_type)
    if where is None:
        return None
    side, _ = where
    tensors = inputs if side == "inputs" else outputs
    if not tensors or getattr(tensors[0], "quant", None) is None:
        return None
    spec, t = tensors[0].quant, tensors[0]
    said = {"dtype": attrs.get("dtype"), "axis": attrs.get("axis"), "group_size": attrs.get("group_size")}
    declared = {"dtype": spec.dtype, "axis": spec.axis, "group_size": spec.group_size}
    if said["axis"] is not None and declared["axis"] is not None and t.shape:
        said["axis"], declared["axis"] = said["axis"] % len(t.shape), declared["axis"] % len(t.shape)
    for key, value in said.items():
        if value != declared[key]:
            return (f"{op_type} says {key}={value!r} of tensor {t.name!r}, whose quantization spec says "
                    f"{declared[key]!r}; make them agree")
    return None
