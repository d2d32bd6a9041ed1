"""Float against quantized, layer by layer: SQNR and cosine of every tensor both IRs compute, the layers that lose
most, and the first whose error jumps.

Both IRs run in the reference executor (``IRExecutor.run_traced``) on the same inputs; a tensor of the quantized IR
with the name of a float IR's node output is the same value computed in lower precision (the quantizer keeps the
float ops' output names). Over all inputs together, per tensor:

* SQNR = 10·log10(Σ float² / Σ (quantized - float)²) in dB (inf where they agree exactly);
* cosine = Σ float·quantized / sqrt(Σ float² · Σ quantized²);
* max relative error = max over inputs of max|quantized - float| / max|float| (the bisect's measure; shown).

A layer's *inputs* are the compared tensors it reads, looked through the nodes the quantizer added (QUANTIZE,
DEQUANTIZE): a CONV reading a dequantized activation reads, in effect, the float layer before it. The noise a
layer *adds* is its noise-to-signal power (10^(-SQNR/10)) minus its inputs': what its own quantization (its
activations' and weights') costs; the layers that lose most are those that add most.

The first jump is judged by the bisect's rule (``torch_ir.verify.drift.judge``) on the RMS relative error
10^(-SQNR/20) (the max-based one is too spiky for noise spread over a whole tensor): a layer whose error is more
than ``JUMP`` times its inputs' and than ``JUMP`` times the noise floor, the floor being the quantization noise of
the narrowest type in the quantized IR (half a step of full scale, 2^-bits; fp8 half an ulp of its mantissa), not
float rounding: every quantized layer adds about that much by design.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from torch_ir.errors import TorchIRError
from torch_ir.executor import IRExecutor
from torch_ir.ir import NPU_IR, OpNode
from torch_ir.quant.spec import QTYPES
from torch_ir.verify.drift import JUMP, NodeError, Verdict, judge

from .tokens import TokenAgreement, find_logits, token_agreement

#: Types that hold scales or accumulators, not a layer's values: they set no noise floor.
_NOT_VALUES = frozenset({"int32"})
#: fp8's relative rounding: half an ulp of its mantissa (3 bits for e4m3, 2 for e5m2).
_FP8_FLOOR = {"float8_e4m3fn": 2.0 ** -4, "float8_e5m2": 2.0 ** -3}


class ReportError(TorchIRError, ValueError):
    """The float and quantized IRs cannot be compared as given."""


@dataclass
class LayerAccuracy:
    """One compared tensor: the node of the quantized IR that computes it and its accuracy over all inputs."""

    index: int  # position of the node in the quantized IR
    node: str
    op: str
    module: str | None
    tensor: str
    sqnr_db: float
    cosine: float
    rel_error: float
    input_sqnr_db: float  # the worst SQNR of the compared tensors it reads (inf: exact inputs)
    input_rel_error: float

    @property
    def loss_db(self) -> float:
        """The SQNR this layer loses: its inputs' minus its own (inf from exact inputs, 0 when both are exact)."""
        if math.isinf(self.input_sqnr_db) and math.isinf(self.sqnr_db):
            return 0.0
        return self.input_sqnr_db - self.sqnr_db

    @property
    def noise_added(self) -> float:
        """Noise-to-signal power it adds: 10^(-SQNR/10) minus its inputs' (negative: it averages noise away)."""
        return nsr(self.sqnr_db) - nsr(self.input_sqnr_db)


def nsr(sqnr_db: float) -> float:
    """Noise-to-signal power ratio of an SQNR in dB (0 for exact, inf for no signal left)."""
    return 10.0 ** (-sqnr_db / 10) if sqnr_db > -math.inf else math.inf


