"""The ``torch-ir`` subcommands, one module per family; ``npu_tools.cli`` builds the parser from them."""
