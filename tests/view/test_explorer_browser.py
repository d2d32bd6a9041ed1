"""The real Model Explorer server (its Python API, in a subprocess) on ``torch-ir view``'s files for BERT, driven in
headless Chromium over the Chrome DevTools Protocol: the graph renders, its layers fold and unfold, an overlay
colours nodes, no console error, no dialog from a hostile node name. Screenshots of each step are kept in the
test's tmp directory (printed on failure).

Model Explorer draws the graph with WebGL, so nodes are not DOM elements: what is drawn is checked on screenshots
(the pixels of the placement overlay's colour), what is folded on the UI state the app keeps in its URL
(``deepestExpandedGroupNodeIds``), what loaded on its side panel.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from npu_tools.view.explorer import PALETTE, write_explorer

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium)"),
    pytest.mark.skipif(not __import__("importlib.util").util.find_spec("model_explorer"),
                       reason="Model Explorer is not installed (pip install 'torch-ir[view]')"),
]
HOSTILE = "<script>alert(1)</script>"
NPU_COLOUR = tuple(int(PALETTE[0][i:i + 2], 16) for i in (1, 3, 5))  # the first text value's colour: "NPU"
TIMEOUT = 40.0


class DevTools:
    """The few Chrome DevTools Protocol calls the test needs, over a plain WebSocket (RFC 6455, client side)."""

    def __init__(self, ws_url: str) -> None:
        netloc, path = ws_url.removeprefix("ws://").split("/", 1)
        host, port = netloc.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=TIMEOUT)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(f"GET /{path} HTTP/1.1\r\nHost: {netloc}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += self._exactly(1)
        assert head.startswith(b"HTTP/1.1 101"), head
        self.events: list[dict] = []
        self.last_id = 0
        self.load_seconds = 0.0

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("DevTools closed the connection")
            data += chunk
        return data

    def _send(self, text: str) -> None:
        payload, mask = text.encode(), os.urandom(4)
        n = len(payload)
        size = bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n) if n < 2**16 else \
            bytes([0x80 | 127]) + struct.pack(">Q", n)
        self.sock.sendall(b"\x81" + size + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def _receive(self) -> dict:
        message = b""
        while True:
            first, second = self._exactly(2)
            n = second & 0x7F
            n = struct.unpack(">H", self._exactly(2))[0] if n == 126 else \
                struct.unpack(">Q", self._exactly(8))[0] if n == 127 else n
            message += self._exactly(n)
            if first & 0x80:  # the final fragment
                return json.loads(message)

    def call(self, method: str, **params) -> dict:
        self.last_id += 1
        self._send(json.dumps({"id": self.last_id, "method": method, "params": params}))
        while True:
            message = self._receive()
            if message.get("id") == self.last_id:
                assert "error" not in message, f"{method}: {message['error']}"
                return message.get("result", {})
            self.events.append(message)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def wait_for(self, expression: str, what: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not self.evaluate(expression):
            assert time.monotonic() < deadline, f"Model Explorer did not {what} within {TIMEOUT:.0f} s"
            time.sleep(0.2)

    def screenshot(self, path: Path):
        from PIL import Image

        png = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        path.write_bytes(png)
        return Image.open(io.BytesIO(png)).convert("RGB")


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
def explorer_page(files: Path, profile: Path):
    """Model Explorer's server on ``files`` and a headless Chromium page on it, loaded; both stopped after."""
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    server = subprocess.Popen([sys.executable, "-c", "import sys; from npu_tools.view.explorer import serve; "
                               "serve(sys.argv[1], port=int(sys.argv[2]), open_browser=False)",
                               str(files), str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=env)
    browser = None
    try:
        url = _server_url(server)
        debug_port = _free_port()
        browser = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--use-angle=swiftshader",
                                    "--enable-unsafe-swiftshader", f"--remote-debugging-port={debug_port}",
                                    f"--user-data-dir={profile}", "--window-size=1400,900", "about:blank"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        tools = DevTools(_page_socket(debug_port))
        for domain in ("Runtime", "Log", "Page"):
            tools.call(f"{domain}.enable")
        started = time.perf_counter()
        tools.call("Page.navigate", url=url)
        tools.wait_for("(document.body?.innerText ?? '').includes('op node count')", "show the graph")
        tools.load_seconds = time.perf_counter() - started
        yield tools
    finally:
        for process in (browser, server):
            if process is not None:
                process.terminate()
                process.wait(timeout=10)


@pytest.fixture(scope="module")
def page(explorer_files, tmp_path_factory):
    with explorer_page(explorer_files, tmp_path_factory.mktemp("chromium")) as tools:
        time.sleep(1.5)  # the first layout and the node data's colours are drawn after the side panel
        yield tools


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


def _page_socket(port: int) -> str:
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json") as r:
                return next(t for t in json.load(r) if t["type"] == "page")["webSocketDebuggerUrl"]
        except (OSError, StopIteration):
            assert time.monotonic() < deadline, "headless Chromium did not start"
            time.sleep(0.2)


def _expanded_groups(tools: DevTools) -> list[str]:
    query = urllib.parse.urlparse(tools.evaluate("location.href")).query
    state = json.loads(urllib.parse.parse_qs(query)["data"][0])["uiState"]
    return state["paneStates"][0]["deepestExpandedGroupNodeIds"]


def _click_icon(tools: DevTools, icon: str) -> None:
    clicked = tools.evaluate(f"""(() => {{
        const icon = [...document.querySelectorAll('mat-icon')].find(e => e.textContent.trim() === {json.dumps(icon)});
        if (!icon) return false;
        (icon.closest('button, [role=button], .icon-container') || icon.parentElement).click();
        return true; }})()""")
    assert clicked, f"no {icon!r} button in Model Explorer's page"
    time.sleep(1.5)


def _graph_pixels(image, colour: tuple[int, int, int]) -> int:
    """Pixels of ``colour`` in the graph area (left of the side panel)."""
    graph = np.asarray(image.crop((0, 100, int(image.width * 0.7), image.height)), dtype=np.int16)
    return int((np.abs(graph - np.array(colour, dtype=np.int16)) <= 4).all(axis=-1).sum())


def test_the_graph_renders_with_every_stage_and_its_layers(page, tmp_path):
    text = page.evaluate("document.body.innerText")
    assert "extracted" in text and "94 nodes" in text  # the graph selector and its first graph, the extracted IR
    assert "encoder" in text and "embeddings" in text  # the root-level layers in the stats table
    assert HOSTILE in text  # the hostile label shown as text in the table
    assert not page.evaluate("[...document.scripts].some(s => s.textContent.includes('alert(1)'))")
    image = page.screenshot(tmp_path / "rendered.png")
    drawn = np.asarray(image.crop((0, 100, int(image.width * 0.7), image.height)).convert("L"))
    assert (drawn < 200).sum() > 2000, f"nothing drawn: see {tmp_path / 'rendered.png'}"


def test_layers_fold_and_unfold(page, tmp_path):
    assert _expanded_groups(page) == []
    _click_icon(page, "unfold_more_double")  # "expand all layers"
    page.screenshot(tmp_path / "unfolded.png")
    expanded = _expanded_groups(page)
    assert "encoder/layer.0/attention/self___group___" in expanded and "pooler___group___" in expanded
    _click_icon(page, "unfold_less_double")  # "collapse all layers"
    page.screenshot(tmp_path / "folded.png")
    assert _expanded_groups(page) == []


def test_an_overlay_colours_nodes(page, tmp_path):
    text = page.evaluate("document.body.innerText")
    for name in ("cycles", "DRAM bytes", "bound", "placement"):
        assert name in text
    coloured = _graph_pixels(page.screenshot(tmp_path / "placement.png"), NPU_COLOUR)
    assert coloured > 500, f"no node in the placement overlay's NPU colour: see {tmp_path / 'placement.png'}"
    _click_icon(page, "visibility")  # hide the placement overlay (the one shown)
    hidden = _graph_pixels(page.screenshot(tmp_path / "no-overlay.png"), NPU_COLOUR)
    assert hidden < coloured / 4, (coloured, hidden)


def test_no_console_error_and_no_dialog(page):
    page.evaluate("1")  # collect what arrived
    errors = []
    for event in page.events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown" or method == "Page.javascriptDialogOpening":
            errors.append(event)
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            errors.append(event)
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            # the sandbox has no network: the app's web fonts (fonts.gstatic.com) fail to load, nothing of ours
            if not (entry.get("source") == "network" and not entry.get("url", "").startswith("http://localhost")):
                errors.append(event)
    assert errors == []


def test_the_70b_shaped_model_shows_folded_in_seconds(tmp_path):
    from npu_tools.view.stages import ir_graph

    from .test_explorer import llama_70b_shaped_ir

    write_explorer([ir_graph(llama_70b_shaped_ir(), "extracted")], tmp_path / "files", label="llama3-70b")
    with explorer_page(tmp_path / "files", tmp_path / "chromium") as tools:
        text = tools.evaluate("document.body.innerText")
        tools.screenshot(tmp_path / "llama3-70b.png")
        expanded = _expanded_groups(tools)
    assert "llama3-70b" in text and "op node count" in text
    assert expanded == []  # shown folded: the model's group at the root, not its thousands of ops
    # 2 s on a 2-core machine in SwiftShader (software WebGL); the bound leaves room for a loaded one
    assert tools.load_seconds < 20, f"the 80-layer graph took {tools.load_seconds:.1f} s to show"