@dataclass
class AccuracyReport:
    """Per-layer accuracy of a quantized IR against its float one (module docstring); ``tokens`` for an LLM;
    ``assignments`` and ``pareto`` when it comes from a mixed-precision search."""

    model_name: str
    layers: list[LayerAccuracy]
    verdict: Verdict
    noise_floor: float
    inputs: int
    outputs: list[str]
    tokens: TokenAgreement | None = None
    assignments: list[Any] = field(default_factory=list)
    pareto: list[Any] = field(default_factory=list)
    hardware: str | None = None

    @property
    def first_jump(self) -> LayerAccuracy | None:
        """The first layer whose error jumps (the bisect's fault rule), or None (no jump: drift or fine)."""
        if self.verdict.jump is None:
            return None
        return next(layer for layer in self.layers if layer.index == self.verdict.jump.index)

    @property
    def output_sqnr_db(self) -> float:
        """The worst SQNR of the graph outputs."""
        return min((la.sqnr_db for la in self.layers if la.tensor in self.outputs), default=math.inf)

    def worst(self, count: int = 5) -> list[LayerAccuracy]:
        """The ``count`` layers that add most noise, most first."""
        ranked = [la for la in self.layers if la.noise_added > 0]
        return sorted(ranked, key=lambda la: -la.noise_added)[:count]

    def summary(self) -> str:
        lines = [f"{self.model_name}: {len(self.layers)} tensors compared over {self.inputs} input(s); output "
                 f"SQNR {_db(self.output_sqnr_db)}"]
        if self.tokens is not None:
            lines.append(self.tokens.summary())
        jump = self.first_jump
        lines.append(f"first jump: {jump.node} ({jump.op}), SQNR {_db(jump.sqnr_db)} after {_db(jump.input_sqnr_db)}"
                     if jump else f"no jump ({self.verdict.kind}; noise floor {self.noise_floor:.3g})")
        lines += [f"  {la.node} ({la.op}): SQNR {_db(la.input_sqnr_db)} -> {_db(la.sqnr_db)}" for la in self.worst()]
        return "\n".join(lines)


def _db(v: float) -> str:
    return f"{v:.1f} dB" if math.isfinite(v) else ("exact" if v > 0 else "-inf dB")


class _Sums:
    """Running sums of one tensor over the inputs (float64: a long run of small squares must not vanish)."""

    __slots__ = ("ee", "dd", "aa", "ae", "rel")

    def __init__(self) -> None:
        self.ee = self.dd = self.aa = self.ae = self.rel = 0.0

    def add(self, actual: torch.Tensor, expected: torch.Tensor) -> None:
        a, e = actual.detach().double().reshape(-1), expected.detach().double().reshape(-1)
        d = a - e
        self.ee += float(e @ e)
        self.dd += float(d @ d)
        self.aa += float(a @ a)
        self.ae += float(a @ e)
        scale = float(e.abs().max()) if e.numel() else 0.0
        worst = float(d.abs().max()) if d.numel() else 0.0
        rel = worst / scale if scale > 0 else (0.0 if worst == 0 else math.inf)
        self.rel = max(self.rel, math.inf if math.isnan(rel) else rel)

    def sqnr(self) -> float:
        if math.isnan(self.dd):
            return -math.inf
        if self.dd == 0:
            return math.inf
        return 10 * math.log10(self.ee / self.dd) if self.ee > 0 else -math.inf

    def cosine(self) -> float:
        if self.aa == 0 and self.ee == 0:
            return 1.0
        denom = math.sqrt(self.aa * self.ee)
        return self.ae / denom if denom > 0 and math.isfinite(self.ae) else 0.0


def compare_quantized(float_ir: NPU_IR, float_weights: Any, q_ir: NPU_IR, q_weights: Any,
                      inputs: Sequence[Sequence[Any] | Mapping[str, Any]], *, logits: str | bool | None = None,
                      noise_floor: float | None = None, jump: float = JUMP) -> AccuracyReport:
    """Run both IRs on each of ``inputs`` (one input set per run) and compare every float tensor the quantized IR
    also computes (module docstring). ``logits``: the output holding an LLM's next-token logits [..., vocab]
    (None: found by name or metadata, ``torch_ir``'s ``logits`` output; False: not an LLM), whose next-token KL
    divergence and top-1 agreement are added. ``noise_floor``: the jump rule's floor (None: from the quantized
    IR's narrowest type)."""
    if not inputs:
        raise ReportError("compare_quantized needs at least one input set (a list of the graph inputs per run)")
    names = _common_names(float_ir, q_ir)
    logit_name = find_logits(float_ir, logits)
    sums: dict[str, _Sums] = {}
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    ref_exec, q_exec = IRExecutor(float_ir, float_weights), IRExecutor(q_ir, q_weights)
    for run in inputs:
        expected: dict[str, torch.Tensor] = {}
        ref_exec.run_traced(_fresh(run), _keeper(names, expected))

        def compare(node: OpNode, outs: list[torch.Tensor], expected: dict[str, torch.Tensor] = expected) -> None:
            for meta, value in zip(node.outputs, outs):
                if meta.name in expected:
                    sums.setdefault(meta.name, _Sums()).add(value, expected[meta.name])
                    if meta.name == logit_name:
                        pairs.append((expected[meta.name], value.detach()))

        q_exec.run_traced(_fresh(run), compare)
    layers = _layers(q_ir, sums)
    floor = noise_floor if noise_floor is not None else quant_noise_floor(q_ir)
    verdict = judge(_series(layers, floor, jump), floor=floor, jump=jump)
    return AccuracyReport(q_ir.model_name, layers, verdict, floor, len(inputs),
                          [t.name for t in q_ir.graph_outputs if t.name in sums],
                          token_agreement(pairs) if pairs else None)


