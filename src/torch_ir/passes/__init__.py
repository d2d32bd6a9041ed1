"""Graph transformations: rule sets for the one rewrite engine in ``rewrite.py``."""

from .rewrite import Match, Op, RewriteResult, Rule, Var, eliminate_dead_code, rewrite, select

__all__ = ["Match", "Op", "RewriteResult", "Rule", "Var", "eliminate_dead_code", "rewrite", "select"]
