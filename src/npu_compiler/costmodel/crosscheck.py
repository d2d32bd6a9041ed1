"""Cross-check of the cost model against SCALE-Sim v3 (``pip install scalesim``) on GEMM and convolution shapes.

Each :class:`Shape` is costed twice on one :class:`ArrayConfig` (rows x cols, dataflow, SRAM sizes):

* **ours**: a one-dispatch ``CompiledProgram`` (a ``GEMM``, or a ``CONV`` over the already padded input, as
  SCALE-Sim has no padding) through ``cost_program`` with ``dtype="int8"``, so one byte is one SCALE-Sim word;
* **theirs**: SCALE-Sim's own layer simulation (``single_layer_sim``), driven in-process from a ``.cfg`` and a
  topology ``.csv`` written into a temporary directory, its printing swallowed. It runs in its "CALC" bandwidth
  mode (no DRAM stalls), so its cycles are the array's compute cycles.

The figures compared (:data:`METRICS`): compute cycles, SRAM reads (IFMAP + filter), SRAM writes (OFMAP),
DRAM reads (IFMAP + filter) and DRAM writes (OFMAP), all in words. ``docs/cost_model.md`` ("Where we differ
from SCALE-Sim, and why") says which figures differ by design; those are reported, not gated
(:meth:`Comparison.gated`).

    >>> from npu_compiler.costmodel.crosscheck import ArrayConfig, Shape, compare
    >>> rows = compare([Shape.gemm("tiny", "example", 8, 8, 16)], ArrayConfig(4, 4, "os"))  # doctest: +SKIP
    >>> rows[0].worst()  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import io
import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npu_program.program import CompiledProgram, Dispatch, MemoryPlan, TensorSpec

from .hardware import Hardware, hardware_from_dict
from .model import CostModelError, cost_program

#: SCALE-Sim's dataflow names -> ours.
DATAFLOWS = {"os": "output_stationary", "ws": "weight_stationary", "is": "input_stationary"}
#: Compared figures, all in words (one int8 byte each on our side).
METRICS = ("compute_cycles", "sram_reads", "sram_writes", "dram_reads", "dram_writes")
#: The agreement the issue asks for.
TOLERANCE = 0.10


@dataclass(frozen=True)
class Shape:
    """One GEMM (M x K times K x N) or convolution (batch 1, an already padded H x W x C input, ``filters``
    kh x kw filters, one stride for both dims) taken from a model."""

    name: str
    source: str
    kind: str  # "gemm" or "conv"
    m: int = 0
    n: int = 0
    k: int = 0
    h: int = 0
    w: int = 0
    kh: int = 0
    kw: int = 0
    channels: int = 0
    filters: int = 0
    stride: int = 1

    @classmethod
    def gemm(cls, name: str, source: str, m: int, n: int, k: int) -> Shape:
        return cls(name, source, "gemm", m=m, n=n, k=k)

    @classmethod
    def conv(cls, name: str, source: str, hw: int, kernel: int, channels: int, filters: int, stride: int = 1,
             pad: int = 0) -> Shape:
        """A square convolution of an ``hw`` x ``hw`` input padded by ``pad`` on every side, as PyTorch sizes it.
        Both tools get the padded input cut to the rows and columns the windows reach, (out - 1) * stride +
        kernel: SCALE-Sim has no padding, and it rounds its output size up (a last window hanging off the
        input) where PyTorch rounds down."""
        out = (hw + 2 * pad - kernel) // stride + 1
        size = (out - 1) * stride + kernel
        return cls(name, source, "conv", h=size, w=size, kh=kernel, kw=kernel, channels=channels,
                   filters=filters, stride=stride)

    @property
    def out_hw(self) -> tuple[int, int]:
        return (self.h - self.kh) // self.stride + 1, (self.w - self.kw) // self.stride + 1

    @property
    def mnk(self) -> tuple[int, int, int]:
        """The GEMM the array runs (a convolution as implicit GEMM)."""
        if self.kind == "gemm":
            return self.m, self.n, self.k
        oh, ow = self.out_hw
        return oh * ow, self.filters, self.kh * self.kw * self.channels

    @property
    def label(self) -> str:
        m, n, k = self.mnk
        if self.kind == "gemm":
            return f"gemm M={m} N={n} K={k}"
        return f"conv {self.kh}x{self.kw}/{self.stride} {self.channels}->{self.filters} @{self.h}"


@dataclass(frozen=True)
class ArrayConfig:
    """The array both tools simulate: SCALE-Sim's ArrayHeight/ArrayWidth, Dataflow and the three SRAM sizes."""

    rows: int
    cols: int
    dataflow: str  # os, ws or is
    ifmap_kib: int = 65536
    filter_kib: int = 65536
    ofmap_kib: int = 65536

    def __post_init__(self) -> None:
        if self.dataflow not in DATAFLOWS:
            raise CostModelError(f"dataflow {self.dataflow!r} is not SCALE-Sim's; fix: give one of os, ws, is")

    def hardware(self) -> Hardware:
        """Our description of the same array: int8 at one MAC per PE per cycle, split SRAM of the same sizes."""
        return hardware_from_dict({
            "name": f"scalesim {self.rows}x{self.cols} {self.dataflow}", "clock_mhz": 1000,
            "dataflow": DATAFLOWS[self.dataflow], "dma_overlaps_compute": True,
            "array": {"rows": self.rows, "cols": self.cols},
            "macs_per_cycle": {"int8": 1.0, "fp16": 0, "bf16": 0, "fp32": 0},
            "vector": {"lanes": self.cols, "ops_per_cycle": {c: 1.0 for c in (
                "elementwise", "normalization", "softmax", "reduction", "movement")}},
            "sram": {"weights_kib": self.filter_kib, "activations_kib": self.ifmap_kib,
                     "accumulators_kib": self.ofmap_kib},
            "dram": {"bandwidth_gbps": 1000.0, "latency_ns": 0},
        }, "crosscheck")


