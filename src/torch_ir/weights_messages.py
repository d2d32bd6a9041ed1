"""The wording of a weights mismatch, shared by the IR executor (``torch_ir.weights``) and the runtime
(``npu_runtime.weights``): the same cause gets the same diagnosis wherever it is found."""

from __future__ import annotations

import os
from collections.abc import Sequence


def key_lines(groups: Sequence[tuple[str, Sequence[str]]]) -> list[str]:
    """``  title (n): key; key; key; ... N more`` per non-empty group: the first few keys (a mismatch of a whole
    model would make a kilobyte line), every key with ``TORCH_IR_FULL_ERRORS=1``, said on the last line."""
    full = os.environ.get("TORCH_IR_FULL_ERRORS") == "1"
    lines = []
    for title, items in groups:
        if items:
            shown = list(items) if full else list(items[:3])
            more = "" if len(shown) == len(items) else f"; ... {len(items) - len(shown)} more"
            lines.append(f"  {title} ({len(items)}): " + "; ".join(shown) + more)
    if not full and sum(len(items) for _, items in groups) > 3:
        lines.append("(set TORCH_IR_FULL_ERRORS=1 to list every key)")
    return lines


def nonpersistent_why(holder: str) -> str:
    """Why a non-persistent buffer is missing from a state dict, for the IR executor and the runtime alike."""
    return ("The missing buffers are non-persistent (registered with persistent=False): model.state_dict() and "
            f"checkpoints never hold them, and {holder} has no recipe to rebuild them (its model was built under "
            "torch.device('meta') for extraction, where their values were not known).")


__all__ = ["key_lines", "nonpersistent_why"]
