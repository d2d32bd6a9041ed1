"""tinygrad runs on its pure-Python device unless clang is installed (then its CPU device, much faster).

The device is chosen before tinygrad is first imported, which is why this lives in a conftest.
Without tinygrad installed (it is an optional extra) these tests are not collected.
"""

import importlib.util

from npu_tools.commands.import_tinygrad import default_device

default_device()

collect_ignore_glob = [] if importlib.util.find_spec("tinygrad") else ["test_*.py"]
