"""One way to write an output file: whole or not at all, durable, and with one clear error.

Every writer of the toolkit (IR JSON, ``.safetensors`` weights, ``.npubin`` programs, ``.npz`` outputs and
the Markdown/JSON reports of the command line) goes through :func:`atomic_write`:

- the data goes to a temporary file beside the target with a random name (``secrets.token_hex``), created
  with ``open(..., "xb")`` so that two writers never share one and an existing file is never opened;
- it is flushed and fsynced, then renamed over the target with ``os.replace`` (atomic within one file
  system: readers see the old file or the complete new one), then the directory is fsynced (best effort);
- a new file gets the mode a plain ``open()`` would give it (``0o666 & ~umask``); overwriting an existing
  file keeps that file's permission bits;
- on any failure the temporary file is removed and the error is an :class:`OutputWriteError` naming the
  target (never the temporary name), the reason and the fix.

Commands that write several files call :func:`check_output_path` for each of them first, so that a bad
path is refused before anything is written.

Reading goes through :func:`read_input` (or :func:`check_regular_file`, for a file a library opens by name):
a missing path, anything but a regular file (a directory, a FIFO, ``/dev/zero`` or a link to one), an
unreadable file or one larger than ``torch_ir.limits`` is one :class:`InputReadError` naming the file, before
anything is read; the read itself is bounded.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from .errors import InputNotFoundError, InputReadError, OutputWriteError
from .limits import check_alloc, get_limits

Writer = Callable[[BinaryIO], None]


# The error for a known cause is also the matching built-in OSError, so ``except FileNotFoundError`` (or
# PermissionError, ...) around a save keeps working; ``except OutputWriteError`` catches them all.
class OutputDirectoryMissingError(OutputWriteError, FileNotFoundError):
    """The target's directory does not exist."""


class OutputPermissionError(OutputWriteError, PermissionError):
    """The target's directory (or the file) may not be written."""


class OutputIsADirectoryError(OutputWriteError, IsADirectoryError):
    """The target path is a directory."""


class OutputNotADirectoryError(OutputWriteError, NotADirectoryError):
    """A folder on the target's path is a file."""


_ERROR_CLASSES = {errno.ENOENT: OutputDirectoryMissingError, errno.EACCES: OutputPermissionError,
                  errno.EPERM: OutputPermissionError, errno.EISDIR: OutputIsADirectoryError,
                  errno.ENOTDIR: OutputNotADirectoryError}
_TEMP_STEM_BYTES = 64  # of the target's name kept in the temp name, so a long (valid) target name still fits


def atomic_write(path: str | os.PathLike, data: bytes | bytearray | memoryview | str | Writer, *,
                 what: str = "file", replace_links: bool = False) -> None:
    """Write ``data`` to ``path`` atomically; raise :class:`OutputWriteError` (naming ``path``) on failure.

    ``data`` is bytes, a str (written as UTF-8) or a callable given the open temporary file (binary mode);
    it must write through that handle only (not by the file's name: a library that renames its own temp
    file onto a name would replace a device such as ``/dev/null``). ``what`` names the file in messages
    ("IR file", "weights file", ...). An exception other than ``OSError`` raised by the callable (a serialization
    error, say) propagates unchanged, after the temporary file is removed.

    ``replace_links``: a file the toolkit names inside an output directory (a report, a repro) never follows a
    symbolic link planted there: the link itself is replaced by the new file (``os.replace`` renames over a
    link, it does not write through it), even a link to a device or a FIFO. Without it, a path the user gave
    is followed as the user made it (``-o /dev/stdout``, a link to a shared drive).
    """
    target = Path(path)
    if replace_links and os.path.islink(target):
        check_writable_dir(target.parent, what, target=target)
    else:
        check_output_path(target, what)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    # /dev/null, /dev/stdout, a named pipe: write into it, never replace the node (unless reached by a link
    # planted in an output directory)
    if _is_stream(target) and not (replace_links and os.path.islink(target)):
        _write_stream(target, payload, what)
        return
    tmp = target.with_name(_temp_name(target.name))
    created = False
    try:
        mode = None if os.path.islink(target) else _existing_mode(target)  # never a link target's bits
        with open(tmp, "xb") as handle:
            created = True
            if mode is not None:  # else a new file keeps what open() gave it: 0o666 & ~umask
                os.fchmod(handle.fileno(), mode)
            if callable(payload):
                payload(handle)
            else:
                handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
        created = False
    except OSError as err:
        raise write_error(target, err, what) from err
    finally:
        if created:
            _remove_quietly(tmp)
    _fsync_directory(target.parent)


