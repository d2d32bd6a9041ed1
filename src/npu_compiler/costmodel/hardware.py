"""An NPU's description for the cost model: a MAC array, a vector unit, on-chip SRAM and a DRAM port.

A :class:`Hardware` is loaded from a TOML or JSON file (``load_hardware``), or from a preset shipped in
``presets/`` by name (``presets()`` lists them). The file format (every key required except
``dma_overlaps_compute``, which defaults to true, ``native_dtype`` and the ``[kernels]`` table; unknown keys are
refused so a typo cannot pass silently; ``torch-ir cost --hw-template FILE`` writes this, every field commented
with its unit and range, from ``hardware_template``)::

    name = "my-npu"
    clock_mhz = 1000
    dataflow = "output_stationary"     # or "weight_stationary", "input_stationary"
    dma_overlaps_compute = true        # DRAM transfers run while the array computes
    native_dtype = "int8"              # optional: what `torch-ir cost` costs at by default (without it: the
                                       # dtype of the highest MAC rate)

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

    [kernels]                          # optional: the kernels this NPU has, by name or kind (``KERNEL_KINDS``);
    supported = ["GEMM", "CONV", "CONV_ADD", "movement"]   # `torch-ir partition --hw` puts the rest on the CPU

Every number must lie in its field's physical range (``RANGES``: a clock from 1 kHz to 100 GHz, memory from a
byte to a petabyte, ...): a file is untrusted input, and a value outside those ranges (``clock_mhz = 1e308``, a
denormal rate, a 5,000-digit integer) is refused with the field's name instead of overflowing the model or
costing a program at a meaningless speed. The file itself must be a regular file of at most
``MAX_FILE_BYTES``, UTF-8, strict (no duplicate keys), and at most a few tables deep.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from npu_program.kernels import KERNELS
from torch_ir.errors import InputReadError, LimitExceededError, TorchIRError
from torch_ir.fileio import check_regular_file, read_input

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
#: A hardware file is a page of text (the presets are about 1 KiB): anything larger is refused unread.
MAX_FILE_BYTES = 1 << 20
#: Digits of the longest number literal read (a valid field needs at most about 15): a longer one is refused
#: before it is converted, so that no file makes Python convert (or refuse, past 4300 digits) a huge integer.
MAX_NUMBER_DIGITS = 100
#: The longest hardware name: a label shown in reports, one line.
MAX_NAME_CHARS = 200
#: Kernel kinds a ``[kernels] supported`` entry may name for all the kernels of that kind (host kernels run on
#: the host CPU whatever an NPU declares, so "host" is not one).
KERNEL_KINDS = tuple(sorted({k.kind for k in KERNELS.values()} - {"host"}))
#: The most entries ``[kernels] supported`` may list (every kernel and kind once is about 160).
MAX_KERNEL_ENTRIES = 1000


class HardwareError(TorchIRError, ValueError):
    """A hardware description is missing, unreadable or breaks a rule; the message names the file, the field,
    the rule and the fix."""


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
        return 2 * self.pes * self.macs_per_cycle.get(dtype, 0) * self.clock_mhz * 1e6 / 1e12

    @property
    def native_dtype(self) -> str:
        """The precision the part is built for, which ``torch-ir cost`` costs at unless told otherwise: the
        declared ``native_dtype``, else the dtype of the highest MAC rate (a tie goes to the narrower dtype, the
        one a deployment would quantize to; ``MAC_DTYPES`` order)."""
        if self.declared_native_dtype is not None:
            return self.declared_native_dtype
        return max(MAC_DTYPES, key=lambda d: (self.macs_per_cycle.get(d, 0.0), -MAC_DTYPES.index(d)))

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
    if suffix == ".toml" and _toml is None:  # pragma: no cover - Python 3.10 without tomli
        raise HardwareError(f"{path}: reading TOML needs Python 3.11 or the tomli package; fix: pip install tomli, "
                            f"or give the same description as a .json file")
    text = _decode(_read(path), path)
    data = _parse_toml(text, path) if suffix == ".toml" else _parse_json(text, path)
    return hardware_from_dict(data, str(path))


def _read(path: Path) -> bytes:
    """The file's bytes: a regular file (a FIFO, a device or a link to one is refused before it is opened) of
    at most ``MAX_FILE_BYTES``, read with that bound."""
    fix = "give the path of a regular .toml or .json hardware file"
    try:
        check_regular_file(path, "hardware file", fix)
        _check_size(path, path.stat().st_size)
        data = read_input(path, "hardware file", fix)
    except (InputReadError, LimitExceededError) as err:
        raise HardwareError(str(err)) from None
    except OSError as err:  # removed or made unreadable between the checks
        raise HardwareError(f"hardware file {path}: cannot be read ({err.strerror or err}); fix: {fix}") from None
    _check_size(path, len(data))  # it grew after it was checked
    return data


def _check_size(path: Path, size: int) -> None:
    if size > MAX_FILE_BYTES:
        raise HardwareError(f"hardware file {path}: is {size:,} bytes, over the {MAX_FILE_BYTES:,} bytes a hardware "
                            "description may take (one is about 1 KiB); fix: give the hardware description itself")


def _decode(raw: bytes, path: Path) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise HardwareError(f"hardware file {path}: is not UTF-8 text (byte 0x{raw[err.start]:02x} at offset "
                            f"{err.start}); fix: save it as UTF-8") from None


def _too_deep(path: Path) -> HardwareError:
    return HardwareError(f"hardware file {path}: is nested too deeply to be a hardware description (it has at "
                         "most three levels of tables); fix: correct the file")


def _parse_json(text: str, path: Path) -> Any:
    """Strict JSON: a duplicate key is refused (json keeps the last one silently); NaN and Infinity are read,
    for the field check to name them; an over-long number is kept unconverted (``_LongNumber``)."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_int=_json_int, parse_float=_json_float)
    except json.JSONDecodeError as err:
        raise HardwareError(f"hardware file {path}: cannot be read as JSON (line {err.lineno}, column {err.colno}: "
                            f"{err.msg}); fix: correct the syntax") from None
    except _DuplicateKeyError as err:
        raise HardwareError(f"hardware file {path}: key {_quote(err.key)} appears twice in one object (JSON "
                            "readers disagree on which one wins); fix: keep one of them") from None
    except RecursionError:
        raise _too_deep(path) from None


