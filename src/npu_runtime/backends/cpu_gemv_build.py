"""Building the native GEMV kernel (``gemv.c``, shipped beside this module) and loading it with ``ctypes``.

Built with ``gcc -O3 -shared -fPIC -fopenmp`` (``$CC`` when set; without ``-fopenmp`` when that fails)
into :func:`cache_dir` ``/gemv-<hash>.so``, the hash covering the source, the compiler, its flags and the
machine's architecture, so an edited ``gemv.c`` or another compiler builds anew. The library is written
to a temporary name and renamed, so a process never loads half a file written by another, and only
loaded from a folder and file that are the user's own and writable by nobody else; otherwise it is built
in a private temporary folder, for this process alone. Which kernel runs (AVX-512, AVX2/FMA/F16C or portable
C: :data:`ISAS`) is asked of the loaded library (``gemv_isa``), so one ``.so`` serves any x86-64 of a CI pool.

:func:`open_library` builds and loads any such C source (``bench/gemv`` builds its read loop with it).
:func:`tensor_arg` is the check every C call of the CPU backend makes of each tensor it passes.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

#: the kernel's source, package data of ``npu_runtime.backends``
SOURCE_NAME = "gemv.c"
#: appended to it (one translation unit): a prefill's GEMM of fp32 / bf16 / fp16 weights (``gemm_tiles``)
GEMM_SOURCE = "gemm_tiles.c"
#: bf16 / fp16 <-> fp32 conversions, put before each kernel that reads half tensors (one definition for them all)
HALF_SOURCE = "half.c"
#: the weight-only quantized (GGUF Q8_0 / Q4_0 / Q5_0 / Q4_K / Q6_K blocks) GEMV kernel's source (:func:`load_q`)
Q_SOURCE_NAME = "gemv_q.c"
#: appended to it (one translation unit): Q5_0's codes, the x-quantized-to-int8 path (Q4_0 / Q5_0 / Q4_K, then Q8_0 /
#: Q6_K, then on 16-row interleaved copies, and those decoded for many rows of x), the rows' dequantization (prefill
#: tiles)
Q_SOURCE_PARTS = (HALF_SOURCE, Q_SOURCE_NAME, "gemv_q5.c", "gemv_q_i8.c", "gemv_q_i8k.c", "gemv_q_x16.c",
                  "gemv_q_x16t.c", "gemv_q_deq.c")
FLAGS = ["-O3", "-std=gnu11", "-shared", "-fPIC"]
OPENMP_FLAGS = ["-fopenmp"]
#: the x86 kernels' levels, by the names an ``isa=`` cap or ``TORCH_IR_GEMV_ISA`` / ``TORCH_IR_QGEMV_ISA`` takes: the
#: codes ``gemv_isa`` and ``qgemv_isa`` return (2 AVX-512 F/BW(/VL), 1 AVX2/FMA/F16C, 0 portable C)
ISAS: dict[str, int] = {"c": 0, "avx2": 1, "avx512": 2}


class BuildError(RuntimeError):
    """The library cannot be had here: no compiler, a failed build, no folder to build in."""


@dataclass(frozen=True)
class Library:
    """The loaded GEMV kernel, its functions' ``ctypes`` signatures set."""

    lib: ctypes.CDLL
    path: Path
    isa: int  # the best the CPU runs: a code of ISAS
    openmp: bool


def kernel_source(name: str = SOURCE_NAME) -> str:
    """The C source of a kernel (the GEMV's by default), read from the installed package (a wheel ships it
    as package data)."""
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def with_half(name: str) -> str:
    """:data:`HALF_SOURCE`'s conversions, then the source ``name``: one translation unit."""
    return kernel_source(HALF_SOURCE) + "\n" + kernel_source(name)


def gemv_source() -> str:
    """What :func:`load` compiles: :data:`HALF_SOURCE`, :data:`SOURCE_NAME`, then :data:`GEMM_SOURCE`."""
    return with_half(SOURCE_NAME) + "\n" + kernel_source(GEMM_SOURCE)


def cache_dir() -> Path:
    """Where compiled kernels are kept: ``$TORCH_IR_CACHE``, else ``$XDG_CACHE_HOME/torch_ir``, else
    ``~/.cache/torch_ir``; the ``gemv`` folder inside it."""
    if os.environ.get("TORCH_IR_CACHE"):
        root = Path(os.environ["TORCH_IR_CACHE"])
    elif os.environ.get("XDG_CACHE_HOME"):
        root = Path(os.environ["XDG_CACHE_HOME"]) / "torch_ir"
    else:
        root = Path.home() / ".cache" / "torch_ir"
    return root / "gemv"