def check_output_path(path: str | os.PathLike, what: str = "file") -> None:
    """Refuse, before anything is written, a target that cannot be written: its directory is missing or
    not writable, the path is a directory, or the name is too long. Raises :class:`OutputWriteError`."""
    target = Path(path)
    if len(os.fsencode(target.name)) > _name_max(target.parent):
        raise write_error(target, OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG)), what)
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None  # a new file (or a missing directory, reported below)
    except OSError as err:  # a folder on the way is a file, a loop of links, a path too long, ...
        if err.errno == errno.ENOENT:
            mode = None
        else:
            raise write_error(target, err, what) from None
    if mode is not None:
        if stat.S_ISDIR(mode):
            raise write_error(target, IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR)), what)
        if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):  # written in place (see atomic_write)
            if not os.access(target, os.W_OK):
                raise write_error(target, PermissionError(errno.EACCES, os.strerror(errno.EACCES)), what)
            return
        if not stat.S_ISREG(mode):
            raise OutputWriteError(f"cannot write {what} {str(target)!r}: it exists and is not a regular file "
                                   "(a device or socket); choose a file path")
    check_writable_dir(target.parent, what, target=target)


def check_writable_dir(directory: str | os.PathLike, what: str = "file", *, target: Path | None = None) -> None:
    """Raise :class:`OutputWriteError` unless ``directory`` exists, is a directory and may be written to.

    ``target`` (a file in it) is the path the message names; by default the directory itself.
    """
    directory = Path(directory) if str(directory) else Path(".")
    named = target if target is not None else directory
    try:
        mode = os.stat(directory).st_mode
    except OSError as err:  # ENOENT: missing; ENOTDIR: a folder above is a file; others as they are
        raise write_error(named, err, what) from None
    if not stat.S_ISDIR(mode):
        raise write_error(named, NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)), what)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise write_error(named, PermissionError(errno.EACCES, os.strerror(errno.EACCES)), what)
    _probe_create(directory, named, what)


def _probe_create(directory: Path, named: Path, what: str) -> None:
    """Create and remove a file in ``directory``: ``os.access`` says yes to root for ``/proc`` or a read-only
    mount, and a command that writes several files must know before its first one that its last will work."""
    probe = directory / _temp_name(".probe")
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except OSError as err:
        if err.errno == errno.ENOENT:  # the directory exists (checked above) but takes no new files: /proc, /sys
            raise OutputWriteError(f"cannot write {what} {str(named)!r}: no file can be created in directory "
                                   f"{str(directory)!r} (a virtual file system); choose another path") from None
        raise write_error(named, err, what) from None
    _remove_quietly(probe)


def make_output_dir(path: str | os.PathLike, what: str = "output directory", *, parents: bool = False) -> Path:
    """``-o DIR`` of a command that writes several files: an existing writable directory, or a new one made in
    an existing, writable parent. Never a chain of missing folders for a path the user typed: a mistyped
    ``-o /nonexistent/x`` is an error, not a tree grown at the root (``parents=True``: a command's own default,
    such as ``reports/demo``, is made whole)."""
    target = Path(path)
    if target.is_dir():
        check_writable_dir(target, what)
        return target
    if os.path.lexists(target):
        raise OutputWriteError(f"cannot use {what} {str(target)!r}: it exists and is not a directory; give a "
                               "directory (new or existing)")
    if parents and not target.parent.exists():
        make_output_dir(target.parent, what, parents=True)
    check_writable_dir(target.parent, what, target=target)
    try:
        target.mkdir()
    except FileExistsError:
        if not target.is_dir():
            raise
    except OSError as err:
        raise write_error(target, err, what) from None
    return target


def write_error(target: Path, err: OSError, what: str = "file") -> OutputWriteError:
    """The one-line error for a failed write of ``target``: what went wrong and how to fix it."""
    directory = target.parent if str(target.parent) else Path(".")
    code = err.errno
    if code == errno.ENOENT:
        reason = f"directory {str(directory)!r} does not exist"
        fix = f"create it first (mkdir -p {directory}) or choose another path"
    elif code == errno.ENOTDIR:
        reason = f"{str(directory)!r} (or a folder above it) is not a directory"
        fix = "choose a path inside an existing directory"
    elif code == errno.EISDIR:
        reason = "the path is a directory"
        fix = f"give a file name, e.g. {target / ('output' + (target.suffix or ''))}"
    elif code in (errno.EACCES, errno.EPERM):
        reason = f"permission denied: directory {str(directory)!r} is not writable (or the file is protected)"
        fix = "choose a writable directory or change its permissions"
    elif code == errno.EROFS:
        reason = f"directory {str(directory)!r} is on a read-only file system"
        fix = "choose a directory on a writable file system"
    elif code == errno.ENAMETOOLONG:
        reason = f"the file name is too long ({len(os.fsencode(target.name))} bytes; the limit here is " \
                 f"{_name_max(directory)})"
        fix = "choose a shorter name"
    elif code in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        reason = "no space left on the device (or the disk quota is used up)"
        fix = "free some space or write to another disk; nothing was written"
    else:
        reason = err.strerror or str(err)
        fix = "check the path and the file system; nothing was written"
    return _ERROR_CLASSES.get(code, OutputWriteError)(f"cannot write {what} {str(target)!r}: {reason}; {fix}")