@dataclass(frozen=True)
class Figures:
    """One tool's figures for one shape (words and cycles), and the seconds it took."""

    compute_cycles: int
    sram_reads: int
    sram_writes: int
    dram_reads: int
    dram_writes: int
    seconds: float

    def get(self, metric: str) -> int:
        return int(getattr(self, metric))


@dataclass(frozen=True)
class Comparison:
    """Ours against SCALE-Sim's for one shape on one array."""

    shape: Shape
    config: ArrayConfig
    ours: Figures
    theirs: Figures

    def diff(self, metric: str) -> float:
        """(ours - theirs) / theirs; 0 when both are 0."""
        a, b = self.ours.get(metric), self.theirs.get(metric)
        if b == 0:
            return 0.0 if a == 0 else math.inf
        return (a - b) / b

    def gated(self, metric: str) -> bool:
        """Whether ``metric`` must agree within :data:`TOLERANCE`. DRAM writes under weight- and
        input-stationary differ by design: SCALE-Sim writes every K fold's partial sums out to DRAM, we
        accumulate them on chip and write each output once (docs/cost_model.md)."""
        return not (metric == "dram_writes" and self.config.dataflow != "os")

    def worst(self) -> float:
        """The largest |difference| over the gated metrics."""
        return max(abs(self.diff(m)) for m in METRICS if self.gated(m))

    def ok(self, tolerance: float = TOLERANCE) -> bool:
        return self.worst() <= tolerance


# -- ours -----------------------------------------------------------------------------------------------------------