def _parse_toml(text: str, path: Path) -> Any:
    """TOML (the parser refuses duplicate keys itself); an over-long number is refused, naming its field,
    before the parser would convert it."""
    long = _long_literal(text)
    if long:
        number, name = _LongNumber(long.group()), _toml_field_at(text, long.start())
        if name is None:
            raise HardwareError(f"hardware file {path}: line {text.count(chr(10), 0, long.start()) + 1}: {number} is "
                                "longer than any number of a hardware file; fix: correct the value")
        _Validator(str(path)).out_of_range(name, number)
    try:
        return _toml.loads(text)
    except _toml.TOMLDecodeError as err:
        raise HardwareError(f"hardware file {path}: cannot be read as TOML ({err}); fix: correct the syntax") from None
    except ValueError as err:  # a value the parser could not convert (its own error names no line)
        raise HardwareError(f"hardware file {path}: cannot be read as TOML ({err}); fix: correct the value") from None
    except RecursionError:
        raise _too_deep(path) from None


class _DuplicateKeyError(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for key, value in pairs:
        if key in table:
            raise _DuplicateKeyError(key)
        table[key] = value
    return table


@dataclass(frozen=True)
class _LongNumber:
    """A number literal longer than ``MAX_NUMBER_DIGITS``, left unconverted: the field check refuses it by name."""

    literal: str

    def __str__(self) -> str:
        return f"a number of {sum(c.isdigit() for c in self.literal):,} digits"


#: A run of digits, with TOML's ``_`` between them.
_DIGIT_RUN = re.compile(r"[0-9][0-9_]*")


def _long_literal(text: str) -> re.Match[str] | None:
    """The first run of more than ``MAX_NUMBER_DIGITS`` digits in ``text`` (one linear scan)."""
    for run in _DIGIT_RUN.finditer(text):
        if len(run.group()) > MAX_NUMBER_DIGITS and sum(c.isdigit() for c in run.group()) > MAX_NUMBER_DIGITS:
            return run
    return None


def _json_int(literal: str) -> int | _LongNumber:
    return _LongNumber(literal) if len(literal) > MAX_NUMBER_DIGITS else int(literal)


def _json_float(literal: str) -> float | _LongNumber:
    return _LongNumber(literal) if len(literal) > MAX_NUMBER_DIGITS else float(literal)


#: A TOML key before its ``=`` (bare or quoted, dotted).
_TOML_KEY = re.compile(r"([A-Za-z0-9_.\"'-]+)\s*=")


def _toml_field_at(text: str, pos: int) -> str | None:
    """The dotted field a TOML value at ``pos`` belongs to, as far as its line tells (for a message only): the
    last ``[table]`` header above it and the last ``key =`` before it on its line. The text is hostile: the key
    is looked for in the last 200 characters only and headers without a pattern, so that no line of a million
    brackets or letters makes a regular expression backtrack quadratically."""
    line_start = text.rfind("\n", 0, pos) + 1
    keys = _TOML_KEY.findall(text[max(line_start, pos - 200):pos])
    header = next((line.strip().strip("[]").strip() for line in reversed(text[:line_start].splitlines())
                   if line.lstrip().startswith("[")), "")
    name = ".".join(part.strip("\"'") for part in (header, keys[-1] if keys else "") if part)
    return name or None


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
    macs = v.table(top["macs_per_cycle"], "macs_per_cycle", set(MAC_DTYPES))
    rates = {d: v.number(macs[d], f"macs_per_cycle.{d}") for d in MAC_DTYPES}
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
        if not isinstance(entry, str) or entry not in known:
            v.fail("kernels.supported", f"names {_show(entry)}, which is neither a kernel nor a kernel kind "
                   f"({', '.join(KERNEL_KINDS)}){_did_you_mean(entry, known)}",
                   "use the names of docs/kernels.md (SOFTMAX, GEMM, aten.add.Tensor, ...) or a kind")
    return tuple(dict.fromkeys(supported))  # the order written, each entry once


def _did_you_mean(entry: Any, known: set[str]) -> str:
    if not isinstance(entry, str) or len(entry) > 100:  # no fuzzy match over a hostile megabyte string
        return ""
    close = difflib.get_close_matches(entry, sorted(known), n=1)
    return f"; did you mean {_quote(close[0])}?" if close else ""


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
        where = f"field {_quote(name)}" if name else "the top level"
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
        if isinstance(value, _LongNumber):
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


def _quote(name: str) -> str:
    """A field name in double quotes, with any newline or control character escaped and its length bounded
    (an unknown key is the file's text)."""
    text = json.dumps(name)
    return text if len(text) <= 80 else text[:76] + '..."'


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
        return _quote(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return f"an array of {len(value)} item{'s' if len(value) != 1 else ''}"
    if value is None:
        return "null"
    if isinstance(value, _LongNumber):
        return str(value)
    return f"a {type(value).__name__} ({_quote(str(value))})"  # a TOML date or time


# -- writing a description -----------------------------------------------------------------------------------------

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
    "macs_per_cycle": "MACs per PE per cycle by dtype (one at least above 0)",
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
        "macs_per_cycle": {d: _number(hw.macs_per_cycle[d]) for d in MAC_DTYPES},
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
    kernels = data.get("kernels", {"supported": ["GEMM", "CONV", "CONV_ADD", "movement"]})
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


__all__ = ["DATAFLOWS", "KERNEL_KINDS", "MAC_DTYPES", "MAX_FILE_BYTES", "RANGES", "VECTOR_CLASSES", "Hardware",
           "HardwareError", "Range", "hardware_from_dict", "hardware_template", "hardware_to_dict", "load_hardware",
           "presets"]
