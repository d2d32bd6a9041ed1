"""The points of a design-space sweep: models x hardware descriptions x a grid of hardware overrides x precisions.

A :class:`Point` names one model (a zoo name, a Hugging Face ``config.json`` or model directory, an IR file), one
hardware description (a preset name or a ``.toml``/``.json`` file), the grid values that override it and one
precision of the cost model (``npu_compiler.costmodel.precision.PRECISIONS``). ``--grid`` parameters:

* ``array=RxC``: the MAC array's rows x columns;
* ``sram_kib=N``: the on-chip SRAM in KiB, all of it: a shared SRAM's size, or a split one's three buffers scaled
  together so they keep the file's proportions;
* ``dram_gbps=X``: the DRAM bandwidth in GB/s;
* ``clock_mhz=X``: the clock in MHz.

``parse_grid`` only checks the syntax (a number, ``RxC``); the range of each value is the hardware file's own
(``RANGES``, checked by ``hardware_from_dict`` when the point's hardware is built: ``point_hardware``), so a value
out of range fails that point, with the field, the rule and the fix, while the sweep goes on.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch_ir.errors import TorchIRError

#: The grid parameters, in the order they appear in a point's key and the results' columns.
GRID_PARAMS = ("array", "sram_kib", "dram_gbps", "clock_mhz")
#: What each one is, for ``--help`` and the messages.
GRID_DOCS = {"array": "the MAC array, RxC (rows x columns), e.g. 32x32",
             "sram_kib": "all on-chip SRAM in KiB (a split SRAM keeps its proportions)",
             "dram_gbps": "DRAM bandwidth in GB/s", "clock_mhz": "clock in MHz"}
#: A grid value is a short number: anything longer is a typo or hostile, never a hardware size.
_MAX_VALUE_CHARS = 40


class SweepError(TorchIRError, ValueError):
    """Bad sweep input (a ``--grid`` item, a precision, a results file): one message naming the flag or file, the
    rule and the fix."""


@dataclass(frozen=True)
class Point:
    """One point of a sweep. ``overrides``: (grid parameter, value) pairs in ``GRID_PARAMS`` order; ``array``'s
    value is (rows, cols), the others numbers."""

    model: str
    hw: str
    overrides: tuple[tuple[str, Any], ...]
    precision: str

    @property
    def key(self) -> str:
        """A stable id: the same point gives the same key in every run and process (resume reads it back)."""
        grid = ",".join(f"{name}={format_value(value)}" for name, value in self.overrides)
        return f"{self.model}|{self.hw}|{grid}|{self.precision}"

    def override(self, name: str) -> Any:
        """The grid value of ``name``, or None when the grid leaves it to the hardware file."""
        return dict(self.overrides).get(name)


def format_value(value: Any) -> str:
    """A grid value as the key and the results show it: ``32x64`` for an array, ``256`` for a whole number."""
    if isinstance(value, tuple):
        return "x".join(str(v) for v in value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


def parse_grid(items: Iterable[str] | None) -> dict[str, list[Any]]:
    """``--grid`` items (``array=16x16,32x32``, ``sram_kib=256,1024``) as {parameter: values}. Raises
    ``SweepError`` naming ``--grid`` for an unknown parameter, one given twice, or a value that is not a number
    (``RxC`` for ``array``); ranges are checked per point (module docstring)."""
    grid: dict[str, list[Any]] = {}
    for item in items or ():
        name, sep, values = item.partition("=")
        name = name.strip()
        if not sep or not name or not values.strip():
            raise SweepError(f"--grid {item!r}: expected NAME=V1,V2,... (e.g. array=16x16,32x32 sram_kib=256,1024); "
                             f"fix: give one of {', '.join(GRID_PARAMS)} with its values")
        if name not in GRID_PARAMS:
            raise SweepError(f"--grid {item!r}: {name!r} is not a grid parameter; fix: use "
                             + "; ".join(f"{k} ({v})" for k, v in GRID_DOCS.items()))
        if name in grid:
            raise SweepError(f"--grid {name}: given twice; fix: list all its values in one item ({name}=A,B,C)")
        parsed = [_value(name, v.strip()) for v in values.split(",") if v.strip()]
        grid[name] = list(dict.fromkeys(parsed))  # a value given twice is one point, not two rows of one key
    return grid


def _value(name: str, text: str) -> Any:
    if len(text) > _MAX_VALUE_CHARS:
        raise SweepError(f"--grid {name}={text[:_MAX_VALUE_CHARS]}...: a value of {len(text)} characters; fix: "
                         "give a number")
    if name == "array":
        rows, sep, cols = text.lower().partition("x")
        try:
            if sep:
                return int(rows), int(cols)
        except ValueError:
            pass
        raise SweepError(f"--grid array={text}: an array is ROWSxCOLS in whole numbers, e.g. 32x32; fix: write it "
                         "so")
    try:
        value = float(text)
    except ValueError:
        raise SweepError(f"--grid {name}={text}: not a number; fix: give {GRID_DOCS[name]} as a number") from None
    return int(value) if value.is_integer() and abs(value) < 1e15 else value


def expand(models: Sequence[str], hws: Sequence[str], grid: Mapping[str, Sequence[Any]] | None,
           precisions: Sequence[str]) -> list[Point]:
    """Every combination, model-major (a model's points together, as the engine's cache serves them): models x
    hardware x the grid's product x precisions. An unknown precision or grid parameter raises ``SweepError``."""
    check_precisions(precisions)
    grid = dict(grid or {})
    unknown = [k for k in grid if k not in GRID_PARAMS]
    if unknown:
        raise SweepError(f"grid parameter {unknown[0]!r} is not one of {', '.join(GRID_PARAMS)}; fix: use those")
    names = [k for k in GRID_PARAMS if k in grid]
    combos = list(itertools.product(*(grid[k] for k in names)))
    return [Point(model, hw, tuple(zip(names, combo)), precision)
            for model in models for hw in hws for combo in combos for precision in precisions]


