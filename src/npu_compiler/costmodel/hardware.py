"""An NPU's description for the cost model: a MAC array, a vector unit, on-chip SRAM and a DRAM port.

A :class:`Hardware` is loaded from a TOML or JSON file (``load_hardware``), or from a preset shipped in
``presets/`` by name (``presets()`` lists them). The file format (every key required except
``dma_overlaps_compute``, which defaults to true, ``native_dtype`` and the ``[kernels]`` table; unknown keys are
refused so a typo cannot pass silently; ``torch-ir cost --hw-template FILE`` writes this, every field commented
with its unit and range, from ``hardware_template.hardware_template``)::

    name = "my-npu"
    clock_mhz = 1000
    dataflow = "output_stationary"     # or "weight_stationary", "input_stationary"
    dma_overlaps_compute = true        # DRAM transfers run while the array computes
    native_dtype = "int8"              # optional: what `torch-ir cost` costs at by default (without it: the
                                       # dtype of the highest MAC rate)

    [array]                            # the MAC array: rows x cols processing elements
    rows = 32
    cols = 64

    [macs_per_cycle]                   # MACs per PE per cycle by operand width (a multiplier of rows x cols);
    int8 = 1.0                         # 0 = unsupported: float work is costed at the slowest supported
    fp16 = 0.5                         # rate and flagged, quantized work refused (``mac_rate``)
    bf16 = 0.5
    fp32 = 0
    int4 = 2.0                         # optional, as int16 and fp8: a width left out takes the rate of
    int16 = 0.5                        # the rule of ``DERIVED_RATES`` (int4: int8's, int16: half of
                                       # int8's, fp8: fp16's)

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

    [kernels]                          # optional: the kernels this NPU has, by name or kind (``KERNEL_KINDS``);
    supported = ["GEMM", "CONV", "movement"]   # `torch-ir partition --hw` puts the rest on the CPU

Every number must lie in its field's physical range (``RANGES``: a clock from 1 kHz to 100 GHz, memory from a
byte to a petabyte, ...): a file is untrusted input, and a value outside those ranges (``clock_mhz = 1e308``, a
denormal rate, a 5,000-digit integer) is refused with the field's name instead of overflowing the model or
costing a program at a meaningless speed. The file itself must be a regular file of at most
``MAX_FILE_BYTES``, UTF-8, strict (no duplicate keys), and at most a few tables deep.
"""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from npu_program.kernels import KERNEL_ALIASES, KERNELS

from .hardware_file import MAX_FILE_BYTES, HardwareError, LongNumber, quote, read_description

PRESET_DIR = Path(__file__).parent / "presets"
#: The preset the views and reports that cost a program on their own (`--report-dynamic`, `torch-ir report`,
#: `torch-ir view`) use when not given `--hw`.
DEFAULT_PRESET = "edge_4tops"
DATAFLOWS = ("output_stationary", "weight_stationary", "input_stationary")
#: Operand widths with a MAC rate, narrowest first (a tie of ``native_dtype`` goes to the narrower).
MAC_DTYPES = ("int4", "int8", "fp8", "int16", "fp16", "bf16", "fp32")
#: The widths every file gives (the rest may be left out: ``DERIVED_RATES``).
REQUIRED_RATES = ("int8", "fp16", "bf16", "fp32")
#: The rule that gives a width a file leaves out its rate: (the width it is derived from, the factor). int4 codes
#: are unpacked onto the 8-bit multipliers (no faster than int8); a 16-bit integer operand takes two passes of an
#: 8-bit multiplier (int16 x int8 at half the int8 rate, as TPU v1's 8 x 16 bits); fp8 is widened to fp16 in the PE.
DERIVED_RATES: dict[str, tuple[str, float]] = {"int4": ("int8", 1.0), "int16": ("int8", 0.5), "fp8": ("fp16", 1.0)}
VECTOR_CLASSES = ("elementwise", "normalization", "softmax", "reduction", "movement")
SPLIT_SRAM = ("weights_kib", "activations_kib", "accumulators_kib")
#: The longest hardware name: a label shown in reports, one line.
MAX_NAME_CHARS = 200
#: Kernel kinds a ``[kernels] supported`` entry may name for all the kernels of that kind (host kernels run on
#: the host CPU whatever an NPU declares, so "host" is not one).
KERNEL_KINDS = tuple(sorted({k.kind for k in KERNELS.values()} - {"host"}))
#: The most entries ``[kernels] supported`` may list (every kernel and kind once is about 160).
MAX_KERNEL_ENTRIES = 1000


