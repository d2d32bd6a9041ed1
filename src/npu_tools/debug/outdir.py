"""Where ``bisect`` writes: the output directory the user names, and nothing followed inside it.

``bisect -o DIR`` writes ``DIR/report.*``, ``DIR/error.png`` and the ``DIR/repro/`` directory. ``DIR`` may be
shared or left over from an earlier run, so anything in it may have been planted: ``DIR/report.md`` as a
symbolic link to ``~/.bashrc``, ``DIR/repro`` as a link to another directory. The policy:

- ``DIR`` itself is the user's choice and is used as given (a link the user made to a directory included);
- below it, bisect **refuses** an entry it would write that is a symbolic link (to anything), a directory
  where a file goes, a file where a directory goes, or a FIFO, device or socket. Refusing, rather than
  replacing the link, because a link there was not made by bisect: someone put it there, and one clear error
  naming it is better than silently deleting it;
- every entry is checked with ``os.lstat`` (which does not follow links) before bisect runs (a bad
  directory costs nothing and leaves nothing half-written), and again immediately before each write, every
  path component below ``DIR`` included, so a link planted during the run is caught too; the repro directory
  must also still be the directory (device and inode) it was when its writing began;
- files are written by :func:`torch_ir.fileio.atomic_write`: a temporary file created with ``O_EXCL``
  (which never follows a link) and renamed over the target (which replaces a link, never writes through
  it); the ``repro`` directory is made with ``os.mkdir``, which fails on an existing link instead of
  following it.

What remains is a race with someone who can write into ``DIR`` *while* bisect writes (between the check and
the rename): the rename still replaces rather than follows, so at worst such a writer makes bisect fail.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from torch_ir.errors import OutputWriteError
from torch_ir.fileio import check_writable_dir

REPORT_FILES = ("report.json", "report.md", "report.html", "error.png", "error.svg")
REPRO_DIR = "repro"


class PlantedOutputError(OutputWriteError):
    """An entry of bisect's output directory that bisect would write is a link or a special file."""


def check_output_dir(out: str | os.PathLike, repro_files: tuple[str, ...] = ()) -> None:
    """Before anything runs: ``out`` can be made or written, and none of the entries bisect writes in it
    (``REPORT_FILES``, ``repro/`` and ``repro_files`` inside it) is a link or of the wrong kind."""
    out = Path(out)
    if out.exists():
        check_writable_dir(out, "bisect output directory")
    else:
        check_writable_dir(_nearest_existing(out), "bisect output directory", target=out)
        return  # a directory still to be made holds nothing
    for name in REPORT_FILES:
        check_entry(out / name, "file")
    repro = out / REPRO_DIR
    if check_entry(repro, "directory"):
        for name in repro_files:
            check_entry(repro / name, "file")


def check_entry(path: Path, kind: str) -> bool:
    """Refuse ``path`` (not followed) if it is a link, or exists and is not a ``kind`` ("file" or "directory");
    returns whether it exists."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as err:
        raise PlantedOutputError(f"cannot write {str(path)!r}: {err.strerror or err}") from None
    if stat.S_ISLNK(mode):
        raise PlantedOutputError(
            f"cannot write {str(path)!r}: it is a symbolic link (to {_link_target(path)!r}); bisect never writes "
            "through a link inside its output directory (a planted one would redirect the write to another "
            "file); remove the link or choose a new output directory")
    wanted = stat.S_ISDIR(mode) if kind == "directory" else stat.S_ISREG(mode)
    if not wanted:
        raise PlantedOutputError(f"cannot write {str(path)!r}: it exists and is {_kind_of(mode)}, where bisect "
                                 f"writes a {kind}; remove it or choose a new output directory")
    return True


def check_inside(root: Path, path: Path, kind: str = "file") -> None:
    """Right before a write: no component of ``path`` below ``root`` is a link, the folders are folders and
    ``path`` itself is absent or a ``kind``."""
    relative = path.relative_to(root)
    current = root
    for part in relative.parts[:-1]:
        current = current / part
        if not check_entry(current, "directory"):
            raise PlantedOutputError(f"cannot write {str(path)!r}: directory {str(current)!r} is missing "
                                     "(removed during the run?)")
    check_entry(path, kind)


def make_dir_inside(root: Path, path: Path) -> Path:
    """``path`` (below ``root``) as a directory: made with ``os.mkdir``, which does not follow a planted link;
    an existing directory is kept (a second run over the same output directory replaces its files)."""
    check_inside(root, path, "directory")
    try:
        os.mkdir(path)
    except FileExistsError:
        check_entry(path, "directory")  # made by someone else in between: a directory, or refused
    except OSError as err:
        raise OutputWriteError(f"cannot create directory {str(path)!r}: {err.strerror or err}") from None
    return path


def identity(directory: Path) -> tuple[int, int]:
    """(device, inode) of the directory ``directory`` names now (a link the caller made is followed)."""
    st = os.stat(directory)
    return st.st_dev, st.st_ino


def check_same_directory(directory: Path, expected: tuple[int, int]) -> None:
    """Refuse to go on writing into ``directory`` once it is no longer the directory checked at the start (it was
    swapped for a link to another one, or removed, while bisect wrote)."""
    try:
        now = identity(directory)
    except OSError:
        now = None
    if now != expected:
        raise PlantedOutputError(f"cannot write into {str(directory)!r}: it was replaced (by a link to another "
                                 "directory, or removed) while bisect was writing in it; check who else writes "
                                 "there and choose a new output directory")


def _nearest_existing(path: Path) -> Path:
    """The closest folder above ``path`` that exists (``mkdir -p`` makes the rest)."""
    for parent in path.absolute().parents:
        if parent.exists():
            return parent
    return Path("/")


def _link_target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError as err:
        return os.strerror(err.errno or errno.EIO)


def _kind_of(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a file"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "not a regular file"


__all__ = ["PlantedOutputError", "REPORT_FILES", "REPRO_DIR", "check_entry", "check_inside", "check_output_dir",
           "check_same_directory", "identity", "make_dir_inside"]
