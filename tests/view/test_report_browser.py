"""The HTML report in a real headless Chromium (driven over the DevTools protocol, ``chromium.py``): the graph
renders, a block unfolds and folds, an overlay colours the nodes, a hostile name is only text, the 80-layer
model opens folded in seconds, the memory timeline draws the plan; no console error and no request but the page's
own file. A screenshot of each is kept under ``test-artifacts/view/``. Skipped where Chromium is absent."""

from __future__ import annotations

import json
import time

import pytest

from .chromium import SKIP_REASON, Browser, find_chromium
from .conftest import ARTIFACTS, HOSTILE, HOSTILE_MODULE

pytestmark = pytest.mark.skipif(find_chromium() is None, reason=SKIP_REASON)

COUNT_UNITS = "document.querySelectorAll('#graph g.unit').length"
FILLS = ("Array.from(document.querySelectorAll('#graph g.unit rect'))"
         ".map(function (r) { return r.getAttribute('fill'); })")


def click(selector: str) -> str:
    """JavaScript that clicks the element ``selector`` finds (a real bubbling click event): true if it found one."""
    return (f"(function () {{ var e = document.querySelector({json.dumps(selector)}); if (!e) {{ return false; }} "
            "e.dispatchEvent(new MouseEvent('click', {bubbles: true})); return true; }())")


def choose(select_id: str, value: int) -> str:
    return (f"(function () {{ var s = document.getElementById({json.dumps(select_id)}); s.value = '{value}'; "
            "s.dispatchEvent(new Event('change')); }())")


@pytest.fixture(scope="module")
def browser():
    with Browser(find_chromium()) as b:
        yield b


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(ARTIFACTS / f"{name}.png")


def clean(page) -> None:
    """No console error or exception, no dialog, and nothing fetched but the page itself."""
    assert page.errors() == []
    assert page.dialogs() == []
    assert all(url.startswith("file://") for url in page.requests()), page.requests()
    assert len(page.requests()) == 1


def test_the_graph_renders_and_a_block_unfolds_and_folds(browser, llama_run):
    page = browser.open(llama_run.page.as_uri())
    folded = page.evaluate(COUNT_UNITS)
    blocks = page.evaluate("Array.from(document.querySelectorAll('#graph g.unit.group'))"
                           ".map(function (g) { return g.getAttribute('data-group'); })")
    assert folded > 0 and blocks == ["model.layers.0", "model.layers.1"]
    assert page.evaluate("document.querySelectorAll('#graph path.edge').length") > 0
    shot(page, "report-folded")
    assert page.evaluate(click('#graph g.unit[data-group="model.layers.0"]'))
    unfolded = page.evaluate(COUNT_UNITS)
    assert unfolded > folded
    assert page.evaluate("document.querySelector('#graph g.unit[data-group=\"model.layers.0\"]')") is None
    assert "model.layers.0" in page.evaluate("document.getElementById('panel').textContent")
    shot(page, "report-unfolded")
    assert page.evaluate(click('#graph [data-fold="model.layers.0"]'))
    assert page.evaluate(COUNT_UNITS) == folded
    # a node shows its op, shapes and sources in the panel
    assert page.evaluate(click("#graph g.unit[data-node]"))
    panel = page.evaluate("document.getElementById('panel').textContent")
    assert "op" in panel and "outputs" in panel and "sources" in panel
    clean(page)


def test_an_overlay_colours_the_nodes(browser, llama_run):
    page = browser.open(llama_run.page.as_uri())
    page.evaluate(choose("stage", 3))  # the compiled dispatches, where the cycles were measured
    before = page.evaluate(FILLS)
    assert set(before) <= {"#dde8f5", "#f5e6c8"}
    names = page.evaluate("Array.from(document.getElementById('overlay').options).map(function (o) "
                          "{ return o.textContent; })")
    page.evaluate(choose("overlay", names.index("cycles (cycles)") - 1))
    after = page.evaluate(FILLS)
    assert len(after) == len(before) and sum(f.startswith("rgb(") for f in after) >= len(after) // 2
    assert len(set(after)) > 2  # a ramp, not one colour
    legend = page.evaluate("document.getElementById('legend').textContent")
    assert "cycles" in legend
    shot(page, "report-overlay-cycles")
    page.evaluate(choose("overlay", names.index("placement") - 1))
    assert "NPU" in page.evaluate("document.getElementById('legend').textContent")
    clean(page)


def test_a_hostile_name_shows_as_text(browser, hostile_run):
    page = browser.open(hostile_run.page.as_uri())
    assert page.evaluate("document.title") == HOSTILE
    assert page.evaluate("document.querySelectorAll('script').length") == 2
    assert page.evaluate("document.querySelectorAll('img, iframe, object').length") == 0
    group = page.evaluate("document.querySelector('#graph g.unit.group title').textContent")
    assert group.startswith(HOSTILE_MODULE)
    assert page.evaluate(click("#graph g.unit.group"))  # unfold it: the hostile node itself
    assert page.evaluate(click("#graph g.unit[data-node]"))
    assert page.evaluate("document.querySelector('#panel h3').textContent") == HOSTILE
    assert page.evaluate("document.querySelectorAll('script').length") == 2
    assert page.evaluate("document.querySelectorAll('img, iframe, object').length") == 0
    shot(page, "report-hostile")
    clean(page)


def test_the_memory_timeline_draws_every_tensor(browser, llama_run):
    page = browser.open(llama_run.page.as_uri())
    drawn = page.evaluate("Array.from(document.querySelectorAll('#timeline rect.life')).map(function (r) "
                          "{ return [r.getAttribute('data-tensor'), +r.getAttribute('data-offset')]; })")
    offsets = llama_run.program.memory.offsets
    assert drawn and all(offsets[name] == offset for name, offset in drawn)
    page.evaluate("document.getElementById('timeline').scrollIntoView()")
    shot(page, "report-memory-timeline")
    clean(page)


def test_the_80_layer_model_opens_folded_in_seconds(browser, llama70b_run):
    start = time.perf_counter()
    page = browser.open(llama70b_run.page.as_uri())
    units = page.evaluate(COUNT_UNITS)
    elapsed = time.perf_counter() - start
    blocks = page.evaluate("document.querySelectorAll('#graph g.unit.group').length")
    assert blocks == 80 and units < 250, (blocks, units)
    assert elapsed < 15, f"{elapsed:.1f} s to load and draw"  # a generous bound: ~1 s on a quiet machine
    assert page.evaluate(click('#graph g.unit[data-group="model.layers.79"]'))
    assert page.evaluate(COUNT_UNITS) > units
    shot(page, "report-llama70b-folded")
    clean(page)
