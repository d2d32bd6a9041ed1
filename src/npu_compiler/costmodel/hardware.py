"""An NPU's description for the cost model: a MAC array, a vector unit, on-chip SRAM and a DRAM port.

A :class:`Hardware` is loaded from a TOML or JSON file (``load_hardware``), or from a preset shipped in
``presets/`` by name (``presets()`` lists them). The file format (every key required except
``dma_overlaps_compute``, which defaults to true; unknown keys are refused so a typo cannot pass silently)::

    name = "my-npu"
    clock_mhz = 1000
    dataflow = "output_stationary"     # or "weight_stationary", "input_stationary"
    dma_overlaps_compute = true        # DRAM transfers run while the array computes

    [array]                            # the MAC array: rows x cols processing elements
    rows = 32
    cols = 64

    [macs_per_cycle]                   # MACs per PE per cycle by dtype (a multiplier of rows x cols);
    int8 = 1.0                         # 0 = unsupported: such work is costed at the slowest supported
    fp16 = 0.5                         # rate and flagged
    bf16 = 0.5
    fp32 = 0

    [vector]                           # the vector unit of non-contraction kernels
    lanes = 64
    [vector.ops_per_cycle]             # element operations per lane per cycle, by op class
    elementwise = 1.0
    normalization = 0.25
    softmax = 0.25                     # exp-bound
    reduction = 1.0
    movement = 1.0

    [sram]                             # on-chip SRAM in KiB: three buffers ...
    weights_kib = 1024
    activations_kib = 1024
    accumulators_kib = 128
    # ... or one shared buffer instead:  shared_kib = 2048

    [dram]
    bandwidth_gbps = 17.0              # GB/s (1e9 bytes per second)
    latency_ns = 100                   # per dispatch (one DMA start-up)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch_ir.errors import TorchIRError

try:  # the standard library's from Python 3.11; tomli is the same parser for 3.10
    import tomllib as _toml
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    try:
        import tomli as _toml  # type: ignore[no-redef]
    except ModuleNotFoundError:
        _toml = None  # type: ignore[assignment]

PRESET_DIR = Path(__file__).parent / "presets"
DATAFLOWS = ("output_stationary", "weight_stationary", "input_stationary")
MAC_DTYPES = ("int8", "fp16", "bf16", "fp32")
VECTOR_CLASSES = ("elementwise", "normalization", "softmax", "reduction", "movement")
SPLIT_SRAM = ("weights_kib", "activations_kib", "accumulators_kib")


class HardwareError(TorchIRError, ValueError):
    """A hardware description is missing, unreadable or breaks a rule; the message names the file, the field,
    the rule and the fix."""


@dataclass(frozen=True)
class Hardware:
    """One NPU (see the module docstring for the file format). Sizes are in bytes, rates per cycle."""

    name: str
    rows: int
    cols: int
    dataflow: str
    clock_mhz: float
    #: MACs per PE per cycle by dtype class (int8, fp16, bf16, fp32); 0 = unsupported.
    macs_per_cycle: dict[str, float] = field(hash=False)
    vector_lanes: int
    #: Element operations per lane per cycle by op class (elementwise, normalization, softmax, reduction, movement).
    vector_ops_per_cycle: dict[str, float] = field(hash=False)
    sram_weights_bytes: int
    sram_activations_bytes: int
    sram_accumulators_bytes: int
    #: One SRAM shared by weights, activations and accumulators (the three sizes above are then all equal to it).
    sram_shared: bool
    dram_bandwidth_gbps: float
    dram_latency_ns: float
    dma_overlaps_compute: bool = True
    #: Where it was loaded from (a preset name or a path), for messages.
    source: str = ""

    @property
    def pes(self) -> int:
        """Processing elements of the array (rows x cols)."""
        return self.rows * self.cols

    @property
    def sram_total_bytes(self) -> int:
        if self.sram_shared:
            return self.sram_weights_bytes
        return self.sram_weights_bytes + self.sram_activations_bytes + self.sram_accumulators_bytes

    @property
    def dram_bytes_per_cycle(self) -> float:
        return self.dram_bandwidth_gbps * 1e9 / (self.clock_mhz * 1e6)

    @property
    def dram_latency_cycles(self) -> int:
        return math.ceil(self.dram_latency_ns * self.clock_mhz / 1000)

    def peak_tops(self, dtype: str = "int8") -> float:
        """Peak tera-operations per second (a MAC is two) at ``dtype``'s rate."""
        return 2 * self.pes * self.macs_per_cycle.get(dtype, 0) * self.clock_mhz * 1e6 / 1e12