def find_compiler() -> str | None:
    """``$CC``, else ``gcc``, as found on ``PATH``; None when there is none."""
    return shutil.which(os.environ.get("CC") or "gcc")


def private(path: Path) -> bool:
    """Ours and writable by nobody else: a library there runs as this process, so it must be the one we
    built (another user able to write the cache folder could otherwise put code in it)."""
    try:
        st = path.stat()
    except OSError:
        return False
    return (not hasattr(os, "getuid") or st.st_uid == os.getuid()) and not st.st_mode & 0o022


def build(source: str, compiler: str, flags: list[str], target: Path) -> None:
    """Compile ``source`` into ``target`` via a temporary file in its folder and an atomic rename."""
    fd, tmp_so = tempfile.mkstemp(prefix=target.stem + ".", suffix=".so.tmp", dir=target.parent)
    os.close(fd)
    src = Path(tmp_so[: -len(".so.tmp")] + ".c")
    try:
        # a copy of the text that was hashed, not the package's file: an edit meanwhile cannot slip in
        src.write_text(source, encoding="utf-8")
        proc = subprocess.run([compiler, *flags, "-o", tmp_so, str(src)], capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"{Path(compiler).name} failed: {proc.stderr.strip()[-2000:]}")
        os.chmod(tmp_so, 0o755)
        os.replace(tmp_so, target)
    finally:
        for leftover in (src, Path(tmp_so)):
            leftover.unlink(missing_ok=True)


def _load_from(source: str, name: str, folder: Path, compiler: str,
               extra: Sequence[str]) -> tuple[ctypes.CDLL, Path]:
    """Build (unless cached) and load ``source`` in ``folder``: with OpenMP, else without."""
    errors = []
    for flags in ([*FLAGS, *extra, *OPENMP_FLAGS], [*FLAGS, *extra]):
        key = hashlib.sha256("\0".join([source, compiler, *flags, platform.machine()]).encode()).hexdigest()[:20]
        target = folder / f"{name}-{key}.so"
        try:
            if not (target.exists() and private(target)):
                build(source, compiler, flags, target)
            return ctypes.CDLL(str(target)), target
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            errors.append(str(exc))
    raise RuntimeError("; ".join(errors))


def open_library(source: str, name: str, extra: Sequence[str] = ()) -> tuple[ctypes.CDLL, Path]:
    """``source`` compiled (once per machine: kept in :func:`cache_dir` as ``<name>-<hash>.so``) and loaded;
    ``extra``: flags this source needs beyond :data:`FLAGS`.

    Raises :class:`BuildError` with the reason when it cannot be had."""
    compiler = find_compiler()
    if compiler is None:
        raise BuildError(f"no C compiler ({os.environ.get('CC') or 'gcc'}) on PATH")
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not private(folder):
            raise PermissionError(f"{folder} is not private to this user")
        return _load_from(source, name, folder, compiler, extra)
    except (OSError, RuntimeError) as exc:
        log.debug("%s: cache %s unusable (%s); building in a temporary folder", name, folder, exc)
    try:  # an unwritable or shared cache: build in a private temporary folder, for this process
        return _load_from(source, name, Path(tempfile.mkdtemp(prefix=f"torch_ir_{name}_")), compiler, extra)
    except (OSError, RuntimeError) as exc:
        raise BuildError(str(exc)) from exc


def load() -> Library:
    """The GEMV kernel built from :data:`SOURCE_NAME` and loaded, its ISA asked of the CPU at run time."""
    try:
        source = gemv_source()
    except OSError as exc:  # an install without its package data: the torch path still runs
        raise BuildError(f"cannot read {HALF_SOURCE} + {SOURCE_NAME} + {GEMM_SOURCE}: {exc}") from exc
    lib, path = open_library(source, "gemv")
    i64, cint, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    lib.gemv.argtypes = [i64, i64, i64, ptr, cint, ptr, cint, ptr, cint, ptr, cint, ptr, cint, cint, cint,
                         ctypes.c_float]
    lib.gemv.restype = cint
    lib.gemv_min_abs_bf16.argtypes = [ptr, i64]
    lib.gemv_min_abs_bf16.restype = ctypes.c_float
    lib.gemv_packed.argtypes = [ctypes.c_char_p]
    lib.gemv_packed.restype = cint
    lib.gemm_tiles.argtypes = [i64, i64, i64, ptr, ptr, cint, ptr, ptr, i64, cint, cint]
    lib.gemm_tiles.restype = cint
    lib.gemm_tiles_panel.restype = cint
    lib.gemv_isa.restype = cint
    lib.gemv_openmp.restype = cint
    log.debug("GEMV kernel: %s", path)
    return Library(lib, path, int(lib.gemv_isa()), bool(lib.gemv_openmp()))


