"""Every writer goes through torch_ir.fileio.atomic_write: concurrent writers, file modes, clear errors.

Real files, real torch and safetensors; the only thing patched is ``os.fsync`` (to simulate a full disk).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

import npu_compiler
import torch_ir
from npu_program.npubin import read_npubin, write_npubin
from npu_tools.cli import main
from torch_ir.errors import OutputWriteError, TorchIRError
from torch_ir.fileio import atomic_write, check_output_path
from torch_ir.ir import load_ir, save_ir
from torch_ir.weights import load_state_dict, module_state, save_weights

ROOT = Path(__file__).resolve().parents[1]


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.fc(x))


def tiny_factory():
    """A ``package.module:factory`` for the CLI tests."""
    return Tiny(), (torch.randn(2, 4),)


@pytest.fixture(scope="module")
def tiny():
    with torch.device("meta"):
        meta = Tiny().eval()
    ir = torch_ir.extract_ir(meta, (torch.randn(2, 4, device="meta"),), model_name="Tiny")
    torch.manual_seed(0)
    return ir, module_state(Tiny().eval()), npu_compiler.compile(ir, target="cpu")


def _writers(tiny):
    """(name, write(path)) for the IR, weights and program writers."""
    ir, state, program = tiny
    return [("IR", lambda p: save_ir(ir, p)), ("weights", lambda p: save_weights(state, p)),
            ("program", lambda p: write_npubin(program, p))]


def _leftovers(directory: Path, keep: set[str]) -> list[str]:
    return sorted(set(os.listdir(directory)) - keep)


# ------------------------------------------------------------------------------------------ concurrency

_WORKER = textwrap.dedent("""
    import sys
    from torch_ir.ir import load_ir, save_ir
    from torch_ir.weights import load_state_dict, save_weights
    ir_src, w_src, ir_dst, w_dst, n = sys.argv[1:6]
    ir, state = load_ir(ir_src), load_state_dict(w_src)
    for _ in range(int(n)):
        save_ir(ir, ir_dst)
        save_weights(state, w_dst)