def check_precisions(precisions: Sequence[str]) -> None:
    """Each a precision the cost model knows; ``SweepError`` naming ``--precision`` and listing them otherwise."""
    from npu_compiler.costmodel.precision import PRECISIONS

    if not precisions:
        raise SweepError(f"--precision: no precision given; fix: give one or more of {', '.join(PRECISIONS)}")
    for p in precisions:
        if p not in PRECISIONS:
            raise SweepError(f"--precision {p}: not a precision the cost model knows; fix: give one or more of "
                             f"{', '.join(PRECISIONS)}")


def point_hardware(base: Any, overrides: Sequence[tuple[str, Any]]) -> Any:
    """``base`` (a ``Hardware``) with the grid's values, checked by the hardware file's own rules
    (``hardware_from_dict``: a value out of range raises ``HardwareError`` naming the field, the rule and the fix)."""
    if not overrides:
        return base
    from npu_compiler.costmodel.hardware import hardware_from_dict
    from npu_compiler.costmodel.hardware_template import hardware_to_dict

    data = hardware_to_dict(base)
    for name, value in overrides:
        if name == "array":
            data["array"] = {"rows": value[0], "cols": value[1]}
        elif name == "clock_mhz":
            data["clock_mhz"] = value
        elif name == "dram_gbps":
            data["dram"]["bandwidth_gbps"] = value
        elif name == "sram_kib":
            sram = data["sram"]
            if "shared_kib" in sram:
                sram["shared_kib"] = value
            else:
                data["sram"] = _split(sram, value)
    grid = " ".join(f"{k}={format_value(v)}" for k, v in overrides)
    return hardware_from_dict(data, f"<{base.described_in} with --grid {grid}>")


def _split(sram: dict[str, float], kib: float) -> dict[str, float]:
    """A split SRAM of ``kib`` KiB in all, divided as the file divides it: whole bytes that add up to the total
    (the last buffer takes the rounding), in KiB (a byte count / 1024 is exact in binary, so it reads back whole)."""
    from npu_compiler.costmodel.hardware import SPLIT_SRAM

    if not kib > 0:  # zero, negative or not a number: as the file's own rule refuses it
        return {k: kib for k in SPLIT_SRAM}
    total = sum(sram[k] for k in SPLIT_SRAM)
    target = int(kib * 1024)
    sizes = [int(target * sram[k] / total) for k in SPLIT_SRAM[:-1]]
    sizes.append(target - sum(sizes))
    return {k: b / 1024 for k, b in zip(SPLIT_SRAM, sizes)}


__all__ = ["GRID_DOCS", "GRID_PARAMS", "Point", "SweepError", "check_precisions", "expand", "format_value",
           "parse_grid", "point_hardware"]