def one_dispatch_program(shape: Shape) -> CompiledProgram:
    """The program of one ``GEMM`` (x [M, K], w [N, K] as nn.Linear) or ``CONV`` (x [1, C, H, W] padded,
    w [F, C, kh, kw], no padding) dispatch, float32 (costed as int8)."""
    if shape.kind == "gemm":
        x = TensorSpec("x", [shape.m, shape.k], "float32")
        w = TensorSpec("w", [shape.n, shape.k], "float32")
        y = TensorSpec("y", [shape.m, shape.n], "float32")
        dispatch = Dispatch("GEMM", shape.name, ["x", "w"], ["y"], {"trans_b": True, "has_bias": False})
    else:
        oh, ow = shape.out_hw
        x = TensorSpec("x", [1, shape.channels, shape.h, shape.w], "float32")
        w = TensorSpec("w", [shape.filters, shape.channels, shape.kh, shape.kw], "float32")
        y = TensorSpec("y", [1, shape.filters, oh, ow], "float32")
        dispatch = Dispatch("CONV", shape.name, ["x", "w"], ["y"], {
            "stride": [shape.stride] * 2, "padding": [0, 0], "dilation": [1, 1], "groups": 1, "has_bias": False,
            "bn_eps": None, "activation": None})
    return CompiledProgram(model_name=shape.name, target="npu", input_specs=[x], output_specs=[y],
                           weight_specs=[w], weight_keys={"w": f"{shape.name}.weight"},
                           tensors={t.name: t for t in (x, w, y)}, dispatches=[dispatch],
                           memory=MemoryPlan(arena_bytes=0, offsets={}, no_reuse_bytes=0))


def ours(shape: Shape, config: ArrayConfig, hw: Hardware | None = None) -> Figures:
    """Our model's figures for ``shape`` on ``config``."""
    start = time.perf_counter()
    row, = cost_program(one_dispatch_program(shape), hw or config.hardware(), dtype="int8").rows
    seconds = time.perf_counter() - start
    return Figures(row.array_cycles, row.sram_reads, row.sram_writes, row.dram_bytes_read, row.dram_bytes_written,
                   seconds)


# -- SCALE-Sim ------------------------------------------------------------------------------------------------------

_CFG = """[general]
run_name = crosscheck
[run_presets]
InterfaceBandwidth = CALC
UseRamulatorTrace = False
[architecture_presets]
ArrayHeight = {rows}
ArrayWidth = {cols}
IfmapSramSzkB = {ifmap_kib}
FilterSramSzkB = {filter_kib}
OfmapSramSzkB = {ofmap_kib}
IfmapOffset = 0
FilterOffset = 100000000
OfmapOffset = 200000000
Dataflow = {dataflow}
ReadRequestBuffer = 32
WriteRequestBuffer = 32
[layout]
IfmapCustomLayout = False
FilterCustomLayout = False
IfmapSRAMBankBandwidth = 10
IfmapSRAMBankNum = 10
IfmapSRAMBankPort = 2
FilterSRAMBankBandwidth = 10
FilterSRAMBankNum = 10
FilterSRAMBankPort = 2
[sparsity]
SparsitySupport = false
"""
_CONV_HEADER = "Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, Num Filter, Strides,\n"


def _import_scalesim() -> dict[str, Any]:
    try:
        from scalesim.layout_utils import layouts
        from scalesim.memory.double_buffered_scratchpad_mem import double_buffered_scratchpad
        from scalesim.scale_config import scale_config
        from scalesim.single_layer_sim import single_layer_sim
        from scalesim.topology_utils import topologies
    except ImportError as err:
        raise CostModelError(f"the SCALE-Sim cross-check needs the scalesim package ({err}); fix: pip install "
                             f"scalesim (or pip install 'torch-ir[scalesim]')") from None

    class Scratchpad(double_buffered_scratchpad):
        """SCALE-Sim 3.0.0's memory system, made to finish under numpy >= 2.4: its last step calls ``int()`` on
        a one-element array, which numpy now refuses. The value it wanted is the last OFMAP service cycle,
        which the trace it has just built holds in its first column."""

        def service_memory_requests(self, *demands: Any) -> None:
            try:
                super().service_memory_requests(*demands)
            except TypeError:
                self.total_cycles = int(self.ofmap_trace_matrix[:, 0].max())
                self.traces_valid = True

    return {"layouts": layouts, "scratchpad": Scratchpad, "config": scale_config, "layer": single_layer_sim,
            "topologies": topologies}


