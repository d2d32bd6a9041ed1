"""WGSL generators of the data-movement kernels: views (when dispatched), permute, expand, slicing and
selecting, concatenation and splitting, gathers by index tensors, repeat, padding, roll, flip, fills and
scatters of static positions.

Every kernel is one invocation per output element (split and unbind: per input element, which is one per
element of all their outputs): it unravels its element's logical multi-index, maps it to the source
element and copies it, each tensor addressed through ``offset`` in its own layout (an NHWC input reads
right). Values go through the typed accessors, so one generator serves every dtype, except that an int64
is read as both its words, so movement never truncates one to its low word. A value changing dtype
(``copy``, ``cat`` of mixed dtypes) converts as torch does (float to int truncates, int to a narrower int
wraps, anything to bool is ``!= 0``).

Index tensors (``index``, ``gather``, ``index_select``) are int64 or int32; a negative index wraps once as
torch's does and the result is clamped into the dim, so an index torch would reject can never read outside
the tensor (torch raises; a GPU kernel cannot, and must not touch other tensors' memory).

The generators live by kind in ``views``, ``slicing``, ``joining``, ``gathers`` and ``tiling`` (what they share
in ``common``); the kernel table names them from this package (``gpu("movement", "pad")``).
"""

from .gathers import gather, index, index_select
from .joining import cat, split, unbind
from .slicing import select, select_scatter, slice, slice_scatter
from .tiling import flip, pad, repeat, repeat_interleave, roll
from .views import copy, expand, full, permute, reshape

__all__ = ["cat", "copy", "expand", "flip", "full", "gather", "index", "index_select", "pad", "permute", "repeat",
           "repeat_interleave", "reshape", "roll", "select", "select_scatter", "slice", "slice_scatter", "split",
           "unbind"]