def _fresh(run: Sequence[Any] | Mapping[str, Any]) -> Sequence[Any] | Mapping[str, Any]:
    """A copy of an input set for one run: a graph that writes an input in place must not change the next run's."""
    if isinstance(run, Mapping):
        return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in run.items()}
    if isinstance(run, torch.Tensor):
        raise ReportError("inputs is a list of input sets, each a list (or dict) of the graph's inputs: wrap a "
                          "single tensor x as [[x]]")
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in run]


def _keeper(names: set[str], into: dict[str, torch.Tensor]):
    def keep(node: OpNode, outs: list[torch.Tensor]) -> None:
        for meta, value in zip(node.outputs, outs):
            if meta.name in names:
                into[meta.name] = value.detach()
    return keep


def _common_names(float_ir: NPU_IR, q_ir: NPU_IR) -> set[str]:
    """Float node outputs the quantized IR computes under the same name; none is one clear error."""
    ref = {t.name for n in float_ir.nodes for t in n.outputs if t.dtype in _FLOAT}
    names = ref & {t.name for n in q_ir.nodes for t in n.outputs}
    if not names:
        raise ReportError(f"the quantized IR {q_ir.model_name!r} computes none of the float IR "
                          f"{float_ir.model_name!r}'s tensors under the same name; compare a quantized IR with the "
                          "float IR it was made from (the quantizer keeps the float ops' output names)")
    return names


_FLOAT = frozenset({"float32", "float16", "bfloat16", "float64"})


def _layers(q_ir: NPU_IR, sums: Mapping[str, _Sums]) -> list[LayerAccuracy]:
    """One row per compared tensor, in the quantized IR's order, with its inputs' accuracy seen through the nodes
    that compute no compared tensor (QUANTIZE, DEQUANTIZE)."""
    seen_sqnr: dict[str, float] = {}
    seen_rel: dict[str, float] = {}
    rows = []
    for index, node in enumerate(q_ir.nodes):
        in_sqnr = min((seen_sqnr.get(t.name, math.inf) for t in node.inputs), default=math.inf)
        in_rel = max((seen_rel.get(t.name, 0.0) for t in node.inputs), default=0.0)
        for meta in node.outputs:
            s = sums.get(meta.name)
            if s is None:  # an added node: its output carries its inputs' error on
                seen_sqnr[meta.name], seen_rel[meta.name] = in_sqnr, in_rel
                continue
            seen_sqnr[meta.name], seen_rel[meta.name] = s.sqnr(), s.rel
            module = node.provenance.module if node.provenance else None
            rows.append(LayerAccuracy(index, node.name, node.op_type, module, meta.name, s.sqnr(), s.cosine(),
                                      s.rel, in_sqnr, in_rel))
    return rows


def _series(layers: Sequence[LayerAccuracy], floor: float, jump: float) -> list[NodeError]:
    """The layers as the bisect's error series of RMS relative errors; a layer is within tolerance below ``jump``
    times the floor, so the fault rule reads: error > jump × max(inputs' error, floor)."""
    series = []
    for la in layers:
        error = math.sqrt(nsr(la.sqnr_db))
        series.append(NodeError(la.index, la.node, la.op, la.module, error, math.sqrt(nsr(la.input_sqnr_db)),
                                error <= jump * floor, la.tensor))
    return series


def quant_noise_floor(q_ir: NPU_IR) -> float:
    """The relative quantization noise of the narrowest type in ``q_ir``: half a step of full scale, 2^-bits
    (QUANTIZE's qmin/qmax narrow a type), fp8 half an ulp; float rounding (2^-24) in an IR with none."""
    floors = [2.0 ** -24]
    for t in q_ir.tensors():
        if t.quant is not None and t.quant.dtype not in _NOT_VALUES:
            floors.append(_FP8_FLOOR.get(t.quant.dtype, 2.0 ** -t.quant.bits))
    for node in q_ir.nodes:
        dtype = node.attrs.get("dtype")
        if node.op_type == "QUANTIZE" and dtype in QTYPES and dtype not in _NOT_VALUES:
            if dtype in _FP8_FLOOR:
                floors.append(_FP8_FLOOR[dtype])
                continue
            lo, hi, _ = QTYPES[dtype]
            lo = lo if node.attrs.get("qmin") is None else node.attrs["qmin"]
            hi = hi if node.attrs.get("qmax") is None else node.attrs["qmax"]
            floors.append(1.0 / max(2.0, hi - lo + 1))
    return max(floors)
