"""Next-token agreement of a quantized LLM with its float one, as llama.cpp's ``perplexity --kl-divergence``
measures it: at every position of the given inputs, the KL divergence KL(P_float || P_quantized) of the two
next-token distributions (softmax of the logits, in float64), and whether their most likely tokens agree. Reported:
the mean KLD (llama.cpp's "Mean KLD"), its 99th percentile and maximum, and the same-top-token percentage
("Same top p").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from torch_ir.errors import TorchIRError
from torch_ir.ir import NPU_IR

_FLOAT = frozenset({"float32", "float16", "bfloat16", "float64"})


@dataclass(frozen=True)
class TokenAgreement:
    """KL divergence and top-1 agreement over ``positions`` next-token distributions."""

    positions: int
    mean_kld: float
    p99_kld: float
    max_kld: float
    top1_pct: float

    def summary(self) -> str:
        return (f"next token over {self.positions} positions: mean KLD {self.mean_kld:.6f} (99% {self.p99_kld:.6f}, "
                f"max {self.max_kld:.6f}), same top-1 token {self.top1_pct:.2f}%")


def find_logits(ir: NPU_IR, logits: str | bool | None) -> str | None:
    """The graph output holding next-token logits: ``logits`` itself when a name, none when False, else (None) a
    float output of rank >= 2 whose name says ``logits`` or whose last dim is the IR's ``vocab_size`` metadata."""
    if logits is False:
        return None
    outputs = {t.name: t for t in ir.graph_outputs}
    if isinstance(logits, str):
        if logits not in outputs:
            raise TorchIRError(f"logits={logits!r} is not an output of IR {ir.model_name!r} (its outputs: "
                               f"{', '.join(outputs)}); name the output that holds the next-token logits")
        return logits
    vocab = ir.metadata.get("vocab_size") if isinstance(ir.metadata, dict) else None
    for t in ir.graph_outputs:
        if t.dtype in _FLOAT and t.rank >= 2 and ("logits" in t.name.lower() or (vocab and t.shape[-1] == vocab)):
            return t.name
    return None


def kl_and_top1(expected: torch.Tensor, actual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position (every index but the last dim): KL(softmax(expected) || softmax(actual)) and whether the
    argmaxes agree."""
    if expected.shape != actual.shape or expected.dim() < 1:
        raise TorchIRError(f"logits of shapes {list(expected.shape)} and {list(actual.shape)} cannot be compared "
                           "position by position")
    vocab = expected.shape[-1]
    log_p = torch.log_softmax(expected.detach().double().reshape(-1, vocab), dim=-1)
    log_q = torch.log_softmax(actual.detach().double().reshape(-1, vocab), dim=-1)
    # p·(log p - log q) with 0·log 0 = 0: a token the float model gives no mass adds nothing
    kld = torch.where(log_p.isneginf(), 0.0, log_p.exp() * (log_p - log_q)).sum(dim=-1).clamp_min(0.0)
    return kld, log_p.argmax(dim=-1) == log_q.argmax(dim=-1)


def token_agreement(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> TokenAgreement:
    """The agreement over all positions of all (float logits, quantized logits) pairs."""
    klds, same = [], []
    for expected, actual in pairs:
        k, s = kl_and_top1(expected, actual)
        klds.append(k)
        same.append(s)
    kld, agree = torch.cat(klds), torch.cat(same)
    if kld.numel() == 0:
        return TokenAgreement(0, math.nan, math.nan, math.nan, math.nan)
    return TokenAgreement(int(kld.numel()), float(kld.mean()), float(torch.quantile(kld, 0.99)), float(kld.max()),
                          100.0 * float(agree.double().mean()))