@dataclass(frozen=True)
class Range:
    """The values one number of a hardware file may take: ``lo``..``hi`` (inclusive) in ``unit``, and also
    exactly 0 where ``zero`` says what 0 means; ``integer``: whole numbers only."""

    lo: float
    hi: float
    unit: str
    words: str  # the range in plain words, for messages and the docs
    integer: bool = False
    zero: str = ""

    def describe(self) -> str:
        span = f"{self.lo:g}..{self.hi:g} {self.unit} ({self.words})"
        return f"0 ({self.zero}) or {span}" if self.zero else span

    def fix(self) -> str:
        return f"write a value from {self.lo:g} to {self.hi:g} {self.unit}" + (" (or 0)" if self.zero else "")

    def holds(self, value: float) -> bool:
        return (value == 0 and bool(self.zero)) or self.lo <= value <= self.hi


#: The range of every number of a hardware file, by field: the one place these bounds live (docs/cost_model.md
#: shows the same table). Wide enough for any real part; narrow enough that every cycle count, rate and plot
#: coordinate the model derives from them stays a finite, non-zero float (no overflow, no division by zero).
RANGES: dict[str, Range] = {
    "clock_mhz": Range(1e-3, 1e5, "MHz", "1 kHz to 100 GHz"),
    "array.rows": Range(1, 65536, "PEs", "a whole number", integer=True),
    "array.cols": Range(1, 65536, "PEs", "a whole number", integer=True),
    **{f"macs_per_cycle.{d}": Range(1e-3, 1e3, "MACs per PE per cycle", "a thousandth to a thousand",
                                    zero="unsupported") for d in MAC_DTYPES},
    "vector.lanes": Range(1, 65536, "lanes", "a whole number", integer=True),
    **{f"vector.ops_per_cycle.{c}": Range(1e-3, 1e3, "ops per lane per cycle", "a thousandth to a thousand")
       for c in VECTOR_CLASSES},
    **{f"sram.{k}": Range(1e-3, 1e12, "KiB", "a byte to a petabyte") for k in ("shared_kib", *SPLIT_SRAM)},
    "dram.bandwidth_gbps": Range(1e-6, 1e6, "GB/s", "1 kB/s to 1 PB/s"),
    "dram.latency_ns": Range(1e-3, 1e9, "ns", "a picosecond to a second", zero="no latency"),
}


@dataclass(frozen=True)
class Hardware:
    """One NPU (see the module docstring for the file format, ``RANGES`` for each number's range). Sizes are in
    bytes, rates per cycle."""

    name: str
    rows: int
    cols: int
    dataflow: str
    clock_mhz: float
    #: MACs per PE per cycle by operand width as the file gives them (int8, fp16, bf16, fp32, and any of int4,
    #: int16, fp8 it gives); 0 = unsupported. ``mac_rate`` adds the derived widths.
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
    #: The file's ``native_dtype`` (None: not declared; ``native_dtype`` then picks the fastest MAC rate).
    declared_native_dtype: str | None = None
    #: The file's ``[kernels] supported`` list as written (kernel names or kinds); None: not declared, every
    #: kernel of the compile target is assumed.
    kernels: tuple[str, ...] | None = None

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
        return 2 * self.pes * self.mac_rate(dtype) * self.clock_mhz * 1e6 / 1e12

    def mac_rate(self, width: str) -> float:
        """MACs per PE per cycle at operand width ``width`` (``MAC_DTYPES``): the file's, or for a width it leaves
        out, the rate ``DERIVED_RATES`` derives from another; 0 when unsupported (or unknown)."""
        if width in self.macs_per_cycle:
            return self.macs_per_cycle[width]
        if width in DERIVED_RATES:
            source, factor = DERIVED_RATES[width]
            return self.macs_per_cycle.get(source, 0.0) * factor
        return 0.0

    def rate_origin(self, width: str) -> str:
        """Where ``mac_rate(width)`` comes from, for messages: ``macs_per_cycle.int16 of <file>``, or the rule."""
        if width in self.macs_per_cycle or width not in DERIVED_RATES:
            return f"macs_per_cycle.{width} of {self.described_in}"
        source, factor = DERIVED_RATES[width]
        return (f"macs_per_cycle.{width}, which {self.described_in} leaves out: derived as {factor:g} x "
                f"macs_per_cycle.{source}")

    @property
    def native_dtype(self) -> str:
        """The precision the part is built for, which ``torch-ir cost`` costs at unless told otherwise: the
        declared ``native_dtype``, else the dtype of the highest MAC rate (a tie goes to the narrower dtype, the
        one a deployment would quantize to; ``MAC_DTYPES`` order)."""
        if self.declared_native_dtype is not None:
            return self.declared_native_dtype
        declared = [d for d in MAC_DTYPES if d in self.macs_per_cycle]  # a derived rate is no design point
        return max(declared, key=lambda d: (self.macs_per_cycle[d], -MAC_DTYPES.index(d)))

    @property
    def described_in(self) -> str:
        """Where this description came from, for messages: ``preset tpu_v1`` or the file's path."""
        path = Path(self.source)
        return f"preset {path.stem}" if path.parent == PRESET_DIR else self.source or self.name

    def kernel_names(self) -> frozenset[str] | None:
        """The kernels the ``[kernels] supported`` list names, its kinds expanded; None when not declared."""
        if self.kernels is None:
            return None
        return frozenset(name for name, record in KERNELS.items()
                         if name in self.kernels or record.kind in self.kernels)


