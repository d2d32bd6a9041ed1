"""tinygrad runs on its pure-Python device unless clang is installed (then its CPU device, much faster).

The device is chosen before tinygrad is first imported, which is why this lives in a conftest.
Without tinygrad installed (it is an optional extra) these tests are not collected.
"""

import importlib.util
import os
import shutil

os.environ.setdefault("DEV", "CPU" if shutil.which("clang") else "PYTHON")

collect_ignore_glob = [] if importlib.util.find_spec("tinygrad") else ["test_*.py"]
