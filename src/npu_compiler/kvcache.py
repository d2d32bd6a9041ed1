"""A quantized KV cache: the one rewrite that turns an LLM's float cache into codes and scales (``kv_bits=8``).

Run on a normalized LLM IR (``compile_lm(..., kv_bits=8)`` does, after specializing and normalizing each phase), it
replaces each cache buffer ``[B, H, S, D]`` written by ``KV_UPDATE`` with two buffers, int8 codes ``[B, H, S, D]``
(``bits`` = 8: seed 003's ``qbits_kv``) and float32 scales ``[B, H, S]``, one per head and position
(``torch_ir.ops.npu_kvcache``: symmetric, ``max|x| / 127``, round half to even). Then:

* ``KV_UPDATE(cache, new, pos)`` -> ``KVQ_UPDATE(codes, scales, new, pos)``, writing both in place (two state slots
  of the program, ``npu_compiler.state``);
* ``ATTENTION(q, k_cache, v_cache, mask)`` -> ``KVQ_ATTENTION(q, k_codes, k_scales, v_codes, v_scales, mask)``;
* any other reader of a cache (the unfused ``ATTN_SCORE``/``ATTN_OUTPUT``) reads ``KVQ_DEQUANTIZE(codes, scales)``,
  the float cache rebuilt, under the tensor's old name.

The IR stays an IR: the reference executor runs it (the ops' references are ``torch_ir.quant.numerics``), the CPU
backend has kernels for the two hot ops, and the cost model counts one byte per code and four per scale. A target
without the kernels (WebGPU) refuses them at compile time, naming them, or runs them on the host with
``fallback="cpu"``: never a float kernel over int8 bytes.
"""

from __future__ import annotations

import dataclasses

from torch_ir.ir import NPU_IR, OpNode, TensorMeta

from .errors import CompileError

#: ``kv_bits`` -> the code type of the cache (the one place the accepted values are listed).
KV_BITS: dict[int, str] = {8: "int8"}
RULE = "kv_quantize"


def kv_code_dtype(kv_bits: int | None) -> str | None:
    """The cache's code type for ``kv_bits`` (None: the float cache); raises ``CompileError`` for another value."""
    if kv_bits is None:
        return None
    if isinstance(kv_bits, bool) or kv_bits not in KV_BITS:
        raise CompileError(f"kv_bits={kv_bits!r}: a KV cache is quantized to {', '.join(map(str, KV_BITS))} bits "
                           "(int8 codes with one float32 scale per head and position); leave it out (None) for the "
                           "float cache")
    return KV_BITS[kv_bits]


def _tag(node: OpNode) -> OpNode:
    if node.provenance is not None:
        node.provenance = dataclasses.replace(node.provenance, rules=[*node.provenance.rules, RULE])
    return node


def _quantized_update(ir: NPU_IR, node: OpNode, buffer: TensorMeta, dtype: str) -> tuple[OpNode, OpNode, dict]:
    """The KVQ_UPDATE replacing ``node`` and the KVQ_DEQUANTIZE giving its float value back; the new buffers."""
    shape, value = list(buffer.shape), node.outputs[0]
    dim = int(node.attrs.get("dim", 2)) % len(shape)
    if len(shape) < 2 or dim == len(shape) - 1:
        raise CompileError(f"IR {ir.model_name!r}: node {node.name!r} writes cache {buffer.name!r} {shape} along its "
                           f"last dim ({dim}); a quantized cache has one scale per vector along the last dim, so it "
                           "is written along another (compile without kv_bits)")
    codes = TensorMeta(f"{buffer.name}_codes", shape, dtype, role=buffer.role, layout=buffer.layout, bits=8)
    scales = TensorMeta(f"{buffer.name}_scales", shape[:-1], "float32", role=buffer.role)
    codes_out = dataclasses.replace(codes, name=f"{value.name}_codes", role=None)
    scales_out = dataclasses.replace(scales, name=f"{value.name}_scales", role=None)
    update = OpNode(node.name, "KVQ_UPDATE", [codes, scales, *node.inputs[1:]], [codes_out, scales_out],
                    {"dim": dim}, node.provenance)
    dequant = OpNode(f"{node.name}_dequantize", "KVQ_DEQUANTIZE", [codes_out, scales_out], [value],
                     {"out_dtype": buffer.dtype}, node.provenance)
    return _tag(update), _tag(dequant), {"codes": codes, "scales": scales}


