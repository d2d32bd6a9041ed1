"""``docs/npu_ops.md``: the NPU op table and the rewrite-rule table, both generated from the code."""

from __future__ import annotations

from torch_ir.ops.npu import npu_ops_markdown

from .pipeline import ALL_RULES, STAGES


def npu_docs_markdown() -> str:
    lines = [npu_ops_markdown().rstrip(), "", "# Rewrite rules", "",
             "`npu_compiler.passes.normalize` runs these stages in order; each is a rule list for the one rewrite",
             "engine, followed by dead-code elimination. Switch families off with",
             "`NormalizeOptions(disable={...})` or `torch-ir normalize --disable FAMILY`.", ""]
    for stage, rules in STAGES:
        lines.append(f"- **{stage}**: {', '.join(dict.fromkeys(r.family for r in rules))}")
    lines += ["", "| rule | family | rewrites |", "|---|---|---|"]
    lines += [f"| `{r.name}` | {r.family} | {r.doc.replace('|', '/')} |" for r in ALL_RULES]
    return "\n".join(lines) + "\n"
