"""Writing a hardware description: ``hardware_to_dict`` and the commented template of ``torch-ir cost
--hw-template`` (every field with its meaning, unit and range from :data:`.hardware.RANGES`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from .hardware import (
    DATAFLOWS,
    DERIVED_RATES,
    KERNEL_KINDS,
    MAC_DTYPES,
    MAX_NAME_CHARS,
    RANGES,
    SPLIT_SRAM,
    VECTOR_CLASSES,
    Hardware,
    load_hardware,
)

#: The preset whose values the template shows by default (renamed ``TEMPLATE_NAME``).
TEMPLATE_EXAMPLE = "edge_4tops"
TEMPLATE_NAME = "my-npu"
#: What each field is, for the template's comments (its unit and range come from ``RANGES``).
_MEANING = {
    "clock_mhz": "clock",
    "array.rows": "rows of processing elements", "array.cols": "columns of processing elements",
    **{f"macs_per_cycle.{d}": f"{d} rate" for d in MAC_DTYPES},
    "vector.lanes": "vector lanes",
    **{f"vector.ops_per_cycle.{c}": f"{c} rate" for c in VECTOR_CLASSES},
    "sram.weights_kib": "weight buffer", "sram.activations_kib": "activation buffer",
    "sram.accumulators_kib": "accumulators (partial sums, 4 bytes each)",
    "sram.shared_kib": "one buffer for everything",
    "dram.bandwidth_gbps": "bandwidth (1 GB/s = 1e9 bytes/s)",
    "dram.latency_ns": "latency, once per dispatch",
}
_TABLE_NOTES = {
    "array": "the MAC array: rows x cols processing elements (PEs)",
    "macs_per_cycle": "MACs per PE per cycle by operand width (one at least above 0)",
    "vector": "the vector unit: every kernel that is not a contraction",
    "vector.ops_per_cycle": "element operations per lane per cycle, by op class",
    "sram": "on-chip SRAM: three buffers, or one shared_kib",
    "dram": "the external memory the NPU streams from",
}
_KERNELS_NOTE = [
    "Optional: the kernels this NPU has, by name (docs/kernels.md: GEMM, SOFTMAX, aten.add.Tensor, ...) or by",
    f"kind ({', '.join(KERNEL_KINDS)}).",
    "`torch-ir partition MODEL --hw FILE` places the others on the CPU; without this table every kernel is assumed.",
]
_COMMENT_COLUMN = 32  # where a value's comment starts


def hardware_to_dict(hw: Hardware) -> dict[str, Any]:
    """``hw`` in the file format (``hardware_from_dict`` of it gives ``hw`` back, less its ``source``)."""
    sram = ({"shared_kib": _number(hw.sram_weights_bytes / 1024)} if hw.sram_shared else
            {k: _number(getattr(hw, f"sram_{k[:-4]}_bytes") / 1024) for k in SPLIT_SRAM})
    data: dict[str, Any] = {"name": hw.name, "clock_mhz": _number(hw.clock_mhz), "dataflow": hw.dataflow,
                            "dma_overlaps_compute": hw.dma_overlaps_compute}
    if hw.declared_native_dtype is not None:
        data["native_dtype"] = hw.declared_native_dtype
    data.update({
        "array": {"rows": hw.rows, "cols": hw.cols},
        "macs_per_cycle": {d: _number(hw.macs_per_cycle[d]) for d in MAC_DTYPES if d in hw.macs_per_cycle},
        "vector": {"lanes": hw.vector_lanes,
                   "ops_per_cycle": {c: _number(hw.vector_ops_per_cycle[c]) for c in VECTOR_CLASSES}},
        "sram": sram,
        "dram": {"bandwidth_gbps": _number(hw.dram_bandwidth_gbps), "latency_ns": _number(hw.dram_latency_ns)},
    })
    if hw.kernels is not None:
        data["kernels"] = {"supported": list(hw.kernels)}
    return data


def hardware_template(hw: Hardware | None = None) -> str:
    """A hardware file to start from, as TOML: every field with what it is, its unit and its allowed range
    (``RANGES``), the optional ones commented out when ``hw`` leaves them out. The values are ``hw``'s, by default
    the ``TEMPLATE_EXAMPLE`` preset's; the text loads back as ``hw`` (``load_hardware``)."""
    if hw is None:
        hw = dataclasses.replace(load_hardware(TEMPLATE_EXAMPLE), name=TEMPLATE_NAME)
    data = hardware_to_dict(hw)
    example = f" (the {TEMPLATE_EXAMPLE} preset)" if hw.name == TEMPLATE_NAME else ""
    lines = [
        f"# An NPU for the cost model: torch-ir cost MODEL --hw {TEMPLATE_NAME.replace('-', '_')}.toml",
        "# (docs/cost_model.md). Every field is required unless marked optional; unknown keys are refused.",
        f"# Each number must lie in the range beside it. The values are an example{example}: replace them.",
        "",
        _line("name", data["name"], f"a label for the reports: one line, at most {MAX_NAME_CHARS} characters"),
        _number_line("clock_mhz", data["clock_mhz"]),
        _line("dataflow", data["dataflow"], f"{', '.join(DATAFLOWS[:-1])} or {DATAFLOWS[-1]}"),
        _line("dma_overlaps_compute", data["dma_overlaps_compute"],
              "optional (default true): DRAM transfers run while the array computes"),
        _line("native_dtype", data.get("native_dtype", hw.native_dtype),
              "optional: the dtype `torch-ir cost` costs at; default: the fastest rate's",
              commented="native_dtype" not in data),
    ]
    for table in ("array", "macs_per_cycle", "vector", "sram", "dram"):
        lines += ["", _line(f"[{table}]", None, _TABLE_NOTES[table])]
        lines += _table_lines(table, data[table], hw)
    kernels = data.get("kernels", {"supported": ["GEMM", "CONV", "movement"]})
    commented = "kernels" not in data
    lines += ["", *(f"# {note}" for note in _KERNELS_NOTE), _line("[kernels]", None, None, commented=commented),
              _line("supported", kernels["supported"], None, commented=commented)]
    return "\n".join(lines) + "\n"


