"""WGSL generators of the normalization, softmax, attention, rotary-embedding, KV-cache and embedding kernels.

Row-wise kernels (LAYER_NORM, RMS_NORM, group norm, SOFTMAX, the attention kernels) run one workgroup per row
and reduce in workgroup memory with a tree (no subgroup operations, so every adapter runs them); each
invocation strides over the row, so any row length works with one shader shape. Per-element kernels
(BATCH_NORM, LRN, ROPE, KV_UPDATE, EMBEDDING) run one invocation per output element in storage order.
Every tensor is addressed through its own layout (``offset``), so an NHWC activation and a row-major one
take the same path.

Masked scores are kept finite: a score at or below ``MASKED`` (-3e38: a bool mask's False, a causal
future, an additive -inf) counts as masked, so no shader relies on infinities, which WGSL lets an
implementation assume away.

The generators live by family in ``norms``, ``attention`` and ``positions`` (what they share in ``rows``);
the kernel table names them from this package (``gpu("transformer", "rms_norm")``).
"""

from .attention import attention, attn_output, attn_score
from .norms import batch_norm, group_norm, layer_norm, lrn, rms_norm, softmax
from .positions import embedding, kv_update, rope

__all__ = ["attention", "attn_output", "attn_score", "batch_norm", "embedding", "group_norm", "kv_update",
           "layer_norm", "lrn", "rms_norm", "rope", "softmax"]
