"""Quantized tensors: the spec a tensor carries (``spec``) and the reference arithmetic (``numerics``)."""

from .spec import BLOCKS, PACKED, QTYPES, QuantSpec, check_fits, check_spec, param_shape

__all__ = ["BLOCKS", "PACKED", "QTYPES", "QuantSpec", "check_fits", "check_spec", "param_shape"]