def scalesim_available() -> bool:
    try:
        _import_scalesim()
    except CostModelError:
        return False
    return True


def theirs(shapes: Sequence[Shape], config: ArrayConfig) -> list[Figures]:
    """SCALE-Sim's figures for each of ``shapes`` on ``config`` (one topology file per kind)."""
    ss = _import_scalesim()
    results: dict[int, Figures] = {}
    with tempfile.TemporaryDirectory(prefix="scalesim-") as tmp:
        cfg_path = Path(tmp) / "crosscheck.cfg"
        cfg_path.write_text(_CFG.format(rows=config.rows, cols=config.cols, dataflow=config.dataflow,
                                        ifmap_kib=config.ifmap_kib, filter_kib=config.filter_kib,
                                        ofmap_kib=config.ofmap_kib))
        conf = ss["config"]()
        conf.read_conf_file(str(cfg_path))
        for kind in ("gemm", "conv"):
            picked = [(i, s) for i, s in enumerate(shapes) if s.kind == kind]
            if not picked:
                continue
            topo_path = Path(tmp) / f"{kind}.csv"
            if kind == "gemm":  # SCALE-Sim's GEMM topology: name, M, N, K
                lines = ["Layer, M, N, K,\n"] + [f"{s.name}, {s.m}, {s.n}, {s.k},\n" for _, s in picked]
            else:
                lines = [_CONV_HEADER] + [f"{s.name}, {s.h}, {s.w}, {s.kh}, {s.kw}, {s.channels}, {s.filters}, "
                                          f"{s.stride},\n" for _, s in picked]
            topo_path.write_text("".join(lines))
            topo = ss["topologies"]()
            with contextlib.redirect_stdout(io.StringIO()):
                topo.load_arrays(topofile=str(topo_path), mnk_inputs=kind == "gemm")
            for layer_id, (i, _) in enumerate(picked):
                results[i] = _run_layer(ss, conf, topo, layer_id)
    return [results[i] for i in range(len(shapes))]


def _run_layer(ss: dict[str, Any], conf: Any, topo: Any, layer_id: int) -> Figures:
    start = time.perf_counter()
    layer = ss["layer"]()
    layer.memory_system = ss["scratchpad"]()
    with contextlib.redirect_stdout(io.StringIO()):
        layer.set_params(layer_id=layer_id, config_obj=conf, topology_obj=topo, layout_obj=ss["layouts"](),
                         verbose=False)
        layer.run()
        compute = layer.get_compute_report_items()
        detail = layer.get_detail_report_items()
    seconds = time.perf_counter() - start
    # SRAM writes: the OFMAP demands the array issues. Its output-stationary OFMAP counter also adds R + C per
    # fold (systolic_compute_os.py: ``ofmap_writes += shape[0] + shape[1]``), which are no data; the demand
    # matrix is what its memory model is then driven with.
    writes = int((layer.compute_system.ofmap_demand_matrix != -1).sum())
    return Figures(compute_cycles=int(compute[1]), sram_reads=int(detail[2] + detail[5]), sram_writes=writes,
                   dram_reads=int(detail[11] + detail[14]), dram_writes=int(detail[17]), seconds=seconds)


def compare(shapes: Sequence[Shape], config: ArrayConfig) -> list[Comparison]:
    """Both tools on every shape; raises ``CostModelError`` naming ``pip install scalesim`` without it."""
    hw = config.hardware()
    mine = [ours(s, config, hw) for s in shapes]
    return [Comparison(s, config, a, b) for s, a, b in zip(shapes, mine, theirs(shapes, config))]


__all__ = ["DATAFLOWS", "METRICS", "TOLERANCE", "ArrayConfig", "Comparison", "Figures", "Shape", "compare",
           "one_dispatch_program", "ours", "scalesim_available", "theirs"]