""")


@pytest.mark.slow
def test_concurrent_writers_to_one_path_all_succeed(tiny, tmp_path):
    ir, state, _ = tiny
    src = tmp_path / "src"
    src.mkdir()
    save_ir(ir, src / "ir.json")
    save_weights(state, src / "w.safetensors")
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(src / "ir.json"), str(src / "w.safetensors"),
                               str(out / "ir.json"), str(out / "w.safetensors"), "6"],
                              env=env, stderr=subprocess.PIPE, text=True) for _ in range(5)]  # 5 x 6 = 30 each
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    assert sorted(os.listdir(out)) == ["ir.json", "w.safetensors"]  # no temp file left by anyone
    assert load_ir(out / "ir.json").nodes == ir.nodes
    loaded = load_state_dict(out / "w.safetensors")
    assert set(loaded) == set(state) and all(torch.equal(loaded[k], state[k]) for k in state)


def test_temp_names_are_random(tmp_path):
    names = set()

    def spy(handle):
        names.add(os.path.basename(handle.name))
        handle.write(b"x")

    for _ in range(5):
        atomic_write(tmp_path / "f.bin", spy)
    assert len(names) == 5 and all(n.startswith(".f.bin.") and n.endswith(".tmp") for n in names)
    assert os.listdir(tmp_path) == ["f.bin"]


# ------------------------------------------------------------------------------------------ modes


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_new_files_get_the_mode_open_would_give(tiny, tmp_path, mask):
    old = os.umask(mask)
    try:
        modes = {}
        for name, write in _writers(tiny):
            write(tmp_path / name)
            modes[name] = stat.S_IMODE(os.stat(tmp_path / name).st_mode)
        with open(tmp_path / "plain", "w"):
            pass
    finally:
        os.umask(old)
    expected = stat.S_IMODE(os.stat(tmp_path / "plain").st_mode)
    assert expected == 0o666 & ~mask
    assert modes == {"IR": expected, "weights": expected, "program": expected}


def test_overwriting_keeps_the_existing_mode(tiny, tmp_path):
    for name, write in _writers(tiny):
        path = tmp_path / name
        path.write_text("old")
        os.chmod(path, 0o600)
        write(path)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, name
        assert path.read_bytes() != b"old"
    assert read_npubin(tmp_path / "program").model_name == "Tiny"
    assert load_ir(tmp_path / "IR").model_name == "Tiny"


def test_a_symlink_is_replaced_not_followed(tiny, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text("someone else's file")
    link = tmp_path / "ir.json"
    link.symlink_to(other)
    save_ir(tiny[0], link)
    assert other.read_text() == "someone else's file"
    assert not link.is_symlink() and load_ir(link).model_name == "Tiny"


def test_a_fifo_is_written_into_not_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    atomic_write(fifo, b"hello")
    reader.join(timeout=10)
    assert got == [b"hello"] and stat.S_ISFIFO(os.stat(fifo).st_mode)


# ------------------------------------------------------------------------------------------ errors


def _check_refused(write, target: Path, match: str) -> None:
    directory = target.parent if target.parent.is_dir() else None
    before = set(os.listdir(directory)) if directory else set()
    with pytest.raises(OutputWriteError, match=match) as info:
        write(target)
    message = str(info.value)
    assert repr(str(target)) in message and ".tmp" not in message and "\n" not in message
    if directory:
        assert set(os.listdir(directory)) == before  # no temp file, nothing new


@pytest.mark.parametrize("which", ["IR", "weights", "program"])
def test_missing_directory(tiny, tmp_path, which):
    write = dict(_writers(tiny))[which]
    target = tmp_path / "no" / "such" / "out.bin"
    _check_refused(write, target, r"directory .* does not exist; create it first \(mkdir -p")
    assert not (tmp_path / "no").exists()
    with pytest.raises(FileNotFoundError):  # still a FileNotFoundError for callers that catch that
        write(target)


@pytest.mark.parametrize("which", ["IR", "weights", "program"])
def test_path_is_a_directory(tiny, tmp_path, which):
    write = dict(_writers(tiny))[which]
    (tmp_path / "d").mkdir()
    _check_refused(write, tmp_path / "d", "the path is a directory; give a file name")
    assert os.listdir(tmp_path / "d") == []


@pytest.mark.parametrize("which", ["IR", "weights", "program"])
def test_name_too_long(tiny, tmp_path, which):
    write = dict(_writers(tiny))[which]
    _check_refused(write, tmp_path / ("x" * 300), r"file name is too long \(300 bytes")


def test_long_but_valid_name_is_written(tiny, tmp_path):
    path = tmp_path / ("y" * 250)  # the temp file's name must still fit the 255-byte limit
    save_ir(tiny[0], path)
    assert load_ir(path).model_name == "Tiny" and os.listdir(tmp_path) == [path.name]


def test_full_disk_during_write(tiny, tmp_path, monkeypatch):
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"old")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    _check_refused(lambda p: save_weights(tiny[1], p), path, "no space left on the device")
    assert path.read_bytes() == b"old"


def test_unwritable_directory(tiny, tmp_path):
    """A read-only directory (mode 0o500; as root, where modes do not stop writes, an immutable one)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    save_ir(tiny[0], locked / "IR")  # overwriting an existing file is refused too
    if os.geteuid() == 0:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(locked)]).returncode != 0:
            pytest.skip("running as root and the file system has no immutable attribute (chattr +i)")
        unlock = ["chattr", "-i", str(locked)]
    else:
        os.chmod(locked, 0o500)
        unlock = None
    try:
        for name, write in _writers(tiny):
            _check_refused(write, locked / name, "permission denied: directory .* is not writable")
            _check_refused(write, locked / "new", "permission denied")
    finally:
        subprocess.run(unlock, check=True) if unlock else os.chmod(locked, 0o700)
    assert os.listdir(locked) == ["IR"]


def test_a_failing_serializer_leaves_nothing(tmp_path):
    def broken(handle):
        handle.write(b"partial")
        raise ValueError("cannot encode")

    with pytest.raises(ValueError, match="cannot encode"):
        atomic_write(tmp_path / "f", broken)
    assert os.listdir(tmp_path) == []


def test_check_output_path_is_the_same_check(tmp_path):
    check_output_path(tmp_path / "fine.json")
    with pytest.raises(OutputWriteError, match="does not exist"):
        check_output_path(tmp_path / "missing" / "x.json", "IR file")
    assert issubclass(OutputWriteError, TorchIRError)


# ------------------------------------------------------------------------------------------ commands

SPEC = "tests.test_writers:tiny_factory"


def test_extract_checks_every_output_before_writing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["extract", SPEC, "-o", "out.json", "--save-weights", "missing_dir/w.safetensors"])
    err = capsys.readouterr().err
    assert code == 2 and "missing_dir/w.safetensors" in err and "does not exist" in err
    assert len(err.strip().splitlines()) == 1
    assert os.listdir(tmp_path) == []  # no IR left behind
    assert main(["extract", SPEC, "-o", "out.json", "--save-weights", "w.safetensors"]) == 0
    assert sorted(os.listdir(tmp_path)) == ["out.json", "w.safetensors"]


def test_normalize_checks_the_report_path_first(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["normalize", SPEC, "-o", "n.json", "--markdown", "nodir/r.md"])
    assert code == 2 and "nodir/r.md" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_report_writers_are_atomic_and_checked(tiny, tmp_path, capsys):
    save_ir(tiny[0], tmp_path / "ir.json")
    assert main(["inspect", str(tmp_path / "ir.json"), "--markdown", str(tmp_path / "r.md")]) == 0
    assert (tmp_path / "r.md").read_text().startswith("#")
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "ir.json"), "--markdown", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert main(["partition", str(tmp_path / "ir.json"), "--json", str(tmp_path / "x" / "p.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["ir.json", "r.md"]