def load_q() -> Library:
    """The quantized GEMV kernel (:data:`Q_SOURCE_PARTS` in order, ``npu_runtime.backends.cpu_qgemv``) built and
    loaded like :func:`load`; its ``isa`` is 2 for AVX-512 F/BW, 1 for AVX2/FMA/F16C, 0 for portable C."""
    try:
        source = "\n".join(kernel_source(name) for name in Q_SOURCE_PARTS)
    except OSError as exc:
        raise BuildError(f"cannot read {' + '.join(Q_SOURCE_PARTS)}: {exc}") from exc
    lib, path = open_library(source, "gemv_q")
    lib.qgemv_packed.argtypes = [ctypes.c_char_p]
    lib.qgemv_packed.restype = ctypes.c_int
    lib.qgemv_isa.restype = ctypes.c_int
    lib.qgemv_openmp.restype = ctypes.c_int
    lib.qgemv_vnni.restype = ctypes.c_int
    lib.qdeq_rows_packed.argtypes = [ctypes.c_char_p]
    lib.qdeq_rows_packed.restype = ctypes.c_int
    lib.qpack16_packed.argtypes = [ctypes.c_char_p]
    lib.qpack16_packed.restype = ctypes.c_int
    log.debug("quantized GEMV kernel: %s", path)
    return Library(lib, path, int(lib.qgemv_isa()), bool(lib.qgemv_openmp()))


def load_packed(source_name: str | tuple[str, ...], prefix: str) -> Library:
    """A kernel built from ``source_name`` (or several sources, one translation unit in that order) whose C exports
    ``<prefix>_packed(const char *args) -> int`` (one argument block), ``<prefix>_isa()`` and ``<prefix>_openmp()``,
    loaded like :func:`load` (``qelementwise.c``; ``qconv.c`` + ``qconv_run.c``, and + ``qmatmul.c``)."""
    names = (source_name,) if isinstance(source_name, str) else source_name
    try:
        source = "".join(kernel_source(name) for name in names)
    except OSError as exc:
        raise BuildError(f"cannot read {' + '.join(names)}: {exc}") from exc
    lib, path = open_library(source, prefix)
    entry = getattr(lib, f"{prefix}_packed")
    entry.argtypes, entry.restype = [ctypes.c_char_p], ctypes.c_int
    isa, openmp = getattr(lib, f"{prefix}_isa"), getattr(lib, f"{prefix}_openmp")
    isa.restype = openmp.restype = ctypes.c_int
    log.debug("%s kernel: %s", prefix, path)
    return Library(lib, path, int(isa()), bool(openmp()))


def isa_cap(variable: str, isas: Mapping[str, int]) -> int:
    """The environment variable ``variable`` (``TORCH_IR_QGEMV_ISA``, ...) as one of ``isas``' codes: the best there
    is when it is unset; a value it cannot be is an error naming the choices."""
    value = os.environ.get(variable, "").strip().lower()
    if not value:
        return max(isas.values())
    if value not in isas:
        raise ValueError(f"{variable}={value!r} is not one of {', '.join(isas)}")
    return isas[value]


