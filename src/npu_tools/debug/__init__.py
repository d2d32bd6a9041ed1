"""Numerical debugging: find where a model's numbers go wrong, and write a standalone repro.

    from npu_tools.debug import bisect
    report = bisect("qwen2", out_dir="bisect-out")
    print(report.summary())

``bisect`` compares the trusted source (eager PyTorch, onnxruntime, tinygrad) with every stage of the pipeline
(``stages.STAGE_NAMES``), names the first that diverges and, inside it, the converter, rewrite rule (down to one
application), kernel or lowering at fault; ``drift`` tells a tolerance problem from a fault; ``repro`` writes the
faulty node or group as a directory that runs without the model. See docs/bisect.md.
"""

from __future__ import annotations

from typing import Any

from .subject import Subject

__all__ = ["BisectReport", "Finding", "Pipeline", "STAGE_NAMES", "Subject", "bisect", "load_subject"]


def __getattr__(name: str) -> Any:
    # loaded on first use: ``import torch_ir`` must not import the compiler and runtime
    if name == "bisect":
        from .bisect import bisect

        return bisect
    if name in ("BisectReport", "Finding"):
        from . import report

        return getattr(report, name)
    if name in ("Pipeline", "STAGE_NAMES"):
        from . import stages

        return getattr(stages, name)
    if name == "load_subject":
        from .sources import load_subject

        return load_subject
    raise AttributeError(f"module 'npu_tools.debug' has no attribute {name!r}")
