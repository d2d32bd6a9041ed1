"""``docs/kernels.md``, generated from the kernel table (``torch-ir ops --kernels --markdown``)."""

from __future__ import annotations

import json
from collections import defaultdict

from .kernels import FLOATS, KERNEL_DTYPES, KERNELS, REFERENCE, KernelDef
from .params import INPUT, REQUIRED, Param

_KINDS = ("contraction", "fused", "attention", "normalization", "elementwise", "reduction", "pooling", "resampling",
          "sorting", "movement", "host")


def _impl(record: KernelDef, backend: str) -> str:
    if record.host:
        return "host"
    impl = record.impls.get(backend)
    if impl is None:
        return "—"
    return "reference" if impl == REFERENCE else f"`{impl.rpartition(':')[2]}`"


def _layout(record: KernelDef) -> str:
    if record.view:
        return "view (no dispatch)"
    return {"spatial": "NHWC on channels-last", "keeps": "keeps its input's"}.get(record.layout or "", "row-major")


def _dtypes(record: KernelDef) -> str:
    if record.dtypes == KERNEL_DTYPES:
        return "all"
    return "floats" if record.dtypes == FLOATS else ", ".join(sorted(record.dtypes))


def kernels_markdown() -> str:
    """The kernel table as Markdown: one section per kind, one row per kernel."""
    backends = sorted({b for k in KERNELS.values() for b in k.impls})
    by_kind: dict[str, list[KernelDef]] = defaultdict(list)
    for record in KERNELS.values():
        by_kind[record.kind].append(record)
    lines = [
        "# Kernels",
        "",
        "Generated from the kernel table (`npu_program.kernels`) by `torch-ir ops --kernels --markdown`; "
        "do not edit.",
        "",
        "Every kernel the compiler can emit is one record: its kind, the dtypes it runs, its layout "
        "behaviour, its parameters, its cost formula and its implementation per backend (`reference` runs "
        "the op's reference implementation from the `torch_ir` op registry; a class name is a fast kernel "
        "that runs the dispatches it accepts, the reference the others). In the `webgpu` column the name is "
        "the function that generates the kernel's WGSL (`npu_runtime.backends.webgpu`); `elementwise` builds "
        "it from the WGSL expression the record carries; — means the target lacks it (a strict compile "
        "refuses it, `fallback=\"cpu\"` or `partition` runs it on the CPU).",
        "",
        f"{len(KERNELS)} records; dtypes \"all\" = "
        "bfloat16, bool, float16, float32, int32, int64, int8, uint8; \"floats\" = bfloat16, float16, float32.",
        "",
        "**Fallback.** A strict `npu_compiler.compile` refuses a graph with any op outside this table, listing "
        "every such node with its reason. `compile(..., fallback=\"cpu\")` (`torch-ir compile --fallback cpu`) "
        "instead makes those nodes *host dispatches* of the same program, run by the op's reference "
        "implementation on the host CPU, and the program's summary lists them with the reason. The reason is "
        "the record's own for the ops in the **host** section below (data-dependent work NPUs keep on the "
        "host), and \"not in the NPU kernel library\" for an op with no record.",
        "",
    ]
    for kind in [*_KINDS, *sorted(set(by_kind) - set(_KINDS))]:
        records = by_kind.get(kind)
        if not records:
            continue
        lines += [f"## {kind}", "",
                  "| kernel | dtypes | layout | cost | " + " | ".join(backends) + " | notes |",
                  "|---|---|---|---|" + "---|" * len(backends) + "---|"]
        for r in sorted(records, key=lambda r: r.name):
            notes = r.doc if r.deferred is None else f"**not in programs yet**: {r.deferred}"
            if r.host:
                notes = f"**stays on the host**: {r.host}"
            if _shown(r):
                notes += f"; params: [below](#{_anchor(r.name)})"
            cost = r.flops.__name__.replace("_flops", "").replace("_", " ")
            lines.append(f"| `{r.name}` | {_dtypes(r)} | {_layout(r)} | {cost} | "
                         + " | ".join(_impl(r, b) for b in backends) + f" | {notes} |")
        lines.append("")
    return "\n".join(lines + _params_section())


_PARAMS_INTRO = [
    "## Parameters",
    "",
    "What a dispatch of each kernel may carry (`npu_program.params`): per param a type, a default and its meaning. "
    "Types: `bool`, `int`, `float` (in a file, inf and nan are the strings `\"inf\"`, `\"-inf\"`, `\"nan\"`), "
    "`scalar` (an ATen Scalar: a bool, an int or a float), `str` (one of its choices where it has them), `dtype` "
    "(a dtype name), `layout`, `memory_format`, `device` (names), `ints`, `floats`, `bools` (lists), and `null`; "
    "`a|b` is either. Lowering decodes the IR's attributes into these plain values and writes every default; "
    "the program checker refuses an unknown param, a value of another type or outside its choices, and a missing "
    "required one. An ATen kernel's params are its op's schema arguments; its tensor arguments (inputs, or a "
    "number the IR folded into the node) are not listed. A host dispatch has no record: its params are its IR "
    "node's attributes.",
    "",
]


def _shown(record: KernelDef) -> list[Param]:
    """The params a reader looks up: all but an ATen op's tensor arguments."""
    return [d for d in record.params.values() if d.default is not INPUT]


def _anchor(name: str) -> str:
    return "params-" + "".join(c if c.isalnum() else "-" for c in name.lower())


def _declaration(decl: Param) -> str:
    text = f"`{decl.name}` {decl.type}"
    if decl.default is REQUIRED:
        text += ", required"
    else:
        text += f" = `{json.dumps(decl.default)}`"
    if decl.choices is not None:
        text += f" (one of {', '.join(decl.choices)})"
    return text + (f": {decl.doc}" if decl.doc else "")


def _params_section() -> list[str]:
    lines = list(_PARAMS_INTRO)
    for record in sorted(KERNELS.values(), key=lambda r: (r.name.startswith("aten."), r.name)):
        shown = _shown(record)
        if shown:
            lines += [f'<a id="{_anchor(record.name)}"></a>**`{record.name}`**', "",
                      *(f"- {_declaration(d)}" for d in shown), ""]
    return lines
