"""``python -m tests``: the report runner of seed 002, the same as ``torch-ir zoo``.

    python -m tests --list-models
    python -m tests --category attention
    python -m tests --output reports/
"""

import sys

from npu_tools.cli import main

if __name__ == "__main__":
    argv = ["--list" if a == "--list-models" else a for a in sys.argv[1:]]
    sys.exit(main(["zoo", *argv]))
