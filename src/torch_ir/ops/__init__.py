"""The op registry and the JSON form of attribute values."""

from . import npu, npu_quant  # noqa: F401 - registers the NPU ops
from .registry import OpDef, is_supported, register_op, registered_ops, unregister_op

__all__ = ["OpDef", "is_supported", "register_op", "registered_ops", "unregister_op"]
