"""Which inputs of which nodes get quantized: the layers a config reaches, their weights and activations.

After ``normalize`` the contractions are CONV, GEMM, QKV_PROJ and GATE_UP; their weight operands are quantized
as weights (through DEQUANTIZE), their activation operands as activations (QUANTIZE -> DEQUANTIZE). An LLM's
KV_UPDATE gets its new entries fake-quantized at ``kv_bits``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from torch_ir.ir import NPU_IR, OpNode, provenance_of

from .presets import QuantConfig, QuantizeError

CONTRACTIONS = ("CONV", "GEMM", "QKV_PROJ", "GATE_UP")


@dataclass
class Site:
    """One node to rewrite: its config, its weight inputs (index, channel axis, K axis), its activation inputs."""

    node: int
    config: QuantConfig
    weights: list[tuple[int, int, int]] = field(default_factory=list)
    acts: list[int] = field(default_factory=list)
    output: bool = False  # its result quantized too (QuantConfig.outputs)


def layer_names(node: OpNode) -> list[str]:
    """The names an override pattern is matched against: the node's, its module path, its source nodes."""
    prov = provenance_of(node)
    return [node.name, *([prov.module] if prov.module else []), *prov.nodes]


def _weight_positions(node: OpNode) -> list[int]:
    if node.op_type in ("CONV", "GEMM"):
        return [1]
    if node.op_type == "GATE_UP":
        return [1, 2]
    n_w = 1 if node.attrs.get("packed") else 3
    return list(range(1, min(1 + n_w, len(node.inputs))))


def _axes(node: OpNode, rank: int) -> tuple[int, int]:
    """(output-channel axis, K axis) of a weight operand."""
    if node.op_type == "CONV" or node.attrs.get("trans_b", True):
        return 0, 1
    return rank - 1, rank - 2


def plan(ir: NPU_IR, config: QuantConfig) -> list[Site]:
    """The sites ``config`` (with its overrides) quantizes, in node order."""
    weights = {w.name for w in ir.weights}
    graph_outputs = {t.name for t in ir.graph_outputs} | set(ir.mutations.values())
    sites = []
    for i, node in enumerate(ir.nodes):
        if node.op_type == "KV_UPDATE" and config.kv_bits:
            kv = replace(config, act_dtype=f"int{config.kv_bits}", act_symmetric=True, act_observer="minmax")
            sites.append(Site(i, kv, acts=[1]))
            continue
        if node.op_type not in CONTRACTIONS:
            continue
        layer = config.for_layer(layer_names(node))
        if layer is None or (layer.weight_dtype is None and layer.act_dtype is None):
            continue
        site = Site(i, layer)
        for pos in _weight_positions(node):
            meta = node.inputs[pos]
            if meta.name in weights and meta.rank >= 2 and meta.dtype.startswith(("float", "bfloat")):
                if layer.weight_dtype is not None:
                    ch, k = _axes(node, meta.rank)
                    _check_group(node, meta.name, meta.shape, k, layer)
                    site.weights.append((pos, ch, k))
            elif layer.act_dtype is not None and meta.name not in weights:
                site.acts.append(pos)  # a matmul of two activations
        if layer.act_dtype is not None and node.inputs[0].dtype.startswith(("float", "bfloat")):
            site.acts.insert(0, 0)
            site.output = (layer.outputs and node.op_type in ("CONV", "GEMM") and len(node.outputs) == 1
                           and node.outputs[0].name not in graph_outputs)
        if site.weights or site.acts:
            sites.append(site)
    return sites


def _check_group(node: OpNode, weight: str, shape: list, k: int, config: QuantConfig) -> None:
    if config.weight_granularity != "group" or not config.strict_groups:
        return
    k_size = _k_size(node, shape, k)
    if k_size % int(config.group_size):
        raise QuantizeError(
            f"node {node.name!r} ({node.op_type}): group_size {config.group_size} does not divide its weight's K "
            f"({k_size}, weight {weight!r} {list(shape)}); choose a group size that divides K, or "
            "let such layers fall back to per channel (strict_groups=False)")


def _k_size(node: OpNode, shape: list, k: int) -> int:
    if node.op_type == "CONV":
        size = 1
        for d in shape[1:]:
            size *= int(d)
        return size
    return int(shape[k])
