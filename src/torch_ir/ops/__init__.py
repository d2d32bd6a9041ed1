"""The op registry and the JSON form of attribute values."""

# registers the NPU ops, the quantized KV cache's last
from . import npu, npu_quant  # noqa: F401  # isort: skip
from . import npu_kvcache  # noqa: F401  # isort: skip
from .registry import OpDef, is_supported, register_op, registered_ops, unregister_op

__all__ = ["OpDef", "is_supported", "register_op", "registered_ops", "unregister_op"]
