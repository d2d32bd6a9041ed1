"""Hostile corpus, second pass: array files (``bisect --input``, ``run --input``) and bisect's outputs.

Array files are untrusted input like an IR: a 2 MB ``.npz`` that decompresses to gigabytes, one whose zip
directory or ``.npy`` header lies about its sizes, strings, void, records, datetimes and pickled objects where
numbers are expected, a plain ``.npy`` where an ``.npz`` is, a truncated zip, a member that is not an array.
Each must end in one ``torch_ir.arrays`` error (or a ``LimitExceededError``) before anything is decompressed.

``bisect -o DIR`` must not write through links planted in ``DIR`` (report files linked to a victim file, the
``repro`` directory linked to a victim directory), and node names read from the IR (``<script>``, a newline,
backticks, pipes, ``$`` math) must reach its Markdown, HTML and plot as inert text.

API kinds (``outputs.<kind>``):

==================  ====================================================================================
``load_arrays``     ``torch_ir.arrays.load_arrays(file, "bisect inputs file")``
``load_array``      ``torch_ir.arrays.load_array(file, "input file")``
``bisect_planted``  ``bisect(tiny IR, out_dir=DIR)`` (with a kernel fault, so a repro would be written) into a
                    fresh DIR with the case's links planted; the victims must be untouched
``bisect_names``    ``bisect`` of the tiny IR with hostile node and module names and a kernel fault on that node:
                    it completes, with its report and repro, and no name is live markup in them
==================  ====================================================================================
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import struct
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from make_hostile_corpus import BASE_INPUT, BASE_IR, BASE_PROGRAM, BASE_WEIGHTS, Case, CliCall, _Builder, example_input

MiB = 1 << 20
#: A deflate segment of this many zero bytes is compressed once and repeated (full flushes make it standalone).
SEGMENT = 16 * MiB
BOMB_BYTES = 2048 * MiB  # what the bomb decompresses to
BOMB_LIMIT = 256 * MiB  # max_alloc_bytes for its case: under the bomb, far over the 2 MB file
PLANTED_FILES = ("report.json", "report.md", "report.html", "error.png", "error.svg")
VICTIM_TEXT = "a file bisect must never write through a planted link\n"
HOSTILE_NAME = "<script>alert(1)</script>\n# owned | `x` ```\n$\\frac{$"
HOSTILE_MODULE = "fc<img src=x onerror=alert(1)>\n## heading"


# -- API kinds ------------------------------------------------------------------------------------------

def _load_arrays(case: Case, d: Path) -> None:
    from torch_ir.arrays import load_arrays

    load_arrays(d / case.file, "bisect inputs file")


def _load_array(case: Case, d: Path) -> None:
    from torch_ir.arrays import load_array

    load_array(d / case.file, "input file")


def _bisect_planted(case: Case, d: Path) -> None:
    """bisect into a fresh directory holding this case's planted links; raises what bisect raises, or an
    AssertionError when a victim changed (that is the failure, whatever bisect did)."""
    from npu_tools.debug.bisect import bisect

    with tempfile.TemporaryDirectory(prefix="bisect_planted") as tmp:
        out, victims = _plant(Path(tmp), repro_link=case.id.endswith("repro_dir"))
        before = _state(victims)
        try:
            with _gelu_fault():
                bisect(str(d / BASE_IR), weights=str(d / BASE_WEIGHTS), out_dir=out, progress=False)
        finally:
            after = _state(victims)
            if after != before:
                changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
                raise AssertionError(f"bisect wrote through a planted link: {changed}")


def _bisect_names(case: Case, d: Path) -> None:
    """bisect of an IR whose faulty node has a hostile name: the report and repro are written, names inert."""
    from npu_tools.debug.bisect import bisect

    with tempfile.TemporaryDirectory(prefix="bisect_names") as tmp:
        out = Path(tmp) / "out"
        with _gelu_fault():
            report = bisect(str(d / case.file), weights=str(d / BASE_WEIGHTS), out_dir=out, progress=False)
        assert report.repro is not None and (report.repro / "README.md").is_file(), report.summary()
        for markdown in (out / "report.md", report.repro / "README.md"):
            assert_inert_markdown(markdown.read_text(encoding="utf-8"), str(markdown))
        page = (out / "report.html").read_text(encoding="utf-8")
        assert "<script" not in page and "<img src=x" not in page, "live markup in report.html"


API: dict[str, Callable[[Case, Path], None]] = {
    "outputs.load_arrays": _load_arrays,
    "outputs.load_array": _load_array,
    "outputs.bisect_planted": _bisect_planted,
    "outputs.bisect_names": _bisect_names,
}


def assert_inert_markdown(text: str, where: str) -> None:
    """Outside code spans and fenced blocks, no unescaped HTML tag, and no heading that a name started (each
    name is on one line: a line starting with ``# owned`` is one)."""
    prose = _without_code(text)
    for pattern, what in ((r"(?<!\\)<(script|img)\b", "an HTML tag"),
                          (r"(?m)^#+ (owned|heading)", "a heading made by a name")):
        found = re.search(pattern, prose)
        assert found is None, f"{where}: {what} outside code: {found.group(0)!r}"


def _without_code(text: str) -> str:
    """``text`` less its fenced blocks (a fence closes only with at least its own length) and code spans."""
    kept, fence = [], ""
    for line in text.splitlines():
        if fence:
            if line.startswith(fence) and not line.strip("`"):
                fence = ""
            continue
        opening = re.match(r"^(`{3,})", line)
        if opening:
            fence = opening.group(1)
            continue
        kept.append(re.sub(r"(?<!\\)`[^`]*`", "", line))
    return "\n".join(kept)


# -- faults, links and victims --------------------------------------------------------------------------

@contextlib.contextmanager
def _gelu_fault() -> Iterator[None]:
    """The CPU kernel of ``aten.gelu.default`` off by 0.5 in this process, for the block only: bisect then finds
    a kernel fault at the gelu node and writes a repro of it."""
    from npu_program.kernels import KERNELS
    from npu_runtime.backends import cpu_kernels

    class OffGelu(cpu_kernels.Reference):
        @staticmethod
        def accepts(*_: Any) -> bool:
            return True

        def run(self, inputs: list[Any], outputs: list[Any]) -> None:
            super().run(inputs, outputs)
            outputs[0].add_(0.5)

    impls = KERNELS["aten.gelu.default"].impls
    saved = impls.get("cpu")
    cpu_kernels.OffGelu = OffGelu
    impls["cpu"] = f"{cpu_kernels.__name__}:OffGelu"
    try:
        yield
    finally:
        if saved is None:
            impls.pop("cpu", None)
        else:
            impls["cpu"] = saved
        del cpu_kernels.OffGelu


def _plant(root: Path, *, repro_link: bool) -> tuple[Path, list[Path]]:
    """An output directory with links planted in it: the report files (or the ``repro`` directory) link to a
    victim file (directory) outside it. Returns the directory and the victims."""
    victim, victim_dir = root / "victim.txt", root / "victim_dir"
    victim.write_text(VICTIM_TEXT)
    victim_dir.mkdir()
    (victim_dir / "README.md").write_text(VICTIM_TEXT)
    out = root / "out"
    out.mkdir()
    if repro_link:
        (out / "repro").symlink_to(victim_dir, target_is_directory=True)
    else:
        for name in PLANTED_FILES:
            (out / name).symlink_to(victim)
    return out, [victim, victim_dir]


def _state(paths: list[Path]) -> dict[str, tuple[int, int, bytes]]:
    """Every file under ``paths``: (size, mtime_ns, first bytes), and each directory's listing."""
    seen: dict[str, tuple[int, int, bytes]] = {}
    for path in paths:
        for p in [path, *(sorted(path.rglob("*")) if path.is_dir() else [])]:
            st = os.lstat(p)
            seen[str(p)] = (st.st_size, st.st_mtime_ns, p.read_bytes()[:256] if p.is_file() else b"")
    return seen


# -- zip archives by hand -------------------------------------------------------------------------------

def npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` header (magic, version 1.0, padded dict) of an array of ``descr`` and ``shape``."""
    import numpy as np

    stream = io.BytesIO()
    np.lib.format.write_array_header_1_0(stream, {"descr": descr, "fortran_order": False, "shape": shape})
    return stream.getvalue()


def deflated_zeros(prefix: bytes, zeros: int) -> tuple[bytes, int]:
    """A raw deflate stream of ``prefix`` then ``zeros`` zero bytes (a multiple of SEGMENT), and its CRC-32. One
    segment of zeros is compressed once and repeated: a full flush makes each segment independent."""
    assert zeros % SEGMENT == 0, zeros
    head = zlib.compressobj(9, zlib.DEFLATED, -15)
    parts = [head.compress(prefix) + head.flush(zlib.Z_FULL_FLUSH)]
    block = bytes(SEGMENT)
    segment_compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    segment = segment_compressor.compress(block) + segment_compressor.flush(zlib.Z_FULL_FLUSH)
    crc = zlib.crc32(prefix)
    for _ in range(zeros // SEGMENT):
        parts.append(segment)
        crc = zlib.crc32(block, crc)
    parts.append(zlib.compressobj(9, zlib.DEFLATED, -15).flush())  # the final (empty) block
    return b"".join(parts), crc


def zip_archive(members: list[tuple[str, bytes, int, int]]) -> bytes:
    """A zip of ``(name, deflated data, declared uncompressed size, crc32)`` members, written by hand so that the
    sizes it declares may differ from what the data decompresses to (zipfile always tells the truth)."""
    body, central = bytearray(), bytearray()
    for name, data, size, crc in members:
        raw = name.encode()
        offset = len(body)
        body += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0x21, crc, len(data), size, len(raw), 0)
        body += raw + data
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 8, 0, 0x21, crc, len(data), size,
                               len(raw), 0, 0, 0, 0, 0, offset) + raw
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(central), len(body), 0)
    return bytes(body + central + end)


# -- the cases ------------------------------------------------------------------------------------------

def _bisect_inputs_cli(file: str) -> list[CliCall]:
    return [CliCall(["bisect", "{dir}/" + BASE_IR, "--weights", "{dir}/" + BASE_WEIGHTS, "--input", "{dir}/" + file])]


def _run_input_cli(file: str) -> list[CliCall]:
    return [CliCall(["run", "{dir}/" + BASE_PROGRAM, "--weights", "{dir}/" + BASE_WEIGHTS, "--input",
                     "x={dir}/" + file])]


def build(b: _Builder) -> None:
    """Add this family's cases to ``b``."""
    _npz_sizes(b)
    _npz_contents(b)
    _npy_inputs(b)
    _bisect_outputs(b)


def _npz_sizes(b: _Builder) -> None:
    """Archives whose sizes are hostile: checked on the zip directory and the .npy header, before decompressing."""
    def case(cid: str, data: bytes, error: str | None, message: str, description: str, **kw: Any) -> None:
        name = f"{cid}.npz"
        b.path(name).write_bytes(data)
        cli = kw.pop("cli", None) or _bisect_inputs_cli(name)
        b.add(Case(cid, "bisect_inputs", description, [name], "outputs.load_arrays", error, message, cli,
                   big_alloc=True, **kw))

    shape = (BOMB_BYTES // 4,)
    header = npy_header("<f4", shape)
    data, crc = deflated_zeros(header, BOMB_BYTES)
    case("out_npz_bomb", zip_archive([("input_0.npy", data, len(header) + BOMB_BYTES, crc)]), "LimitExceededError",
         r"out_npz_bomb\.npz.*declared uncompressed size.*over the",
         f"a {len(data) >> 20} MB npz whose one member decompresses to 2 GiB of zeros (limit 256 MiB)",
         limit_bytes=BOMB_LIMIT)
    lie = header + bytes(432)  # what the directory declares, with its CRC: zipfile reads it without complaint
    case("out_npz_directory_lies", zip_archive([("input_0.npy", data, len(lie), zlib.crc32(lie))]), "ArrayFileError",
         r"header declares float32 data of shape \[536870912\].*archive declares 432 bytes",
         "the zip directory declares 432 bytes, the .npy header 2 GiB, the data decompresses to 2 GiB")
    small = npy_header("<f4", (1, 3, 6, 6))
    data, _ = deflated_zeros(small, 4 * SEGMENT)
    declared = small + bytes(432)
    case("out_npz_longer_than_declared", zip_archive([("input_0.npy", data, len(declared), zlib.crc32(declared))]),
         None, "", "a member that decompresses to 64 MiB more than the 560 bytes it declares: read with that bound",
         cli=[CliCall(["bisect", "{dir}/" + BASE_IR, "--weights", "{dir}/" + BASE_WEIGHTS, "--stage", "extracted",
                       "--input", "{dir}/out_npz_longer_than_declared.npz"], 0)])
    huge_length = b"\x93NUMPY\x02\x00" + struct.pack("<I", 0xFFFFFF00)
    data, crc = deflated_zeros(huge_length, 2 * SEGMENT)
    case("out_npz_huge_header", zip_archive([("input_0.npy", data, len(huge_length) + 2 * SEGMENT, crc)]),
         "ArrayFileError", r"header declares 4294967040 bytes",
         "a version-2 .npy member whose header length is 4 GiB (numpy would read it all before its size check)")


def _npz_contents(b: _Builder) -> None:
    """Archives holding what is not a numeric array, or not an archive at all."""
    import zipfile

    import numpy as np

    def case(cid: str, writer: Callable[[Path], None], message: str, description: str, *,
             error: str = "ArrayFileError", escape: bool = False) -> None:
        name = f"{cid}.npz"
        writer(b.path(name))
        b.add(Case(cid, "bisect_inputs", description, [name], "outputs.load_arrays", error, message,
                   _bisect_inputs_cli(name), escape=escape))

    def savez(**arrays: Any) -> Callable[[Path], None]:
        return lambda path: np.savez(path, **arrays)

    class Evil:
        def __init__(self, marker: str) -> None:
            self.marker = marker

        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {self.marker}",))

    def pickled(path: Path) -> None:
        evil = np.array([Evil(b.marker("out_npz_pickled_object"))], dtype=object)
        with open(path, "wb") as f:
            np.savez(f, input_0=evil)  # savez pickles object arrays; loading them would run os.system

    def truncated(path: Path) -> None:
        buffer = io.BytesIO()
        np.savez_compressed(buffer, input_0=example_input())
        path.write_bytes(buffer.getvalue()[:-40])  # the end of the central directory cut off

    def with_text(path: Path) -> None:
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("input_0.npy", _npy_bytes(example_input()))
            z.writestr("notes.txt", "not an array")

    case("out_npz_string", savez(input_0=np.array(["a", "b"])), r"holds strings, dtype str32 \(<U1\); only numeric",
         "an npz whose array holds strings")
    case("out_npz_bytes", savez(input_0=np.array([b"ab"])), r"holds byte strings, dtype bytes16 \(\|S2\)",
         "an npz of byte strings")
    case("out_npz_void", savez(input_0=np.zeros(4, "V8")), r"holds raw bytes \(void\), dtype void64",
         "an npz of void (V8) items")
    case("out_npz_structured", savez(input_0=np.zeros(2, [("a", "<f4"), ("b", "<i8")])),
         r"holds records \(a structured dtype with fields a, b:", "an npz of a structured (record) array")
    case("out_npz_datetime", savez(input_0=np.array(["2024-01-01"], "datetime64[ns]")), r"holds datetimes",
         "an npz of datetime64 values")
    case("out_npz_timedelta", savez(input_0=np.array([5], "timedelta64[s]")), r"holds timedeltas",
         "an npz of timedelta64 values")
    case("out_npz_pickled_object", pickled, r"holds Python objects", "an npz of a pickled object array whose "
         "loading would run os.system", escape=True)
    case("out_npz_truncated", truncated, r"not a readable \.npz archive.*truncated", "an npz cut short")
    case("out_npz_not_zip", lambda p: p.write_text("input_0 = [1, 2, 3]\n"), r"is not an \.npz archive",
         "a text file named .npz")
    case("out_npz_text_member", with_text, r"member 'notes\.txt' is not a \.npy array",
         "an npz with a text file beside its array")
    b.add(Case("out_npz_npy_given", "bisect_inputs", "a plain .npy (the corpus' valid input) passed as --input",
               [BASE_INPUT], "outputs.load_arrays", "ArrayFileError", r"is a single \.npy array, not an \.npz",
               _bisect_inputs_cli(BASE_INPUT)))


def _npy_bytes(array: Any) -> bytes:
    import numpy as np

    stream = io.BytesIO()
    np.save(stream, array)
    return stream.getvalue()


def _npy_inputs(b: _Builder) -> None:
    """``run --input NAME=FILE.npy`` with arrays that are not numbers, or not one .npy."""
    import numpy as np

    def case(cid: str, data: bytes, message: str, description: str, suffix: str = ".npy") -> None:
        name = f"{cid}{suffix}"
        b.path(name).write_bytes(data)
        b.add(Case(cid, "input_array", description, [name], "outputs.load_array", "ArrayFileError", message,
                   _run_input_cli(name)))

    case("out_npy_string", _npy_bytes(np.full((1, 3, 6, 6), "x")), r"holds strings", "a .npy of strings as --input")
    case("out_npy_structured", _npy_bytes(np.zeros((1, 3, 6, 6), [("re", "<f4"), ("im", "<f4")])),
         r"holds records", "a .npy of records (the input's shape, two float32 fields) as --input")
    case("out_npy_datetime", _npy_bytes(np.zeros((1, 3, 6, 6), "datetime64[s]")), r"holds datetimes",
         "a .npy of datetimes as --input")
    buffer = io.BytesIO()
    np.savez(buffer, x=example_input())
    case("out_npy_npz_given", buffer.getvalue(), r"is an \.npz archive, not a single \.npy array",
         "an .npz passed as a --input .npy", suffix=".npz")
    data = _npy_bytes(example_input())
    case("out_npy_extra_data", data + bytes(1 << 16), r"file holds 65968 bytes of data \(extra bytes after",
         "a .npy with 64 KiB after its array")


def _bisect_outputs(b: _Builder) -> None:
    """``bisect -o DIR`` with links planted in DIR, and node names that are markup."""
    out = b.path("planted_out")
    victim, victim_dir = b.path("planted_victim.txt"), b.path("planted_victim_dir")
    victim.write_text(VICTIM_TEXT)
    victim_dir.mkdir(exist_ok=True)
    (victim_dir / "README.md").write_text(VICTIM_TEXT)
    out.mkdir(exist_ok=True)
    for name in PLANTED_FILES:
        _symlink(out / name, victim)
    out_dir = b.path("planted_repro_out")
    out_dir.mkdir(exist_ok=True)
    _symlink(out_dir / "repro", victim_dir)
    for cid, directory, description in (
            ("out_bisect_planted_files", "planted_out", "bisect -o DIR with report.* and error.png/svg linked to a "
                                                       "victim file"),
            ("out_bisect_planted_repro_dir", "planted_repro_out", "bisect -o DIR with DIR/repro linked to a victim "
                                                                  "directory")):
        b.add(Case(cid, "bisect_outputs", description, [directory], "outputs.bisect_planted", "PlantedOutputError",
                   r"is a symbolic link.*never writes through a link",
                   [CliCall(["bisect", "{dir}/" + BASE_IR, "--weights", "{dir}/" + BASE_WEIGHTS, "-o",
                             "{dir}/" + directory])]))
    doc = json.loads(b.path(BASE_IR).read_text(encoding="utf-8"))
    text = json.dumps(doc).replace('"gelu"', json.dumps(HOSTILE_NAME)).replace('"fc"', json.dumps(HOSTILE_MODULE))
    assert HOSTILE_NAME[:8] in text, "the base IR has no node named gelu"
    b.write_json_text("out_bisect_names.json", text)
    b.add(Case("out_bisect_names", "bisect_outputs", "bisect of an IR whose faulty node is named <script>, with a "
               "newline, backticks, a fence and $ math", ["out_bisect_names.json"],
               "outputs.bisect_names", None, "",
               [CliCall(["bisect", "{dir}/out_bisect_names.json", "--weights", "{dir}/" + BASE_WEIGHTS], 0)]))


def _symlink(link: Path, target: Path) -> None:
    if link.is_symlink():
        link.unlink()
    link.symlink_to(target, target_is_directory=target.is_dir())
