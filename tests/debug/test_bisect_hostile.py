"""bisect's outputs against a hostile output directory and hostile names.

- Links planted in ``bisect -o DIR`` (a report file linked to a victim file, ``DIR/repro`` linked to a victim
  directory, a file inside ``DIR/repro``) are refused before anything runs, and again right before each write
  (a link planted while bisect runs); the victims are never touched and nothing is half-written.
- Node and module names read from an IR (``<script>``, a newline, backticks, a code fence, pipes, ``$`` math)
  reach report.md, report.html, the plot and the repro's README as inert text, and a newline in the faulty
  node's name no longer aborts bisect before its report.
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from torch import nn

import torch_ir
from npu_runtime.backends import cpu_kernels
from npu_tools.cli import main
from npu_tools.debug import bisect as bisect_module
from npu_tools.debug import repro as repro_module
from npu_tools.debug.bisect import bisect
from npu_tools.debug.drift import NodeError, Verdict, _svg, plot
from npu_tools.debug.outdir import PlantedOutputError
from npu_tools.debug.report import code_span, fenced
from torch_ir.fileio import atomic_write
from torch_ir.weights import module_state

from .test_bisect_faults import install_cpu_kernel

HOSTILE = "<script>alert(1)</script>\n# owned | `x` ```\n$\\frac{$"
HOSTILE_MODULE = "conv<img src=x onerror=alert(1)>\n## heading"
VICTIM = "a file bisect must never write through a planted link\n"


class Tiny(nn.Module):
    """conv -> relu -> mean -> gelu -> linear: the gelu stays a node of its own through every stage."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(nn.functional.gelu(torch.relu(self.conv(x)).mean((2, 3))))


class OffGelu(cpu_kernels.Reference):
    """The CPU gelu, off by 0.5: bisect finds a kernel fault at the gelu node and writes its repro."""

    @staticmethod
    def accepts(*_: object) -> bool:
        return True

    def run(self, inputs, outputs):
        super().run(inputs, outputs)
        outputs[0].add_(0.5)


