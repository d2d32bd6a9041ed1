"""The quantized IR in QDQ form: DEQUANTIZE before each quantized weight, QUANTIZE -> DEQUANTIZE on each
quantized activation, the float ops themselves unchanged (their node and output names kept, so float and
quantized tensors match by name).

A quantized weight is an integer (or fp8) weight tensor whose ``TensorMeta.quant`` names its scale (and zero point)
weight tensors ``<weight>_scale`` (``<weight>_zero_point``). A CONV with a folded batch norm has the batch norm
folded into its weight and a float bias first (``bn_eps`` dropped), so that the quantized weight is the one the
convolution really multiplies by.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from torch_ir.ir import NPU_IR, OpNode, Provenance, TensorMeta, provenance_of
from torch_ir.quant.spec import PACKED, QuantSpec

from .observers import qparams
from .plan import Site
from .presets import QuantConfig
from .weights import fold_batch_norm, group_fits, quantize_weight

ORIGIN = "npu_compiler.quantize"
#: Ops that only move or select values: their result is quantized with their input's scale and zero point (as ONNX
#: Runtime's quantizer does), so codes pass through exactly instead of being rounded to a second scale.
PASS_THROUGH = frozenset({"aten.max_pool2d.default", "aten.max_pool1d.default", "aten.reshape.default",
                          "aten.view.default", "aten.flatten.using_ints", "aten.permute.default",
                          "aten.transpose.int", "aten.squeeze.dim", "aten.unsqueeze.default"})
_WIDER = {"int4": "int8", "uint4": "uint8"}


class Builder:
    """Builds the quantized IR node by node; ``values`` are the weights by IR name (float ones as read)."""

    def __init__(self, ir: NPU_IR, values: dict[str, torch.Tensor], ranges: dict[str, tuple[float, float]]):
        self.ir, self.values, self.ranges = ir, dict(values), ranges
        self.taken = {t.name for t in ir.tensors()} | {n.name for n in ir.nodes}
        self.nodes: list[OpNode] = []
        self.new_weights: list[TensorMeta] = []
        self.replaced: dict[str, TensorMeta] = {}  # float weight name -> its codes' meta (same name: in place)
        self.constants: list[TensorMeta] = []
        self.constant_values: dict[str, Any] = {}
        self.mapping: dict[str, str] = {}
        self.act_cache: dict[tuple[str, str], TensorMeta] = {}
        self.renamed: dict[str, TensorMeta] = {}  # a quantized result -> its DEQUANTIZE, which later nodes read
        self.quantized: dict[str, dict[str, Any]] = {}  # a quantized activation -> how (the report's entry)
        self.report: dict[str, Any] = {}
        self.uses: dict[str, int] = {}
        for node in ir.nodes:
            for t in node.inputs:
                self.uses[t.name] = self.uses.get(t.name, 0) + 1
        self.aliased = set(ir.weight_aliases) | {k for ks in ir.weight_aliases.values() for k in ks}
        self.producer = {t.name: n for n in ir.nodes for t in n.outputs}

    def unique(self, name: str) -> str:
        base, n = name, 1
        while name in self.taken:
            name, n = f"{base}_{n}", n + 1
        self.taken.add(name)
        return name

    def key(self, name: str) -> str:
        return self.mapping.get(name) or self.ir.weight_name_mapping.get(name, name)

    def _node(self, op: str, inputs: list[TensorMeta], outputs: list[TensorMeta], attrs: dict[str, Any],
              source: OpNode) -> None:
        prov = provenance_of(source)
        name = self.unique(f"{outputs[0].name}_{op.lower().split('.')[-2] if '.' in op else op.lower()}")
        self.nodes.append(OpNode(name, op, inputs, outputs, {k: v for k, v in attrs.items() if v is not None},
                                 Provenance(nodes=[source.name], module=prov.module, origin=ORIGIN,
                                            rules=["quantize"])))

    def _weight_meta(self, name: str, key: str, value: torch.Tensor, dtype: str, shape: list[int],
                     quant: QuantSpec | None = None, layout: str | None = None) -> TensorMeta:
        meta = TensorMeta(name, shape, dtype, role="weight", layout=layout, quant=quant)
        self.new_weights.append(meta)
        self.values[name] = value
        self.mapping[name] = key
        return meta

    # -- weights ---------------------------------------------------------------------------------------
    def fold_bn(self, node: OpNode) -> OpNode:
        """CONV with a folded batch norm -> CONV with the batch norm in its weight and a float bias."""
        a = node.attrs
        has_bias = bool(a.get("has_bias"))
        w = node.inputs[1]
        bias = self.values[node.inputs[2].name] if has_bias else None
        start = 3 if has_bias else 2
        gamma, beta, mean, var = (self.values[t.name] for t in node.inputs[start:start + 4])
        folded, b = fold_batch_norm(self.values[w.name], bias, gamma, beta, mean, var, float(a["bn_eps"]))
        self.values[w.name] = folded
        b_name = self.unique(f"{w.name}_folded_bias")
        b_meta = self._weight_meta(b_name, f"{self.key(w.name)}_folded_bias", b, w.dtype, [int(folded.shape[0])])
        attrs = {k: v for k, v in a.items() if k != "bn_eps"}
        attrs["has_bias"] = True
        rest = node.inputs[start + 4:]  # the residual, if any
        return replace(node, inputs=[node.inputs[0], w, b_meta, *rest], attrs=attrs)

    def weight(self, node: OpNode, meta: TensorMeta, ch: int, k: int, config: QuantConfig) -> TensorMeta:
        """The float tensor that feeds ``node`` in place of weight ``meta``: DEQUANTIZE of its codes."""
        value = self.values[meta.name]
        flatten = node.op_type == "CONV" and (config.weight_granularity == "group" or (
            config.weight_dtype in PACKED and value.shape[-1] % 2))
        w = value.reshape(value.shape[0], -1) if flatten else value
        cfg, note = config, None
        if cfg.weight_granularity == "group" and (w.dim() != 2 or not group_fits(list(w.shape), k, cfg)):
            cfg, note = replace(cfg, weight_granularity="channel"), "per channel: the group does not divide K"
        if cfg.weight_dtype in PACKED and w.shape[-1] % 2:
            cfg = replace(cfg, weight_dtype=_WIDER[str(cfg.weight_dtype)])
            note = f"{cfg.weight_dtype}: 4-bit codes pack two per byte along an even last dim, {w.shape[-1]} is odd"
        qw = quantize_weight(w, cfg, ch, k)
        in_place = self.uses.get(meta.name, 0) == 1 and self.key(meta.name) not in self.aliased
        name = meta.name if in_place else self.unique(f"{meta.name}_q")
        key = self.key(meta.name) if in_place else f"{self.key(meta.name)}_q"
        if in_place:
            self.taken.add(name)
        scale = self._weight_meta(self.unique(f"{name}_scale"), f"{key}_scale", qw.scale, "float32",
                                  list(qw.scale.shape))
        zp = None if qw.zero_point is None else self._weight_meta(
            self.unique(f"{name}_zero_point"), f"{key}_zero_point", qw.zero_point,
            str(qw.zero_point.dtype).removeprefix("torch."), list(qw.zero_point.shape))
        spec = QuantSpec(qw.dtype, scale=scale.name, zero_point=zp.name if zp else None, axis=qw.axis,
                         group_size=qw.group_size)
        codes = self._weight_meta(name, key, qw.codes, qw.dtype, list(w.shape), spec,
                                  None if flatten else meta.layout)
        self.replaced[meta.name] = codes
        dq = TensorMeta(self.unique(f"{name}_dq"), list(w.shape), meta.dtype)
        self._node("DEQUANTIZE", [codes, scale, *([zp] if zp else [])], [dq],
                   {"dtype": qw.dtype, "axis": qw.axis, "group_size": qw.group_size, "out_dtype": meta.dtype}, node)
        self.report.setdefault(node.name, {}).setdefault("weights", {})[meta.name] = _describe(qw, note)
        if not flatten:
            return dq
        out = TensorMeta(self.unique(f"{name}_dq_{len(meta.shape)}d"), list(meta.shape), meta.dtype)
        self._node("aten.reshape.default", [dq], [out], {"shape": list(meta.shape)}, node)
        return out

    # -- activations -----------------------------------------------------------------------------------
    def activation(self, node: OpNode, meta: TensorMeta, config: QuantConfig) -> TensorMeta:
        """QUANTIZE -> DEQUANTIZE of activation ``meta`` with the calibrated per-tensor scale; shared by the
        consumers of one tensor at one type."""
        dtype = str(config.act_dtype)
        cached = self.act_cache.get((meta.name, dtype))
        if cached is not None:
            return cached
        source = next((name for (name, d), dq in self.act_cache.items() if d == dtype and dq.name == meta.name), None)
        if source is not None:  # already the dequantized codes of this type (a quantized result): not twice
            self.report.setdefault(node.name, {}).setdefault("activations", {})[source] = self.quantized[source]
            return meta
        lo, hi = self.ranges[self._range_of(meta.name, dtype)]
        scale, zp = qparams(lo, hi, dtype, config.act_symmetric)
        scale = float(torch.tensor(scale, dtype=torch.float32))  # the value the float32 constant holds
        s_meta = self._constant(f"{meta.name}_q_scale", "float32", scale)
        z_meta = None if zp is None else self._constant(f"{meta.name}_q_zero_point", dtype, zp)
        params = [s_meta, *([z_meta] if z_meta else [])]
        q = TensorMeta(self.unique(f"{meta.name}_q"), list(meta.shape), dtype, role="activation",
                       quant=QuantSpec(dtype, scale=scale, zero_point=zp))
        self._node("QUANTIZE", [meta, *params], [q], {"dtype": dtype}, node)
        dq = TensorMeta(self.unique(f"{meta.name}_dq"), list(meta.shape), meta.dtype)
        self._node("DEQUANTIZE", [q, *params], [dq], {"dtype": dtype, "out_dtype": meta.dtype}, node)
        self.act_cache[(meta.name, dtype)] = dq
        self.quantized[meta.name] = {"dtype": dtype, "scale": scale, "zero_point": zp, "range": [lo, hi],
                                     "observer": config.act_observer}
        self.report.setdefault(node.name, {}).setdefault("activations", {})[meta.name] = self.quantized[meta.name]
        return dq

    def _range_of(self, name: str, dtype: str) -> str:
        """The tensor whose calibrated range quantizes ``name``: its own, or through pass-through ops the quantized
        result they move (its codes then pass through unchanged)."""
        node = self.producer.get(name)
        while node is not None and node.op_type in PASS_THROUGH and node.inputs:
            source = node.inputs[0].name
            if (source, dtype) in self.act_cache and source in self.ranges:
                return source
            node = self.producer.get(source)
        return name

    def _constant(self, name: str, dtype: str, value: float | int) -> TensorMeta:
        meta = TensorMeta(self.unique(name), [], dtype, role="constant")
        self.constants.append(meta)
        self.constant_values[meta.name] = value
        return meta

    # -- the whole graph -------------------------------------------------------------------------------
    def rewrite(self, sites: list[Site]) -> None:
        by_node = {s.node: s for s in sites}
        for i, node in enumerate(self.ir.nodes):
            site = by_node.get(i)
            if self.renamed:
                node = replace(node, inputs=[self.renamed.get(t.name, t) for t in node.inputs])
            if site is None:
                self.nodes.append(node)
                continue
            if node.op_type == "CONV" and node.attrs.get("bn_eps") is not None and site.weights:
                node = self.fold_bn(node)
            inputs = list(node.inputs)
            for pos, ch, k in site.weights:
                inputs[pos] = self.weight(node, inputs[pos], ch, k, site.config)
            for pos in site.acts:
                inputs[pos] = self.activation(node, inputs[pos], site.config)
            self.nodes.append(replace(node, inputs=inputs))
            if site.output:  # the float result keeps its name (the report matches by it); readers get the codes'
                out = node.outputs[0]
                self.renamed[out.name] = self.activation(node, out, site.config)

    def result(self, metadata: dict[str, Any]) -> tuple[NPU_IR, dict[str, torch.Tensor]]:
        """The new IR (weights no node reads any more dropped) and its weights by state-dict key."""
        read = {t.name for n in self.nodes for t in n.inputs} | set(self.ir.mutations)
        in_place = {n for n, m in self.replaced.items() if m.name == n}
        kept = [w for w in self.ir.weights if w.name in read and w.name not in in_place]
        new = [w for w in self.new_weights if w.name in read]
        weights = kept + new
        mapping = {**{k: v for k, v in self.ir.weight_name_mapping.items() if k in read}, **self.mapping}
        mapping = {k: v for k, v in mapping.items() if k in {w.name for w in weights} | read}
        changed = {self.ir.weight_name_mapping.get(n, n) for n in self.replaced}
        aliases = {k: v for k, v in self.ir.weight_aliases.items() if k not in changed and not set(v) & changed}
        stored_consts = [c for c in self.ir.constants if c.name not in self.ir.constant_values and c.name in read]
        state = {mapping.get(w.name, w.name): self.values[w.name].contiguous()
                 for w in weights + stored_consts}
        ir = replace(self.ir, weights=weights, nodes=self.nodes, weight_name_mapping=mapping, weight_aliases=aliases,
                     constants=[c for c in self.ir.constants if c.name in read] + self.constants,
                     constant_values={**{k: v for k, v in self.ir.constant_values.items() if k in read},
                                      **self.constant_values},
                     metadata={**self.ir.metadata, "quantize": {**metadata, "layers": self.report}})
        return ir, state


def _describe(qw: Any, note: str | None) -> dict[str, Any]:
    d = {"dtype": qw.dtype, "granularity": qw.granularity, "symmetric": qw.zero_point is None}
    if qw.group_size:
        d["group_size"] = qw.group_size
    if note:
        d["note"] = note
    return d
