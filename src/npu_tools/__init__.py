"""npu_tools: what a user types, on top of every other package.

The ``torch-ir`` command and its subcommands (``cli``, ``commands/``), the model zoo (``zoo``), the
numerical debugger (``debug``: bisect and repro), the demo, and the LLM checkpoint loader
(``lm_source``). Nothing below imports this package.
"""