def _table_lines(table: str, values: dict[str, Any], hw: Hardware) -> list[str]:
    """The fields of one table, a nested table (``vector.ops_per_cycle``) after them under its own header."""
    lines: list[str] = []
    for key, value in values.items():
        if isinstance(value, dict):
            lines += [_line(f"[{table}.{key}]", None, _TABLE_NOTES[f"{table}.{key}"])]
            lines += [_number_line(f"{table}.{key}.{k}", v) for k, v in value.items()]
        else:
            lines.append(_number_line(f"{table}.{key}", value))
    if table == "macs_per_cycle":  # the optional widths the description leaves out, with the rule they follow
        for width, (source, factor) in DERIVED_RATES.items():
            if width not in values:
                lines.append(_line(width, _number(hw.mac_rate(width)), f"optional; left out: {factor:g} x {source}'s "
                                   f"rate. {_field_note(f'macs_per_cycle.{width}')}", commented=True))
    if table == "sram":  # the other form, to switch to
        other = (["weights_kib", "activations_kib", "accumulators_kib"] if hw.sram_shared else ["shared_kib"])
        example = _number(hw.sram_total_bytes / 1024)
        lines += [_line(k, values.get("shared_kib", example), None, commented=True, meaning_of=f"sram.{k}")
                  for k in other]
    return lines


def _number_line(name: str, value: float) -> str:
    """``key = value  # meaning: lo to hi unit`` for the field ``name`` of ``RANGES``."""
    return _line(name.rsplit(".", 1)[-1], value, _field_note(name))


def _field_note(name: str) -> str:
    rng = RANGES[name]
    whole = ", a whole number" if rng.integer else ""
    zero = f"; 0: {rng.zero}" if rng.zero else ""
    return f"{_MEANING[name]}: {rng.lo:g} to {rng.hi:g} {rng.unit}{whole}{zero}"


def _line(key: str, value: Any, note: str | None, *, commented: bool = False, meaning_of: str = "") -> str:
    """One line of the template: a ``key = value`` (or a ``[table]`` header when ``value`` is None) with its
    comment aligned; ``commented``: the whole line commented out (an optional field left out)."""
    if meaning_of:
        note = f"or instead, {_field_note(meaning_of)}"
    text = key if value is None else f"{key} = {_toml_value(value)}"
    text = f"# {text}" if commented else text
    return f"{text:<{_COMMENT_COLUMN - 1}} # {note}" if note else text


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):  # a TOML basic string: JSON's escapes, non-ASCII kept as it is (no surrogates)
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def _number(value: float) -> float | int:
    """A whole float as an int (``1000``, not ``1000.0``), for a file a person reads."""
    return int(value) if float(value).is_integer() and abs(value) < 2 ** 53 else value


__all__ = ["TEMPLATE_EXAMPLE", "TEMPLATE_NAME", "hardware_template", "hardware_to_dict"]
