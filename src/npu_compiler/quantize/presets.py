"""What to quantize and how: ``QuantConfig``, the industry's presets by name, per-layer overrides.

A preset is named as the industry names it: ``wXaY`` is X-bit weights and Y-bit activations (``a16``: the
activations stay float, weight-only quantization, as in w4a16/w8a16 LLM kernels); Qualcomm's ``16a8w``/``16a4w``
are 16-bit integer activations; ``fp8`` is float8_e4m3fn weights and activations. A ``g128`` suffix
(``w4a16_g128``) sets the weight group size along K.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field, replace
from typing import Any

from torch_ir.errors import TorchIRError
from torch_ir.quant.spec import QTYPES

WEIGHT_DTYPES = ("int8", "uint8", "int4", "uint4", "float8_e4m3fn")
ACT_DTYPES = ("int8", "uint8", "int16", "uint16", "float8_e4m3fn")
OBSERVERS = ("minmax", "percentile", "mse")
GRANULARITIES = ("tensor", "channel", "group")


class QuantizeError(TorchIRError):
    """Bad quantization input: an unknown preset, a group size that does not divide, bad calibration data."""


@dataclass(frozen=True)
class QuantConfig:
    """How to quantize one layer (and, through ``overrides``, the others).

    ``weight_dtype`` None keeps weights float; ``act_dtype`` None keeps activations float (weight-only).
    ``group_size`` with ``weight_granularity="group"``: one scale per that many elements along K (a layer whose K
    it does not divide falls back to per channel, unless ``strict_groups``). ``weight_symmetric`` False gives
    affine weights (a zero point per channel/group). ``clip_ratios``: the candidates of the weight clipping
    search (the least-MSE one is kept per channel/group). ``kv_bits`` fake-quantizes what an LLM writes into its
    KV cache. ``outputs``: with integer activations, a CONV's or GEMM's result is quantized too (as ONNX Runtime's
    and PT2E's quantizers do), so that normalize makes it one integer op (QCONV, QGEMM) that requantizes its own
    output; a graph output stays float. ``overrides``: (fnmatch pattern on node names and module paths, a config
    or a preset name or None for float), the first match wins.
    """

    weight_dtype: str | None = "int8"
    weight_granularity: str = "channel"
    group_size: int | None = None
    weight_symmetric: bool = True
    act_dtype: str | None = "uint8"
    act_observer: str = "minmax"
    act_symmetric: bool = False
    percentile: float = 99.99
    kv_bits: int | None = None
    clip_ratios: tuple[float, ...] = tuple(1.0 - 0.05 * i for i in range(10))
    strict_groups: bool = False
    outputs: bool = True
    name: str = "custom"
    overrides: tuple[tuple[str, Any], ...] = field(default=())

    def __post_init__(self) -> None:
        _check_choice("weight_dtype", self.weight_dtype, WEIGHT_DTYPES)
        _check_choice("act_dtype", self.act_dtype, ACT_DTYPES)
        _check_choice("act_observer", self.act_observer, OBSERVERS)
        _check_choice("weight_granularity", self.weight_granularity, GRANULARITIES)
        if self.weight_granularity == "group" and (not isinstance(self.group_size, int) or self.group_size < 1):
            raise QuantizeError(f"QuantConfig: group granularity needs group_size >= 1, got {self.group_size!r}")
        if self.kv_bits not in (None, 8, 16):
            raise QuantizeError(f"QuantConfig: kv_bits must be 8, 16 or None (float), got {self.kv_bits!r}")
        if not 50.0 < self.percentile <= 100.0:
            raise QuantizeError(f"QuantConfig: percentile must be in (50, 100], got {self.percentile}")

    def for_layer(self, names: list[str]) -> QuantConfig | None:
        """The config of a layer known by ``names`` (node name, module path): the first override whose pattern
        matches one of them, else this config; None: keep the layer float."""
        for pattern, value in self.overrides:
            if any(n and fnmatch.fnmatchcase(n, pattern) for n in names):
                return None if value is None else (get_preset(value) if isinstance(value, str) else value)
        return self

    def with_overrides(self, overrides: dict[str, Any] | list[tuple[str, Any]]) -> QuantConfig:
        items = list(overrides.items()) if isinstance(overrides, dict) else list(overrides)
        for _, value in items:
            if isinstance(value, str):
                get_preset(value)  # an unknown preset name is refused now, not at the layer
        return replace(self, overrides=tuple(self.overrides) + tuple(items))


def _check_choice(what: str, value: Any, choices: tuple[str, ...]) -> None:
    if value is not None and value not in choices:
        raise QuantizeError(f"QuantConfig: {what}={value!r} is not one of {', '.join(choices)}")


PRESETS: dict[str, QuantConfig] = {
    "w8a8": QuantConfig(name="w8a8"),
    "w8a16": QuantConfig(act_dtype=None, name="w8a16"),
    "w4a16": QuantConfig(weight_dtype="uint4", weight_granularity="group", group_size=128, weight_symmetric=False,
                         act_dtype=None, name="w4a16"),
    "w4a8": QuantConfig(weight_dtype="int4", name="w4a8"),
    "16a8w": QuantConfig(act_dtype="uint16", name="16a8w"),
    "16a4w": QuantConfig(weight_dtype="int4", act_dtype="uint16", name="16a4w"),
    "fp8": QuantConfig(weight_dtype="float8_e4m3fn", act_dtype="float8_e4m3fn", act_symmetric=True, name="fp8"),
    "float": QuantConfig(weight_dtype=None, act_dtype=None, name="float"),
}
PRESET_DOCS = {
    "w8a8": "int8 weights per output channel (symmetric), uint8 activations per tensor (affine)",
    "w8a16": "int8 weights per output channel; activations stay float (weight-only)",
    "w4a16": "uint4 weights in groups of 128 along K with zero points (w4a16 g128; w4a16_gN for another N); "
             "activations stay float",
    "w4a8": "int4 weights per output channel, uint8 activations",
    "16a8w": "int8 weights per output channel, uint16 activations (Qualcomm's naming)",
    "16a4w": "int4 weights per output channel, uint16 activations (Qualcomm's naming)",
    "fp8": "float8_e4m3fn weights (per output channel) and activations (per tensor)",
    "float": "leave the layer float (for overrides)",
}


def get_preset(name: str) -> QuantConfig:
    """A preset by name; ``<preset>_g<N>`` sets its group size along K. Unknown: one error listing them."""
    if isinstance(name, QuantConfig):
        return name
    base, _, group = str(name).partition("_g")
    if base in PRESETS and (not group or group.isdigit() and int(group) > 0):
        config = PRESETS[base]
        if group:
            config = replace(config, weight_granularity="group", group_size=int(group), name=name)
        return config
    listing = "; ".join(f"{k}: {v}" for k, v in PRESET_DOCS.items())
    raise QuantizeError(f"unknown quantization preset {name!r}; the presets are {listing}")


def qrange(dtype: str) -> tuple[float, float]:
    lo, hi, _ = QTYPES[dtype]
    return lo, hi
