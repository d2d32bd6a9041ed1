"""The real Model Explorer server (its Python API, in a subprocess) on ``torch-ir view``'s files for BERT, driven in
headless Chromium over the Chrome DevTools Protocol (``tests/view/chromium.py``): the graph renders, its layers fold
and unfold, an overlay colours nodes, no console error, no dialog from a hostile node name, and the 80-layer
70B-shaped model shows folded in seconds. Screenshots of each step are kept under ``test-artifacts/view/``.

Model Explorer draws the graph with WebGL, so nodes are not DOM elements: what is drawn is checked on screenshots
(the pixels of the placement overlay's colour), what is folded on the UI state the app keeps in its URL
(``deepestExpandedGroupNodeIds``), what loaded on its side panel.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from npu_tools.view.explorer import PALETTE, write_explorer

from .chromium import SKIP_REASON, Browser, Page, find_chromium
from .conftest import ARTIFACTS

CHROMIUM = find_chromium()
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON),
    pytest.mark.skipif(importlib.util.find_spec("model_explorer") is None,
                       reason="Model Explorer is not installed (pip install 'torch-ir[view]')"),
]
HOSTILE = "<script>alert(1)</script>"
NPU_COLOUR = tuple(int(PALETTE[0][i:i + 2], 16) for i in (1, 3, 5))  # the first text value's colour: "NPU"
TIMEOUT = 40.0
SHOTS = ARTIFACTS / "explorer"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def explorer_files(tmp_path_factory):
    from npu_compiler.costmodel import cost_program, load_hardware
    from npu_tools.view.overlay_sources import cost_overlays, placement_overlay
    from npu_tools.view.stages import pipeline_graphs
    from npu_tools.zoo.runner import resolve_spec

    spec = resolve_spec("bert")
    graphs, program = pipeline_graphs(spec.extract(spec.build("meta")))
    # a label a model file could carry, on a node at the top (drawn folded, and listed in the side panel's table)
    next(n for n in graphs[0].nodes if not n.namespace).op = HOSTILE
    overlays = [*cost_overlays(cost_program(program, load_hardware("edge_4tops")), graphs),
                placement_overlay(program, graphs)]
    out = tmp_path_factory.mktemp("explorer")
    write_explorer(graphs, out, overlays, label="bert")
    return out


@contextmanager
def explorer_page(files: Path):
    """Model Explorer's server on ``files`` and a headless Chromium page on it, its graph shown; both stopped
    after. The page's ``load_seconds``: from navigation to the graph's side panel."""
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    server = subprocess.Popen([sys.executable, "-c", "import sys; from npu_tools.view.explorer import serve; "
                               "serve(sys.argv[1], port=int(sys.argv[2]), open_browser=False)",
                               str(files), str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=env)
    try:
        url = _server_url(server)
        with Browser(CHROMIUM, timeout=TIMEOUT) as browser:
            started = time.perf_counter()
            page = browser.open(url)
            _wait_for(page, "(document.body?.innerText ?? '').includes('op node count')", "show the graph")
            page.load_seconds = time.perf_counter() - started
            page.server = f"http://localhost:{port}"
            yield page
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture(scope="module")
def page(explorer_files):
    SHOTS.mkdir(parents=True, exist_ok=True)
    with explorer_page(explorer_files) as tools:
        time.sleep(1.5)  # the first layout and the node data's colours are drawn after the side panel
        yield tools


def _wait_for(page: Page, expression: str, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not page.evaluate(expression):
        assert time.monotonic() < deadline, f"Model Explorer did not {what} within {TIMEOUT:.0f} s"
        time.sleep(0.2)


def _screenshot(page: Page, name: str):
    from PIL import Image

    return Image.open(page.screenshot(SHOTS / name)).convert("RGB")


def _server_url(server: subprocess.Popen) -> str:
    deadline = time.monotonic() + TIMEOUT
    lines = []
    while time.monotonic() < deadline:
        line = server.stdout.readline()
        if not line and server.poll() is not None:
            break
        lines.append(line)
        if line.startswith("http://"):
            return line.strip()
    pytest.fail("Model Explorer's server did not start:\n" + "".join(lines))


def _expanded_groups(tools: Page) -> list[str]:
    query = urllib.parse.urlparse(tools.evaluate("location.href")).query
    state = json.loads(urllib.parse.parse_qs(query)["data"][0])["uiState"]
    return state["paneStates"][0]["deepestExpandedGroupNodeIds"]


def _click_icon(tools: Page, icon: str) -> None:
    """Click the toolbar button of the Material icon named ``icon``."""
    clicked = tools.evaluate(f"""(() => {{
        const icon = [...document.querySelectorAll('mat-icon')].find(e => e.textContent.trim() === {json.dumps(icon)});
        if (!icon) return false;
        (icon.closest('button, [role=button], .icon-container') || icon.parentElement).click();
        return true; }})()""")
    assert clicked, f"no {icon!r} button in Model Explorer's page"
    time.sleep(1.5)


def _show_overlay(tools: Page, name: str) -> None:
    """Click the eye of the node data provider ``name`` in the side panel (the first list of eyes)."""
    clicked = tools.evaluate(f"""(() => {{
        const eye = [...document.querySelectorAll('.icon-container.visibility')]
            .find(e => e.parentElement.textContent.includes({json.dumps(name)}));
        if (!eye) return false;
        eye.click();
        return true; }})()""")
    assert clicked, f"no node data provider {name!r} in Model Explorer's side panel"
    time.sleep(1.5)


def _graph_pixels(image, colour: tuple[int, int, int]) -> int:
    """Pixels of ``colour`` in the graph area (left of the side panel)."""
    graph = np.asarray(image.crop((0, 100, int(image.width * 0.7), image.height)), dtype=np.int16)
    return int((np.abs(graph - np.array(colour, dtype=np.int16)) <= 4).all(axis=-1).sum())


def test_the_graph_renders_with_every_stage_and_its_layers(page):
    text = page.evaluate("document.body.innerText")
    assert "extracted" in text and "94 nodes" in text  # the graph selector and its first graph, the extracted IR
    assert "encoder" in text and "embeddings" in text  # the root-level layers in the stats table
    assert HOSTILE in text  # the hostile label shown as text in the table
    assert not page.evaluate("[...document.scripts].some(s => s.textContent.includes('alert(1)'))")
    image = _screenshot(page, "rendered.png")
    drawn = np.asarray(image.crop((0, 100, int(image.width * 0.7), image.height)).convert("L"))
    assert (drawn < 200).sum() > 2000, f"nothing drawn: see {SHOTS / 'rendered.png'}"


def test_layers_fold_and_unfold(page):
    assert _expanded_groups(page) == []
    _click_icon(page, "unfold_more_double")  # "expand all layers"
    _screenshot(page, "unfolded.png")
    expanded = _expanded_groups(page)
    assert "encoder/layer.0/attention/self___group___" in expanded and "pooler___group___" in expanded
    _click_icon(page, "unfold_less_double")  # "collapse all layers"
    _screenshot(page, "folded.png")
    assert _expanded_groups(page) == []


def test_an_overlay_colours_nodes(page):
    text = page.evaluate("document.body.innerText")
    for name in ("cycles", "DRAM bytes", "bound", "placement"):
        assert name in text
    coloured = _graph_pixels(_screenshot(page, "placement.png"), NPU_COLOUR)
    assert coloured > 500, f"no node in the placement overlay's NPU colour: see {SHOTS / 'placement.png'}"
    _show_overlay(page, "cycles")  # colour by the cost model's cycles instead
    other = _graph_pixels(_screenshot(page, "cycles.png"), NPU_COLOUR)
    assert other < coloured / 4, (coloured, other)
    _show_overlay(page, "placement")
    assert _graph_pixels(_screenshot(page, "placement-again.png"), NPU_COLOUR) == coloured


def test_no_console_error_and_no_dialog(page):
    page.evaluate("1")
    # the sandbox has no network: Model Explorer's web fonts (fonts.gstatic.com) fail to load; nothing else may fail
    foreign = [e["params"]["entry"] for e in page.events if e.get("method") == "Log.entryAdded"
               and e["params"]["entry"].get("source") == "network"
               and not e["params"]["entry"].get("url", "").startswith(page.server)]
    assert all("fonts.gstatic.com" in entry.get("url", "") for entry in foreign), foreign
    assert len(page.errors()) == len(foreign), page.errors()
    assert page.dialogs() == []
    assert {urllib.parse.urlparse(u).hostname for u in page.requests()} <= {"localhost", "fonts.gstatic.com",
                                                                              "fonts.googleapis.com"}


def test_the_70b_shaped_model_shows_folded_in_seconds(llama70b_run, tmp_path):
    SHOTS.mkdir(parents=True, exist_ok=True)
    write_explorer(llama70b_run.graphs, tmp_path, llama70b_run.overlays, label="llama3-70b")
    with explorer_page(tmp_path) as tools:
        text = tools.evaluate("document.body.innerText")
        _screenshot(tools, "llama3-70b.png")
        expanded = _expanded_groups(tools)
    assert "llama3-70b" in text and "op node count" in text
    assert expanded == []  # shown folded: the model's group at the root, not its thousands of ops
    # 2-3 s on a 2-core machine in software WebGL; the bound leaves room for a loaded one
    assert tools.load_seconds < 20, f"the 80-layer graph took {tools.load_seconds:.1f} s to show"