def quantize_kv_cache(ir: NPU_IR, kv_bits: int) -> NPU_IR:
    """``ir`` (a normalized LLM IR) with its KV cache quantized to ``kv_bits`` (module docstring). Raises
    ``CompileError`` for a cache written other than by one KV_UPDATE of a float buffer."""
    dtype = kv_code_dtype(kv_bits)
    buffers = {w.name: w for w in ir.weights}
    producer = {t.name: n for n in ir.nodes for t in n.outputs}
    replaced: dict[str, list[OpNode]] = {}
    new_buffers: dict[str, dict] = {}
    mutations: dict[str, str] = {}
    for buffer, value in sorted(ir.mutations.items()):
        node = producer.get(value)
        meta = buffers.get(buffer)
        if node is None or meta is None or node.op_type != "KV_UPDATE" or node.inputs[0].name != buffer \
                or not meta.dtype.startswith(("float", "bfloat")):
            raise CompileError(f"IR {ir.model_name!r}: buffer {buffer!r} is not a float KV cache written by one "
                               f"KV_UPDATE ({node.op_type if node else 'no node'} writes it); kv_bits quantizes only "
                               "such caches: compile without kv_bits")
        update, dequant, made = _quantized_update(ir, node, meta, dtype)
        replaced[node.name] = [update, dequant]
        new_buffers[buffer] = made
        mutations[made["codes"].name] = update.outputs[0].name
        mutations[made["scales"].name] = update.outputs[1].name
    nodes = [m for n in ir.nodes for m in replaced.get(n.name, [n])]
    nodes = _fuse_attention(nodes)
    return _with_buffers(ir, nodes, new_buffers, mutations, kv_bits)


def _fuse_attention(nodes: list[OpNode]) -> list[OpNode]:
    """ATTENTION reading two dequantized caches -> KVQ_ATTENTION over their codes; dequantizations nobody reads
    any more dropped."""
    dequantized = {n.outputs[0].name: n for n in nodes if n.op_type == "KVQ_DEQUANTIZE"}
    out = []
    for n in nodes:
        k, v = (n.inputs[i].name if len(n.inputs) > i else None for i in (1, 2))
        if n.op_type == "ATTENTION" and k in dequantized and v in dequantized:
            kq, vq = dequantized[k].inputs, dequantized[v].inputs
            n = _tag(OpNode(n.name, "KVQ_ATTENTION", [n.inputs[0], *kq, *vq, *n.inputs[3:]], n.outputs,
                            dict(n.attrs), n.provenance))
        out.append(n)
    read = {t.name for n in out for t in n.inputs}
    return [n for n in out if n.op_type != "KVQ_DEQUANTIZE" or n.outputs[0].name in read]


def _with_buffers(ir: NPU_IR, nodes: list[OpNode], new_buffers: dict[str, dict], mutations: dict[str, str],
                  kv_bits: int) -> NPU_IR:
    weights, mapping, recipes = [], dict(ir.weight_name_mapping), dict(ir.non_persistent_buffers)
    for w in ir.weights:
        if w.name not in new_buffers:
            weights.append(w)
            continue
        key = mapping.pop(w.name, w.name)
        non_persistent = recipes.pop(key, False) is not False  # a float recipe would not make codes
        for part, meta in new_buffers[w.name].items():
            weights.append(meta)
            mapping[meta.name] = f"{key}.{part}"
            if non_persistent:
                recipes[f"{key}.{part}"] = None
    metadata = {**ir.metadata, "kv_cache": {"bits": kv_bits, "dtype": KV_BITS[kv_bits], "scales": "float32",
                                            "granularity": "per head and position", "caches": sorted(new_buffers)}}
    return dataclasses.replace(ir, weights=weights, nodes=nodes, weight_name_mapping=mapping, mutations=mutations,
                               non_persistent_buffers=recipes, metadata=metadata)


__all__ = ["KV_BITS", "kv_code_dtype", "quantize_kv_cache"]