def read_input(path: str | os.PathLike, what: str = "file", fix: str = "check the path") -> bytes:
    """The bytes of an input file, refusing with :class:`InputReadError` (naming ``path``, the reason and
    ``fix``) a path that does not exist, is not a regular file (a directory, a FIFO, a device such as
    ``/dev/zero``, a socket, or a link to one), cannot be read, or is larger than
    ``torch_ir.limits.max_alloc_bytes`` (it would be read whole into memory). The file is opened without
    blocking and read with that bound, so a file that grows while it is read is refused too."""
    source = Path(path)
    limit = check_regular_file(source, what, fix)
    try:
        fd = os.open(source, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise InputReadError(f"{what} {str(source)!r} cannot be read ({err.strerror or err}); {fix}") from None
    with os.fdopen(fd, "rb") as handle:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped for a FIFO or device after the check
                raise InputReadError(_not_regular(source, what, os.fstat(fd).st_mode))
            data = handle.read(limit + 1)
        except OSError as err:
            raise InputReadError(f"{what} {str(source)!r} cannot be read ({err.strerror or err}); {fix}") from None
    if len(data) > limit:
        check_alloc(len(data), f"{what} {str(source)!r} (it grew while it was read)")
    return data


def check_regular_file(path: str | os.PathLike, what: str = "file", fix: str = "check the path", *,
                       read_whole: bool = True) -> int:
    """Refuse, before anything opens it, a ``path`` that is missing or is not a regular file (a link is
    followed: a link to ``/dev/zero`` or to a FIFO is refused by what it points to), or, when it will be
    read whole (``read_whole``; not a safetensors file, which is mapped and checked tensor by tensor), one
    whose size is over ``max_alloc_bytes``. Returns the most bytes a read of it may take. For files that a
    library opens by name (safetensors, tokenizers, transformers' configs), call this first."""
    source = Path(path)
    try:
        st = os.stat(source)
    except FileNotFoundError:
        raise InputNotFoundError(f"{what} {str(source)!r} does not exist; {fix}") from None
    except OSError as err:
        raise InputReadError(f"{what} {str(source)!r} cannot be read ({err.strerror or err}); {fix}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputReadError(f"{what} {str(source)!r} is a directory; give the path of the file itself")
    if not stat.S_ISREG(st.st_mode):
        raise InputReadError(_not_regular(source, what, st.st_mode))
    if read_whole:
        check_alloc(st.st_size, f"{what} {str(source)!r}")
    return max(get_limits().max_alloc_bytes, st.st_size)


def file_kind(data: bytes) -> str | None:
    """What a file of the toolkit's world is, from its first bytes (for an error that says "m.safetensors is a
    safetensors weights file" instead of a decode error), or None when it is none of them."""
    if data.startswith(b"NPUBIN\0\0"):
        return "a compiled program (.npubin)"
    if data.startswith(b"\x93NUMPY"):
        return "a numpy array (.npy)"
    if data.startswith(b"PK\x03\x04"):
        return "a zip archive (a .npz of arrays or a PyTorch .pt checkpoint)"
    if data.startswith(b"GGUF"):
        return "a GGUF model file"
    if len(data) >= 9 and data[8:9] == b"{" and int.from_bytes(data[:8], "little") <= len(data) - 8:
        return "a safetensors weights file"
    if len(data) >= 2 and data[0] == 0x08 and 3 <= data[1] <= 12:  # ModelProto's ir_version field comes first
        return "an ONNX model (protobuf)"
    return None


def _not_regular(source: Path, what: str, mode: int) -> str:
    kind = ("a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a file")
    via = f" (a link to {os.path.realpath(source)!r})" if os.path.islink(source) else ""
    return (f"{what} {str(source)!r} is {kind}{via}, not a regular file: reading it could block forever or never "
            "end; give the path of a regular file")


def _is_stream(target: Path) -> bool:
    """A character device or a FIFO (``/dev/null``, ``/dev/stdout`` on a pipe): written in place."""
    try:
        mode = os.stat(target).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def _write_stream(target: Path, payload: bytes | bytearray | memoryview | Writer, what: str) -> None:
    try:
        with open(target, "wb") as handle:
            if callable(payload):
                payload(handle)
            else:
                handle.write(payload)
    except OSError as err:
        raise write_error(target, err, what) from err


def _temp_name(name: str) -> str:
    stem = os.fsdecode(os.fsencode(name)[:_TEMP_STEM_BYTES])
    return f".{stem}.{secrets.token_hex(8)}.tmp"


def _existing_mode(target: Path) -> int | None:
    """Permission bits of the file being replaced (setuid/setgid dropped), or None for a new file."""
    try:
        st = os.stat(target)
    except OSError:
        return None
    return stat.S_IMODE(st.st_mode) & 0o777 if stat.S_ISREG(st.st_mode) else None


def _name_max(directory: Path) -> int:
    try:
        return os.pathconf(directory if str(directory) else ".", "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def _remove_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable; best effort because some platforms cannot open a directory."""
    try:
        fd = os.open(directory if str(directory) else ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = [
    "OutputDirectoryMissingError", "OutputIsADirectoryError", "OutputNotADirectoryError", "OutputPermissionError",
    "atomic_write", "check_output_path", "check_regular_file", "check_writable_dir", "file_kind",
    "make_output_dir", "read_input", "write_error",
]