@pytest.fixture(scope="module")
def model_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The IR (plain, and with the gelu node and the conv module renamed to markup) and its weights."""
    directory = tmp_path_factory.mktemp("bisect_hostile")
    with torch.device("meta"):
        meta = Tiny().eval()
    ir = torch_ir.extract_ir(meta, (torch.randn(1, 3, 6, 6, device="meta"),), model_name="tiny")
    ir.save(directory / "tiny.json")
    torch.manual_seed(0)
    torch_ir.save_weights(module_state(Tiny().eval()), directory / "tiny.safetensors")
    text = (directory / "tiny.json").read_text()
    assert '"gelu"' in text and '"conv"' in text
    hostile = text.replace('"gelu"', json.dumps(HOSTILE)).replace('"conv"', json.dumps(HOSTILE_MODULE))
    (directory / "hostile.json").write_text(hostile)
    return {"ir": directory / "tiny.json", "hostile": directory / "hostile.json",
            "weights": directory / "tiny.safetensors"}


@pytest.fixture
def gelu_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    install_cpu_kernel(monkeypatch, "aten.gelu.default", OffGelu)


def run_bisect(files: dict[str, Path], out: Path | None, ir: str = "ir"):
    return bisect(str(files[ir]), weights=str(files["weights"]), out_dir=out, progress=False)


# -- planted links ---------------------------------------------------------------------------------------

def plant(tmp_path: Path, entry: str) -> tuple[Path, list[Path]]:
    """An output directory with ``entry`` linked to a victim outside it (a directory for ``repro``)."""
    victim, victim_dir = tmp_path / "victim.txt", tmp_path / "victim_dir"
    victim.write_text(VICTIM)
    victim_dir.mkdir()
    (victim_dir / "README.md").write_text(VICTIM)
    out = tmp_path / "out"
    link = out / entry
    link.parent.mkdir(parents=True)
    if entry == "repro":
        link.symlink_to(victim_dir, target_is_directory=True)
    else:
        link.symlink_to(victim)
    return out, [victim, victim_dir, victim_dir / "README.md"]


def state(paths: list[Path]) -> dict[str, object]:
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else sorted(os.listdir(p))
            for p in paths}


def tree(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


ENTRIES = ["report.json", "report.md", "report.html", "error.png", "error.svg", "repro", "repro/README.md",
           "repro/inputs.npz", "repro/weights.safetensors"]


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_planted_link_is_refused_before_anything_runs(model_files, gelu_fault, tmp_path: Path,
                                                        entry: str) -> None:
    out, victims = plant(tmp_path, entry)
    before, listing = state(victims), tree(out)
    with pytest.raises(PlantedOutputError, match=rf"{re.escape(str(out / entry))}': it is a symbolic link \(to "
                                                 r"'.*victim.*'\); bisect never writes through a link"):
        run_bisect(model_files, out)
    assert state(victims) == before and tree(out) == listing  # the victims untouched, nothing written


@pytest.mark.parametrize("entry", ["report.html", "error.png", "repro", "repro/README.md", "repro/expected.npz"])
def test_a_link_planted_during_the_run_is_refused_at_the_write(model_files, gelu_fault, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch, entry: str) -> None:
    """The up-front check skipped (as if the link appeared after it): each write checks again, with lstat."""
    out, victims = plant(tmp_path, entry)
    before = state(victims)
    monkeypatch.setattr(bisect_module, "check_output_dir", lambda *a, **k: None)
    with pytest.raises(PlantedOutputError, match=r"is a symbolic link"):
        run_bisect(model_files, out)
    assert state(victims) == before
    assert not (out / "report.json").exists()  # the report is written last, after every check


def test_a_repro_directory_swapped_for_a_link_mid_write_is_refused(model_files, gelu_fault, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first repro file is written, DIR/repro is renamed away and a link to a victim directory put in
    its place: the next write notices that the directory is not the one it checked, and stops."""
    out, victims = plant(tmp_path, "unrelated.txt")
    before = state(victims)
    written = []

    def swap_after_first(path, data, **kw):
        atomic_write(path, data, **kw)
        written.append(Path(path).name)
        if len(written) == 1:
            repro = Path(path).parent
            repro.rename(tmp_path / "moved")
            repro.symlink_to(tmp_path / "victim_dir", target_is_directory=True)

    monkeypatch.setattr(repro_module, "atomic_write", swap_after_first)
    with pytest.raises(PlantedOutputError, match=r"repro': it was replaced \(by a link to another directory"):
        run_bisect(model_files, out)
    assert written == ["inputs.npz"] and state(victims) == before


def test_special_files_and_wrong_kinds_are_refused(model_files, tmp_path: Path) -> None:
    cases = {"report.md": ("fifo", r"is a named pipe \(FIFO\), where bisect writes a file"),
             "report.json": ("dir", r"is a directory, where bisect writes a file"),
             "repro": ("file", r"is a file, where bisect writes a directory")}
    for i, (entry, (kind, message)) in enumerate(cases.items()):
        out = tmp_path / str(i)
        out.mkdir()
        {"fifo": os.mkfifo, "dir": os.mkdir, "file": lambda p: Path(p).write_text("x")}[kind](out / entry)
        with pytest.raises(PlantedOutputError, match=message):
            run_bisect(model_files, out)


def test_the_output_directory_itself_may_be_a_link_the_user_made(model_files, gelu_fault, tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "out").symlink_to(real, target_is_directory=True)
    report = run_bisect(model_files, tmp_path / "out")
    assert report.repro is not None and (real / "report.html").is_file() and (real / "repro" / "repro.py").is_file()
    # and a second run over the same directory replaces its files
    assert run_bisect(model_files, tmp_path / "out").repro is not None