class NativeKernel:
    """One compiled kernel as its Python module uses it: built on first use by ``build`` (:func:`load`,
    :func:`load_q`), the outcome kept (the library, or why it could not be had: then every call takes the torch
    path, and one warning says so). ``NativeKernel.enabled`` is one switch for every native GEMV
    (``TORCH_IR_NATIVE_GEMV=0``; ``set_native_enabled`` of either module)."""

    enabled = os.environ.get("TORCH_IR_NATIVE_GEMV", "1").strip().lower() not in ("0", "false", "no", "off")

    def __init__(self, what: str, build: Callable[[], Library], isa_name: Callable[[Library], str],
                 fallback_note: str) -> None:
        self.what, self._build, self._isa_name, self._note = what, build, isa_name, fallback_note
        self._lock = threading.Lock()
        self.library: Library | None = None
        self.failed: str | None = None
        self.warned = False

    def load(self) -> Library | None:
        """The library, built now if it is not yet (once per process: a failure is kept, not retried)."""
        if self.library is not None or self.failed is not None:
            return self.library
        with self._lock:
            if self.library is None and self.failed is None:
                try:
                    self.library = self._build()
                except BuildError as exc:
                    self.failed = str(exc)
            return self.library

    def status(self) -> str:
        """One line: which implementation calls run here, and why."""
        if not NativeKernel.enabled:
            return "torch (native GEMV disabled by TORCH_IR_NATIVE_GEMV=0 or set_native_enabled(False))"
        library = self.load()
        if library is None:
            return f"torch (native {self.what} unavailable: {self.failed})"
        threads = "OpenMP" if library.openmp else "one thread (built without OpenMP)"
        return f"native {self._isa_name(library)}, {threads}: {library.path}"

    def or_reference(self, native: bool, reference: Any, inputs: list[torch.Tensor], outputs: list[torch.Tensor]
                     ) -> Library | None:
        """The library a CPU kernel's call runs (``native``: whether its ``prepare`` found the call exact), or None
        after running ``reference`` on the call's tensors instead: the opening every native kernel's ``run`` shares."""
        library = self.for_call(stacklevel=5) if native else None
        if library is None:
            reference.run(inputs, outputs)
        return library

    def for_call(self, stacklevel: int = 4) -> Library | None:
        """The library a call runs, or None for the torch path; the first fallback of a wanted kernel warns."""
        if not NativeKernel.enabled:
            return None
        library = self.load()
        if library is None and not self.warned:
            self.warned = True
            warnings.warn(f"torch_ir CPU {self.what}: {self.status()}; {self._note}", RuntimeWarning,
                          stacklevel=stacklevel)
        return library


def tensor_arg(t: object, op: str, what: str, dtypes: Mapping[torch.dtype, int],
               shape: tuple[int, ...] | None = None) -> tuple[int, int, int]:
    """``(address, dtype code, bytes)`` of a tensor a native kernel touches, after checking everything its pointer
    arithmetic relies on: a CPU tensor of one of ``dtypes`` (dtype -> the kernel's code), of ``shape`` when given,
    contiguous, and its bytes inside its storage (a view whose storage was shrunk with ``resize_`` claims bytes
    that are gone). The one check every C call of the CPU backend (GEMV, quantized GEMV, decode ops) makes."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {what} must be a tensor, not {type(t).__name__}")
    code = dtypes.get(t.dtype)
    if code is None or not t.is_cpu:
        names = "/".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{op}: {what} must be a CPU {names} tensor, got {t.dtype} on {t.device}")
    if shape is not None and tuple(t.shape) != shape:
        raise ValueError(f"{op}: {what} has shape {tuple(t.shape)}, expected {shape}")
    if not t.is_contiguous():
        raise ValueError(f"{op}: {what} must be contiguous (call .contiguous())")
    size = t.nbytes
    if size and t.storage_offset() * t.element_size() + size > t.untyped_storage().nbytes():
        raise ValueError(f"{op}: {what} claims {size} bytes beyond what its storage holds")
    return t.data_ptr(), code, size


def overlaps(a: int, a_size: int, b: int, b_size: int) -> bool:
    """Whether the byte ranges ``[a, a + a_size)`` and ``[b, b + b_size)`` share a byte."""
    return a < b + b_size and b < a + a_size


@dataclass(frozen=True)
class NativeCall:
    """One call of a native kernel, checked and packed but not made: ``fn`` a ctypes function of one of these
    libraries that takes one argument block and returns 0 (done) or a failure code, ``block`` that block, ``keep``
    every tensor its pointers reach (held as long as the call is: what it points into cannot be freed before it is
    made). Called now (``call()``), or later, in a chain of such calls made by one C call
    (``npu_runtime.backends.cpu_chain``)."""

    fn: Any
    block: bytes
    keep: Any = None

    def __call__(self) -> int:
        return int(self.fn(self.block))

    @property
    def address(self) -> int:
        """The C function's address (what a chain calls)."""
        return int(ctypes.cast(self.fn, ctypes.c_void_p).value)


def set_enabled(enabled: bool) -> bool:
    """``NativeKernel.enabled``, the one switch; returns the previous setting."""
    previous, NativeKernel.enabled = NativeKernel.enabled, bool(enabled)
    return previous


__all__ = ["FLAGS", "HALF_SOURCE", "ISAS", "OPENMP_FLAGS", "Q_SOURCE_NAME", "Q_SOURCE_PARTS", "SOURCE_NAME",
           "BuildError", "Library", "NativeCall", "NativeKernel", "build", "cache_dir", "find_compiler",
           "kernel_source", "load", "load_q", "open_library", "overlaps", "private", "set_enabled", "tensor_arg",
           "with_half"]