def presets() -> list[str]:
    """Names of the shipped hardware presets, sorted."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def load_hardware(name_or_path: str | Path) -> Hardware:
    """A preset by name (``presets()``) or a ``.toml``/``.json`` file; raises ``HardwareError`` naming the
    file, the field, the rule and the fix."""
    text = str(name_or_path)
    if isinstance(name_or_path, str) and text in presets():
        path = PRESET_DIR / f"{text}.toml"
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise HardwareError(
                f"{text}: no such hardware file or preset; fix: give the path of a .toml or .json hardware file, "
                f"or a preset name ({', '.join(presets())})")
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".json"):
        raise HardwareError(f"{path}: a hardware file must end in .toml or .json, not {suffix or 'nothing'!r}; "
                            f"fix: rename it or convert it")
    if suffix == ".toml" and _toml is None:  # pragma: no cover - Python 3.10 without tomli
        raise HardwareError(f"{path}: reading TOML needs Python 3.11 or the tomli package; fix: pip install tomli, "
                            f"or give the same description as a .json file")
    decode_errors: tuple[type[Exception], ...] = (OSError, UnicodeDecodeError, json.JSONDecodeError)
    if _toml is not None:
        decode_errors += (_toml.TOMLDecodeError,)
    try:
        raw = path.read_bytes()
        data = _toml.loads(raw.decode("utf-8")) if suffix == ".toml" else json.loads(raw)
    except decode_errors as e:
        raise HardwareError(f"{path}: cannot be read as {suffix[1:].upper()}: {e}; fix: correct the syntax") from None
    return hardware_from_dict(data, str(path))


def hardware_from_dict(data: Any, source: str = "<dict>") -> Hardware:
    """Validate a parsed hardware description (the file format of the module docstring) and build it."""
    v = _Validator(source)
    top = v.table(data, "", {"name", "clock_mhz", "dataflow", "dma_overlaps_compute", "array", "macs_per_cycle",
                             "vector", "sram", "dram"}, optional={"dma_overlaps_compute"})
    name = top["name"]
    if not isinstance(name, str) or not name.strip():
        v.fail("name", "must be a non-empty string", 'write name = "my-npu"')
    dataflow = top["dataflow"]
    if dataflow not in DATAFLOWS:
        v.fail("dataflow", f"must be one of {', '.join(DATAFLOWS)}, not {dataflow!r}",
               'write dataflow = "output_stationary" (or one of the others)')
    overlap = top.get("dma_overlaps_compute", True)
    if not isinstance(overlap, bool):
        v.fail("dma_overlaps_compute", f"must be true or false, not {overlap!r}", "write true or false")
    array = v.table(top["array"], "array", {"rows", "cols"})
    macs = v.table(top["macs_per_cycle"], "macs_per_cycle", set(MAC_DTYPES))
    rates = {d: v.number(macs[d], f"macs_per_cycle.{d}", allow_zero=True) for d in MAC_DTYPES}
    if not any(rates.values()):
        v.fail("macs_per_cycle", "at least one dtype must have a rate above 0", "set int8 = 1.0 (say)")
    vector = v.table(top["vector"], "vector", {"lanes", "ops_per_cycle"})
    ops = v.table(vector["ops_per_cycle"], "vector.ops_per_cycle", set(VECTOR_CLASSES))
    sram = v.table(top["sram"], "sram", {"shared_kib", *SPLIT_SRAM}, optional={"shared_kib", *SPLIT_SRAM})
    if "shared_kib" in sram:
        if set(sram) & set(SPLIT_SRAM):
            v.fail("sram", "give either shared_kib or weights_kib, activations_kib and accumulators_kib, not both",
                   "keep one of the two forms")
        shared = _kib(v.number(sram["shared_kib"], "sram.shared_kib"))
        sizes = (shared, shared, shared)
    else:
        missing = [k for k in SPLIT_SRAM if k not in sram]
        if missing:
            v.fail(f"sram.{missing[0]}", "is missing (a split SRAM needs weights_kib, activations_kib and "
                   "accumulators_kib)", f"add {missing[0]} = <KiB>, or give one shared_kib instead")
        sizes = tuple(_kib(v.number(sram[k], f"sram.{k}")) for k in SPLIT_SRAM)
    dram = v.table(top["dram"], "dram", {"bandwidth_gbps", "latency_ns"})
    return Hardware(
        name=name, rows=v.integer(array["rows"], "array.rows"), cols=v.integer(array["cols"], "array.cols"),
        dataflow=dataflow, clock_mhz=v.number(top["clock_mhz"], "clock_mhz"), macs_per_cycle=rates,
        vector_lanes=v.integer(vector["lanes"], "vector.lanes"),
        vector_ops_per_cycle={c: v.number(ops[c], f"vector.ops_per_cycle.{c}") for c in VECTOR_CLASSES},
        sram_weights_bytes=sizes[0], sram_activations_bytes=sizes[1], sram_accumulators_bytes=sizes[2],
        sram_shared="shared_kib" in sram, dram_bandwidth_gbps=v.number(dram["bandwidth_gbps"], "dram.bandwidth_gbps"),
        dram_latency_ns=v.number(dram["latency_ns"], "dram.latency_ns", allow_zero=True),
        dma_overlaps_compute=overlap, source=source)


def _kib(value: float) -> int:
    return max(1, int(value * 1024))


class _Validator:
    """Error messages of one file: ``<file>: field `x.y`: <rule>; fix: <fix>``."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, name: str, rule: str, fix: str) -> None:
        where = f"field `{name}`" if name else "the top level"
        raise HardwareError(f"{self.source}: {where}: {rule}; fix: {fix}")

    def table(self, value: Any, name: str, keys: set[str], optional: set[str] | frozenset[str] = frozenset()
              ) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(name, f"must be a table, not {type(value).__name__}", f"write [{name}] with its keys")
        prefix = f"{name}." if name else ""
        unknown = sorted(set(value) - keys)
        if unknown:
            self.fail(prefix + unknown[0], f"is not a known key (known here: {', '.join(sorted(keys))})",
                      "remove it or correct its spelling")
        missing = sorted(keys - set(value) - set(optional))
        if missing:
            self.fail(prefix + missing[0], "is missing", f"add {missing[0]} (see npu_compiler.costmodel.hardware)")
        return value

    def number(self, value: Any, name: str, allow_zero: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.fail(name, f"must be a number, not {value!r}", "write a finite number")
        if value < 0 or (value == 0 and not allow_zero):
            self.fail(name, f"must be {'zero or ' if allow_zero else ''}positive, not {value!r}",
                      "write a positive value")
        return float(value)

    def integer(self, value: Any, name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            self.fail(name, f"must be a positive integer, not {value!r}", "write a whole number above 0")
        return value


__all__ = ["DATAFLOWS", "MAC_DTYPES", "VECTOR_CLASSES", "Hardware", "HardwareError", "hardware_from_dict",
           "load_hardware", "presets"]