def presets() -> list[str]:
    """Names of the shipped hardware presets, sorted."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


# -- reading a file -------------------------------------------------------------------------------------------------

def load_hardware(name_or_path: str | Path) -> Hardware:
    """A preset by name (``presets()``) or a ``.toml``/``.json`` file; raises ``HardwareError`` naming the
    file, the field, the rule and the fix."""
    text = str(name_or_path)
    if isinstance(name_or_path, str) and text in presets():
        path = PRESET_DIR / f"{text}.toml"
    else:
        path = Path(name_or_path)
        if not os.path.lexists(path):  # a dangling link exists: read_input says so
            raise HardwareError(
                f"{text}: no such hardware file or preset; fix: give the path of a .toml or .json hardware file, "
                f"or a preset name ({', '.join(presets())})")
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".json"):
        raise HardwareError(f"{path}: a hardware file must end in .toml or .json, not {suffix or 'nothing'!r}; "
                            f"fix: rename it or convert it")
    data = read_description(path, suffix, _Validator(str(path)).out_of_range)
    return hardware_from_dict(data, str(path))


# -- checking the description ---------------------------------------------------------------------------------------

def hardware_from_dict(data: Any, source: str = "<dict>") -> Hardware:
    """Validate a parsed hardware description (the file format of the module docstring, the ranges of
    ``RANGES``) and build it."""
    v = _Validator(source)
    top = v.table(data, "", {"name", "clock_mhz", "dataflow", "dma_overlaps_compute", "native_dtype", "array",
                             "macs_per_cycle", "vector", "sram", "dram", "kernels"},
                  optional={"dma_overlaps_compute", "native_dtype", "kernels"})
    dataflow = top["dataflow"]
    if not isinstance(dataflow, str) or dataflow not in DATAFLOWS:
        v.fail("dataflow", f"= {_show(dataflow)} must be one of {', '.join(DATAFLOWS)}",
               'write dataflow = "output_stationary" (or one of the others)')
    overlap = top.get("dma_overlaps_compute", True)
    if not isinstance(overlap, bool):
        v.fail("dma_overlaps_compute", f"= {_show(overlap)} must be true or false", "write true or false")
    array = v.table(top["array"], "array", {"rows", "cols"})
    macs = v.table(top["macs_per_cycle"], "macs_per_cycle", set(MAC_DTYPES), optional=set(DERIVED_RATES))
    rates = {d: v.number(macs[d], f"macs_per_cycle.{d}") for d in MAC_DTYPES if d in macs}
    if not any(rates.values()):
        v.fail("macs_per_cycle", "has no dtype with a rate above 0", "set int8 = 1.0 (say)")
    vector = v.table(top["vector"], "vector", {"lanes", "ops_per_cycle"})
    ops = v.table(vector["ops_per_cycle"], "vector.ops_per_cycle", set(VECTOR_CLASSES))
    dram = v.table(top["dram"], "dram", {"bandwidth_gbps", "latency_ns"})
    sizes = _sram_bytes(v, v.table(top["sram"], "sram", {"shared_kib", *SPLIT_SRAM},
                                   optional={"shared_kib", *SPLIT_SRAM}))
    return Hardware(
        name=_name(v, top["name"]), rows=v.integer(array["rows"], "array.rows"),
        cols=v.integer(array["cols"], "array.cols"), dataflow=dataflow,
        clock_mhz=v.number(top["clock_mhz"], "clock_mhz"), macs_per_cycle=rates,
        vector_lanes=v.integer(vector["lanes"], "vector.lanes"),
        vector_ops_per_cycle={c: v.number(ops[c], f"vector.ops_per_cycle.{c}") for c in VECTOR_CLASSES},
        sram_weights_bytes=sizes[0], sram_activations_bytes=sizes[1], sram_accumulators_bytes=sizes[2],
        sram_shared="shared_kib" in top["sram"],
        dram_bandwidth_gbps=v.number(dram["bandwidth_gbps"], "dram.bandwidth_gbps"),
        dram_latency_ns=v.number(dram["latency_ns"], "dram.latency_ns"),
        dma_overlaps_compute=overlap, source=source,
        declared_native_dtype=_native_dtype(v, top.get("native_dtype"), rates),
        kernels=_kernels(v, top["kernels"]) if "kernels" in top else None)


def _native_dtype(v: _Validator, dtype: Any, rates: dict[str, float]) -> str | None:
    """The declared native dtype: one of ``MAC_DTYPES`` the array runs (a rate above 0)."""
    if dtype is None:
        return None
    if not isinstance(dtype, str) or dtype not in MAC_DTYPES:
        v.fail("native_dtype", f"= {_show(dtype)} must be one of {', '.join(MAC_DTYPES)}",
               'write native_dtype = "int8" (say), or leave it out to take the dtype of the highest MAC rate')
    if dtype not in rates:
        v.fail("native_dtype", f"= {_show(dtype)} names a width the file gives no rate for",
               f"give macs_per_cycle.{dtype} a rate, or name a width the file rates")
    if not rates[dtype]:
        v.fail("native_dtype", f"= {_show(dtype)} has no MAC rate (macs_per_cycle.{dtype} = 0)",
               f"give macs_per_cycle.{dtype} a rate, or name a dtype the array runs")
    return dtype


def _kernels(v: _Validator, table: Any) -> tuple[str, ...]:
    """``[kernels] supported``: a list of kernel names (``npu_program.kernels``) or kinds (``KERNEL_KINDS``)."""
    supported = v.table(table, "kernels", {"supported"})["supported"]
    if not isinstance(supported, list) or len(supported) > MAX_KERNEL_ENTRIES:
        v.fail("kernels.supported", f"= {_show(supported)} must be a list of at most {MAX_KERNEL_ENTRIES} kernel "
               "names or kinds", 'write supported = ["GEMM", "CONV", ...]')
    known = set(KERNELS) | set(KERNEL_KINDS)
    for entry in supported:
        if not isinstance(entry, str) or (entry not in known and entry not in KERNEL_ALIASES):
            v.fail("kernels.supported", f"names {_show(entry)}, which is neither a kernel nor a kernel kind "
                   f"({', '.join(KERNEL_KINDS)}){_did_you_mean(entry, known)}",
                   "use the names of docs/kernels.md (SOFTMAX, GEMM, aten.add.Tensor, ...) or a kind")
    # an older file's kernel name (CONV_ADD) reads as the kernel it is now; the order written, each entry once
    return tuple(dict.fromkeys(KERNEL_ALIASES[e][0] if e in KERNEL_ALIASES else e for e in supported))


def _did_you_mean(entry: Any, known: set[str]) -> str:
    if not isinstance(entry, str) or len(entry) > 100:  # no fuzzy match over a hostile megabyte string
        return ""
    close = difflib.get_close_matches(entry, sorted(known), n=1)
    return f"; did you mean {quote(close[0])}?" if close else ""


def _name(v: _Validator, name: Any) -> str:
    """A one-line label: reports and the summary print it as it is."""
    if not isinstance(name, str) or not name.strip():
        v.fail("name", f"= {_show(name)} must be a non-empty string", 'write name = "my-npu"')
    if len(name) > MAX_NAME_CHARS or not name.isprintable():
        v.fail("name", f"= {_show(name)} must be one line of at most {MAX_NAME_CHARS} printable characters "
               "(no newlines or control characters)", 'write a short label, e.g. name = "my-npu"')
    return name


def _sram_bytes(v: _Validator, sram: dict[str, Any]) -> tuple[int, int, int]:
    """(weights, activations, accumulators) in bytes; one shared size three times."""
    if "shared_kib" in sram:
        if set(sram) & set(SPLIT_SRAM):
            v.fail("sram", "gives both shared_kib and weights_kib, activations_kib and accumulators_kib",
                   "keep one of the two forms, not both")
        shared = _kib(v.number(sram["shared_kib"], "sram.shared_kib"))
        return shared, shared, shared
    missing = [k for k in SPLIT_SRAM if k not in sram]
    if missing:
        v.fail(f"sram.{missing[0]}", "is missing (a split SRAM needs weights_kib, activations_kib and "
               "accumulators_kib)", f"add {missing[0]} = <KiB>, or give one shared_kib instead")
    w, a, acc = (_kib(v.number(sram[k], f"sram.{k}")) for k in SPLIT_SRAM)
    return w, a, acc


def _kib(value: float) -> int:
    return max(1, int(value * 1024))


class _Validator:
    """Error messages of one file: ``hardware file <path>: field "x.y" = <value> <rule>; fix: <fix>``."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.label = f"hardware {source}" if source.startswith("<") else f"hardware file {source}"

    def fail(self, name: str, rule: str, fix: str) -> NoReturn:
        where = f"field {quote(name)}" if name else "the top level"
        raise HardwareError(f"{self.label}: {where} {rule}; fix: {fix}")

    def table(self, value: Any, name: str, keys: set[str], optional: set[str] | frozenset[str] = frozenset()
              ) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(name, f"must be a table, not {_show(value)}", f"write [{name or 'the fields'}] with its keys")
        prefix = f"{name}." if name else ""
        unknown = sorted((k for k in value if k not in keys), key=str)
        if unknown:
            self.fail(prefix + str(unknown[0]), f"is not a known key (known here: {', '.join(sorted(keys))})",
                      "remove it or correct its spelling")
        missing = sorted(keys - set(value) - set(optional))
        if missing:
            self.fail(prefix + missing[0], "is missing", f"add {missing[0]} (see npu_compiler.costmodel.hardware)")
        return value

    def number(self, value: Any, name: str) -> float:
        """``value`` checked against ``RANGES[name]``: a finite number (not a boolean), whole where the range
        is, within the range."""
        rng = RANGES[name]
        shown, fix = _show(value), rng.fix()
        if isinstance(value, LongNumber):
            self.out_of_range(name, value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            kind = " (a boolean is not one)" if isinstance(value, bool) else ""
            self.fail(name, f"= {shown} must be a number in {rng.describe()}{kind}", fix)
        if isinstance(value, float) and not math.isfinite(value):  # (an int may be too large to convert)
            self.fail(name, f"= {shown} must be a finite number in {rng.describe()}", fix)
        if rng.integer and (not isinstance(value, int) or value < 1):
            self.fail(name, f"= {shown} is not a positive integer ({rng.describe()})", "write a whole number above 0")
        if value < 0 or (value == 0 and not rng.zero):
            self.fail(name, f"= {shown} must be {'0 or ' if rng.zero else ''}positive: {rng.describe()}", fix)
        if not rng.holds(value):
            self.out_of_range(name, value)
        return float(value)

    def integer(self, value: Any, name: str) -> int:
        """``number`` for a field whose range is whole numbers."""
        self.number(value, name)
        return int(value)

    def out_of_range(self, name: str, value: Any) -> NoReturn:
        rng = RANGES.get(name)
        if rng is None:  # an over-long number in a field without a range (an unknown or misplaced key)
            self.fail(name, f"= {_show(value)} is longer than any number of a hardware file", "correct the value")
        self.fail(name, f"= {_show(value)} is outside {rng.describe()}", rng.fix())


def _show(value: Any) -> str:
    """A value for a message, on one line and bounded: a 1,000-deep array or a 5,000-digit integer is
    described, not printed (``str`` of such an integer raises, ``repr`` of such an array recurses)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if value.bit_length() > 64:
            return f"an integer of about {math.floor(value.bit_length() * math.log10(2)) + 1:,} digits"
        return str(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return f"an array of {len(value)} item{'s' if len(value) != 1 else ''}"
    if value is None:
        return "null"
    if isinstance(value, LongNumber):
        return str(value)
    return f"a {type(value).__name__} ({quote(str(value))})"  # a TOML date or time



__all__ = ["DATAFLOWS", "DERIVED_RATES", "KERNEL_KINDS", "MAC_DTYPES", "MAX_FILE_BYTES", "RANGES", "REQUIRED_RATES",
           "VECTOR_CLASSES", "Hardware", "HardwareError", "Range", "hardware_from_dict", "load_hardware", "presets"]
