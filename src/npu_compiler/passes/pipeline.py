"""``normalize(ir, options)``: clean up, canonicalize, fuse into the NPU op set, annotate.

Each stage is a rule list for the one rewrite engine (``rewrite.py``) followed by dead-code
elimination; the structural checker runs after each. What was applied and what was rejected (with
the reason) is kept in ``ir.metadata["normalize"]``, so a saved IR carries its own report
(``torch_ir.report.normalize_report``).

Stages, in order (a rule family belongs to one stage; families can be switched off):

1. clean-up: ``cleanup`` (identities), ``fold`` (constant folding)
2. canonicalization: ``canonical`` (one form per op), ``gemm`` (linear/addmm/mm/matmul -> GEMM)
3. fusion: ``llm`` (QKV_PROJ, RMS_NORM, SILU_GATE, ROPE, KV_UPDATE), ``residual`` (the add after a GEMM,
   into it), ``attention``, ``conv``, ``norm``, ``embedding``
4. late fusion: ``softmax`` (the softmax attention did not take), ``activation`` (into GEMM/CONV), then
   ``quantized`` (QDQ patterns around CONV/GEMM/matmul into QCONV, QGEMM, DQGEMM: ``quantized.py``; the
   residual add into QADD: ``quantized_add.py``; a reshape or transpose between a DEQUANTIZE and a QUANTIZE of one
   scale onto the codes: ``quantized_movement.py``; the max pool between them into QMAXPOOL: ``quantized_pool.py``;
   a chain of elementwise float steps between them into a table, QLUT: ``quantized_lut.py``)
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from typing import Any

from torch_ir.errors import IRValidationError, TorchIRError
from torch_ir.ir import NPU_IR, TensorMeta, check_integrity
from torch_ir.ir.serialize import gc_paused
from torch_ir.ops.npu import NPU_OPS
from torch_ir.ops.registry import check_node_attrs
from torch_ir.rewrite import RewriteResult, Rule, eliminate_dead_code, rewrite, select

from . import (
    attention,
    canonical,
    cleanup,
    decoder,
    fusion,
    quantized,
    quantized_add,
    quantized_lut,
    quantized_movement,
    quantized_pool,
)
from .annotate import QConfig, annotate

STAGES: list[tuple[str, list[Rule]]] = [
    ("cleanup", cleanup.RULES),
    ("canonicalize", cleanup.IDENTITY_RULES + canonical.RULES),
    ("fuse", cleanup.IDENTITY_RULES + decoder.DECODER_RULES + attention.ATTENTION_RULES + fusion.RULES),
    ("late_fuse", cleanup.IDENTITY_RULES + fusion.LATE_NORM_RULES + fusion.SOFTMAX_RULES + fusion.ACTIVATION_RULES
     # after ReLU has joined its CONV/GEMM: the integer ops fuse it
     + quantized_movement.RULES + quantized.RULES + quantized_add.RULES + quantized_pool.RULES
     + quantized_lut.RULES),
]

STAGE_NAMES: tuple[str, ...] = tuple(name for name, _ in STAGES)
ALL_RULES: list[Rule] = list({id(r): r for _, rules in STAGES for r in rules}.values())
FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(r.family for r in ALL_RULES))


@dataclass
class NormalizeOptions:
    """What ``normalize`` does. ``disable`` switches rule families off (``{"attention", "llm"}``),
    ``disabled_rules`` single rules; ``node_prefix``/``tensor_prefix`` rename nodes and intermediate
    tensors sequentially (``layer_0``, ``t_0``, ...) as seed 003's naming rules; ``qconfig`` sets
    bit-widths in the tensor table.

    ``stop_after=(stage, n)`` runs the stages up to ``stage`` only, and in it only the first ``n`` rule
    applications (``n=None``: the whole stage): the IR part way through, for ``npu_tools.debug.bisect``."""

    disable: set[str] = field(default_factory=set)
    disabled_rules: set[str] = field(default_factory=set)
    node_prefix: str | None = None
    tensor_prefix: str | None = None
    qconfig: QConfig | None = None
    annotate: bool = True
    check: bool = True
    stop_after: tuple[str, int | None] | None = None

    def __post_init__(self) -> None:
        if self.stop_after is not None and self.stop_after[0] not in STAGE_NAMES:
            raise ValueError(f"NormalizeOptions.stop_after: unknown stage {self.stop_after[0]!r}; "
                             f"the stages are {', '.join(STAGE_NAMES)}")
        unknown = set(self.disable) - set(FAMILIES)
        if unknown:
            raise ValueError(f"NormalizeOptions.disable: unknown rule families {sorted(unknown)}; "
                             f"the families are {', '.join(FAMILIES)}")
        names = {r.name for r in ALL_RULES}
        unknown = set(self.disabled_rules) - names
        if unknown:
            raise ValueError(f"NormalizeOptions.disabled_rules: unknown rules {sorted(unknown)}; "
                             "`torch-ir normalize --list-rules` lists them")


def normalize(ir: NPU_IR, options: NormalizeOptions | None = None) -> NPU_IR:
    """The IR rewritten into the NPU op set; the input IR is not modified.

    Example::

        from npu_compiler.passes import normalize, NormalizeOptions
        npu_ir = normalize(ir, NormalizeOptions(disable={"attention"}))
        print(npu_ir.op_histogram())
    """
    with gc_paused():  # many small objects: collecting mid-way would cost more than the pass (see gc_paused)
        return _normalize(ir, options or NormalizeOptions())


def _normalize(ir: NPU_IR, options: NormalizeOptions) -> NPU_IR:
    for n in ir.nodes:  # rules read attributes with defaults: a misspelled one must not become the default
        check_node_attrs(n)
    report: dict[str, Any] = {"nodes_before": len(ir.nodes), "ops_before": ir.op_histogram(), "stages": []}
    current = ir
    last, limit = options.stop_after or (None, None)
    for stage, _ in STAGES:
        started = time.perf_counter()
        current, result = run_stage(current, stage, options, limit=limit if stage == last else None)
        report["stages"].append({
            "stage": stage, "nodes": len(current.nodes), "applied": dict(result.applied),
            "rejected": [list(r) for r in result.rejected], "log": [list(a) for a in result.log],
            "seconds": round(time.perf_counter() - started, 4),
        })
        if stage == last:
            break
    current = finish(current, options)
    report.update(nodes_after=len(current.nodes), ops_after=current.op_histogram())
    return dc_replace(current, metadata={**current.metadata, "normalize": report})


def run_stage(ir: NPU_IR, stage: str, options: NormalizeOptions | None = None, *,
              limit: int | None = None) -> tuple[NPU_IR, RewriteResult]:
    """One stage of ``normalize`` on ``ir``: its rules (less those ``options`` switch off), at most ``limit``
    applications, then dead-code elimination. ``normalize`` is its stages in order, then ``finish``; a tool that
    needs every stage's IR (``npu_tools.debug.bisect``) runs them one by one, keeping each stage's input."""
    options = options or NormalizeOptions()
    chosen = select(dict(STAGES)[stage], set(FAMILIES) - set(options.disable), options.disabled_rules)
    result = _rewrite_stage(ir, chosen, options.check, stage, limit)
    return eliminate_dead_code(result.ir), result


def finish(ir: NPU_IR, options: NormalizeOptions | None = None) -> NPU_IR:
    """What ``normalize`` does after its stages: drop unread constants, rename, annotate, check."""
    options = options or NormalizeOptions()
    current = _drop_unread_constants(ir)
    if options.node_prefix or options.tensor_prefix:
        current = rename(current, options.node_prefix, options.tensor_prefix)
    if options.annotate:
        current = annotate(current, options.qconfig)
    if options.check:
        check_integrity(current, source=f"IR {ir.model_name!r} after normalize")
    return current


def npu_histogram(ir: NPU_IR, *, runtime_only: bool = False) -> dict[str, int]:
    """Counts of the NPU ops in ``ir``. ``runtime_only`` leaves out nodes computed from weights and
    constants alone (a frontend that had the weights, like the ONNX exporter, may have folded them)."""
    live = _depends_on_inputs(ir) if runtime_only else None
    counts = Counter(n.op_type for n in ir.nodes if n.op_type in NPU_OPS and (live is None or n.name in live))
    return dict(sorted(counts.items()))


def _depends_on_inputs(ir: NPU_IR) -> set[str]:
    reached = {t.name for t in ir.graph_inputs}
    nodes = set()
    for n in ir.nodes:
        if any(t.name in reached for t in n.inputs):
            nodes.add(n.name)
            reached.update(t.name for t in n.outputs)
    return nodes


def _rewrite_stage(ir: NPU_IR, rules: list[Rule], check: bool, stage: str, limit: int | None = None):
    """One stage's rewrite. Rules read attributes as their ops define them; an IR from a file may hold
    other values (a list where an int belongs), which is bad input, reported as such."""
    try:
        return rewrite(ir, rules, check=check, limit=limit)
    except TorchIRError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        raise IRValidationError(
            f"IR {ir.model_name!r}: normalize stage {stage!r} cannot read a node's attributes ({type(e).__name__}: "
            f"{e}); the IR holds attribute values its ops do not take: extract or save the IR again") from e


def _drop_unread_constants(ir: NPU_IR) -> NPU_IR:
    """Constants that folding left unread (the index arithmetic folded into a bigger constant)."""
    read = {t.name for n in ir.nodes for t in n.inputs} | {t.name for t in ir.graph_outputs}
    kept = [c for c in ir.constants if c.name in read or c.name not in ir.constant_values]
    values = {k: v for k, v in ir.constant_values.items() if k in read}
    return dc_replace(ir, constants=kept, constant_values=values)


def rename(ir: NPU_IR, node_prefix: str | None, tensor_prefix: str | None) -> NPU_IR:
    """Nodes named ``{node_prefix}{i}`` and intermediate tensors ``{tensor_prefix}{i}`` in graph order.

    Graph inputs and outputs, weights and constants keep their names (they are the model's interface).
    """
    fixed = {t.name for t in [*ir.graph_inputs, *ir.graph_outputs, *ir.weights, *ir.constants]}
    fixed |= set(ir.mutations.values())
    names: dict[str, str] = {}
    if tensor_prefix:
        for n in ir.nodes:
            for t in n.outputs:
                if t.name not in fixed:
                    names[t.name] = f"{tensor_prefix}{len(names)}"

    renamed: dict[int, TensorMeta] = {}  # one copy per tensor object, not one per use

    def re(t: TensorMeta) -> TensorMeta:
        if t.name not in names:
            return t
        if id(t) not in renamed:
            renamed[id(t)] = dc_replace(t, name=names[t.name])
        return renamed[id(t)]

    nodes = [dc_replace(n, name=f"{node_prefix}{i}" if node_prefix else n.name,
                        inputs=[re(t) for t in n.inputs], outputs=[re(t) for t in n.outputs])
             for i, n in enumerate(ir.nodes)]
    return dc_replace(ir, nodes=nodes)