def test_the_cli_refuses_a_planted_link_in_one_line(model_files, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out, victims = plant(tmp_path, "repro")
    before = state(victims)
    code = main(["bisect", str(model_files["ir"]), "--weights", str(model_files["weights"]), "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("torch-ir bisect: error: cannot write"), err
    assert "is a symbolic link" in err and state(victims) == before


def test_plot_replaces_a_link_and_never_writes_through_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM)
    (tmp_path / "error.png").symlink_to(victim)
    written = plot(_verdict(["layers.0", "layers.1"]), tmp_path / "error.png")
    assert victim.read_text() == VICTIM and not written.is_symlink() and written.read_bytes()[:4] == b"\x89PNG"


# -- hostile names -----------------------------------------------------------------------------------------

def _verdict(layers: list[str], node: str = "n") -> Verdict:
    jump = NodeError(1, node, "GEMM", layers[-1], 1.0, 1e-8, False, node)
    return Verdict("fault", "t", jump=jump, layers=[(name, 10.0 ** -i) for i, name in enumerate(layers)])


def test_plot_shows_names_as_text_and_stays_small(tmp_path: Path) -> None:
    """matplotlib parses ``$...$`` as math (a name like ``$\\frac{$`` made savefig raise), and the figure grew with
    the layers past the 2^16 pixels matplotlib can draw."""
    names = ["$\\frac{$", "a\nb $x^$", "layers.2"]
    png = plot(_verdict(names, node="$\\sqrt{$"), tmp_path / "error.png", title="$\\left($ title")
    assert png.read_bytes()[:4] == b"\x89PNG"
    many = plot(_verdict([f"layers.{i}" for i in range(20_000)]), tmp_path / "many.png")
    assert many.stat().st_size < 4 << 20


def test_svg_escapes_names() -> None:
    svg = _svg(_verdict(["<script>alert(1)</script>", "a\"b'c&d"]), "<b>title</b>\nx", 1e-3)
    root = ET.fromstring(svg)  # well-formed XML
    assert not [e for e in root.iter() if e.tag.endswith(("script", "b"))]
    assert "&lt;script&gt;" in svg


def test_hostile_names_reach_every_report_inert(model_files, gelu_fault, tmp_path: Path) -> None:
    out = tmp_path / "out"
    report = run_bisect(model_files, out, ir="hostile")
    assert report.finding.kind == "kernel" and report.finding.node == HOSTILE  # the data keeps the exact name
    assert "\n" not in report.finding.title and report.repro is not None
    readme = (report.repro / "README.md").read_text()
    for name, text in (("README.md", readme), ("report.md", (out / "report.md").read_text())):
        assert_inert_markdown(text, name)
    assert readme.startswith("# kernel aten.gelu.default on cpu") and readme.count("\n# ") == 0
    fence = re.search(r"^(`{3,})$", readme, re.M).group(1)
    assert len(fence) == 4 and readme.count(f"\n{fence}\n") == 2  # longer than the name's ```: it cannot close early
    page = (out / "report.html").read_text()
    assert "<script" not in page and "<img src=x" not in page and "&lt;script&gt;" in page
    case = json.loads((report.repro / "case.json").read_text())
    assert "\n" not in case["title"] and case["outputs"][0]["name"] == HOSTILE


def test_a_newline_in_the_faulty_nodes_name_keeps_the_cli_going(model_files, gelu_fault, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(["bisect", str(model_files["hostile"]), "--weights", str(model_files["weights"]), "-o", str(out)])
    captured = capsys.readouterr()
    assert code == 1, captured.err[-2000:]
    assert {"report.md", "report.html", "report.json", "repro"} <= set(os.listdir(out))


def assert_inert_markdown(text: str, where: str) -> None:
    """Outside code spans and fences: no unescaped HTML tag, no heading a name started, table rows intact."""
    prose = _without_code(text)
    tag = re.search(r"(?<!\\)<(script|img)\b", prose)
    assert tag is None, f"{where}: live HTML outside code: {tag.group(0)!r}"
    heading = re.search(r"(?m)^#+ (owned|heading)", prose)
    assert heading is None, f"{where}: a name started a heading: {heading.group(0)!r}"
    for line in text.splitlines():
        if line.startswith("| ") and "tensor" not in line:
            assert re.search(r"(?<!\\)\|.*(?<!\\)\|", line), line


def _without_code(text: str) -> str:
    kept, fence = [], ""
    for line in text.splitlines():
        if fence:
            fence = "" if line.startswith(fence) and not line.strip("`") else fence
            continue
        opening = re.match(r"^(`{3,})", line)
        if opening:
            fence = opening.group(1)
            continue
        kept.append(re.sub(r"(?<!\\)`[^`]*`", "", line))
    return "\n".join(kept)


def test_code_span_and_fence_helpers() -> None:
    assert code_span("a`b\nc") == "`a'b c`"
    assert fenced(["x ```` y", "z\nw"]) == ["`````", "x ```` y", "z w", "`````"]
    assert fenced(["plain"]) == ["```", "plain", "```"]
