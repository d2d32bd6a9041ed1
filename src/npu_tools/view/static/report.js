/* The report page's script (npu_tools.view.report inlines it). It reads the data from #report-data with
   JSON.parse, draws the chosen stage's graph as SVG folded by block, colours it by the chosen overlay, shows a
   clicked node in the panel and draws the memory plan. Every string of the model (node names, module paths, ops,
   attributes) is untrusted: it is shown only through textContent and setAttribute, never parsed as markup. */
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";
  var DATA = JSON.parse(document.getElementById("report-data").textContent);
  var BOX_W = 170, BOX_H = 36, GAP_X = 26, GAP_Y = 30, MARGIN = 20;
  var RAMP = [[255, 245, 192], [245, 160, 64], [192, 16, 16]];
  var PALETTE = ["#8dd3c7", "#fdb462", "#bebada", "#fb8072", "#80b1d3", "#b3de69", "#fccde5", "#d9d9d9",
                 "#bc80bd", "#ccebc5", "#ffed6f", "#a6cee3"];
  var NO_VALUE = "#eeeeee", NON_FINITE = "#8040c0", NODE_FILL = "#dde8f5", GROUP_FILL = "#f5e6c8";
  var state = {stage: 0, overlay: -1, expanded: new Set(), zoom: 1, selected: null, related: null};
  var current = null;  // the drawn stage: its units, edges and layout

  function svg(tag, attrs, parent) {
    var e = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (parent) { parent.appendChild(e); }
    return e;
  }
  function html(tag, text, parent) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    if (parent) { parent.appendChild(e); }
    return e;
  }
  function sources(n) { return n.src || [n.id]; }
  function shortOp(op) { return String(op).replace(/^aten\./, "").replace(/\.default$/, ""); }
  function cut(text, n) { text = String(text); return text.length > n ? text.slice(0, n - 1) + "\u2026" : text; }
  function prefixes(ns) {
    var parts = ns ? ns.split(".") : [], out = [];
    for (var k = 1; k <= parts.length; k++) { out.push(parts.slice(0, k).join(".")); }
    return out;
  }

  // -- folding: a box is a block (a module path with a numeric part, e.g. model.layers.3) of two or more nodes
  // that is not unfolded, or a node outside any folded block
  function prepare(stage) {
    if (stage.prep) { return stage.prep; }
    var counts = new Map(), bySource = new Map();
    stage.nodes.forEach(function (n, i) {
      prefixes(n.ns).forEach(function (p) { counts.set(p, (counts.get(p) || 0) + 1); });
      sources(n).forEach(function (s) {
        if (!bySource.has(s)) { bySource.set(s, []); }
        bySource.get(s).push(i);
      });
    });
    stage.prep = {counts: counts, bySource: bySource};
    return stage.prep;
  }
  function foldable(p, counts) { return counts.get(p) >= 2 && /(^|\.)\d+(\.|$)/.test(p); }
  function groupOf(n, counts) {
    var ps = prefixes(n.ns);
    for (var k = 0; k < ps.length; k++) {
      if (foldable(ps[k], counts) && !state.expanded.has(ps[k])) { return ps[k]; }
    }
    return null;
  }

  function buildUnits(stage) {
    var counts = prepare(stage).counts, units = [], byKey = new Map(), nodeUnit = [];
    stage.nodes.forEach(function (n, i) {
      var g = groupOf(n, counts), key = g === null ? "n" + i : "g" + g, u = byKey.get(key);
      if (!u) {
        u = {key: key, group: g, node: g === null ? i : -1, members: [], order: units.length};
        byKey.set(key, u);
        units.push(u);
      }
      u.members.push(i);
      nodeUnit.push(u);
    });
    var edges = new Map();
    stage.nodes.forEach(function (n, i) {
      n["in"].forEach(function (j) {
        var a = nodeUnit[j], b = nodeUnit[i];
        if (a !== b) { edges.set(a.order + ">" + b.order, [a, b]); }
      });
    });
    return {stage: stage, units: units, edges: Array.from(edges.values())};
  }

  // -- layout: a unit's layer is its longest path from the top (edges that go back in program order, which a
  // folded block can make, are drawn but not followed); within a layer, units sort by their inputs' mean x
  function layout(g) {
    var preds = g.units.map(function () { return []; }), layers = [];
    g.edges.forEach(function (e) { if (e[0].order < e[1].order) { preds[e[1].order].push(e[0]); } });
    g.units.forEach(function (u, i) {
      u.layer = 0;
      preds[i].forEach(function (p) { u.layer = Math.max(u.layer, p.layer + 1); });
      (layers[u.layer] = layers[u.layer] || []).push(u);
    });
    var step = BOX_W + GAP_X;
    layers.forEach(function (layer) {
      layer.forEach(function (u, k) {
        var ps = preds[u.order];
        u.key2 = ps.length ? ps.reduce(function (s, p) { return s + p.cx; }, 0) / ps.length
                           : (k - (layer.length - 1) / 2) * step;
      });
      layer.sort(function (a, b) { return a.key2 - b.key2 || a.order - b.order; });
      layer.forEach(function (u, k) { u.cx = (k - (layer.length - 1) / 2) * step; });
    });
    var widest = Math.max.apply(null, layers.map(function (l) { return l.length; }).concat([1]));
    g.width = widest * step - GAP_X + 2 * MARGIN;
    g.height = layers.length * (BOX_H + GAP_Y) - GAP_Y + 2 * MARGIN + 14;
    g.units.forEach(function (u) {
      u.x = MARGIN + (widest - 1) / 2 * step + u.cx;
      u.y = MARGIN + 14 + u.layer * (BOX_H + GAP_Y);
    });
  }

  // -- drawing
  function draw() {
    var stage = DATA.stages[state.stage];
    var host = document.getElementById("graph");
    host.textContent = "";
    if (!stage) { html("p", "No graph.", host); return; }
    current = buildUnits(stage);
    layout(current);
    var root = svg("svg", {id: "graph-svg", viewBox: "0 0 " + current.width + " " + current.height}, host);
    applyZoom(root);
    drawFrames(root, current);
    var edgeLayer = svg("g", {"class": "edges"}, root);
    current.edges.forEach(function (e) {
      var a = e[0], b = e[1], x1 = a.x + BOX_W / 2, y1 = a.y + BOX_H, x2 = b.x + BOX_W / 2, y2 = b.y;
      svg("path", {"class": "edge", d: "M" + x1 + " " + y1 + " C" + x1 + " " + (y1 + GAP_Y) + " " + x2 + " " +
                   (y2 - GAP_Y) + " " + x2 + " " + y2}, edgeLayer);
    });
    var unitLayer = svg("g", {"class": "units"}, root);
    current.units.forEach(function (u) { drawUnit(unitLayer, stage, u); });
    colour();
    document.getElementById("counts").textContent = current.units.length + " boxes, " + stage.nodes.length +
      " nodes, " + current.edges.length + " edges";
  }

  function drawUnit(parent, stage, u) {
    var g = svg("g", {"class": "unit" + (u.group !== null ? " group" : ""), transform: "translate(" + u.x + "," +
                      u.y + ")"}, parent);
    var title = svg("title", {}, g), line1, line2;
    if (u.group !== null) {
      g.setAttribute("data-group", u.group);
      line1 = cut(u.group.split(".").slice(-2).join("."), 26);
      line2 = "\u25b8 " + u.members.length + " nodes";
      title.textContent = u.group + " (" + u.members.length + " nodes): click to unfold";
    } else {
      var n = stage.nodes[u.node];
      g.setAttribute("data-node", n.id);
      line1 = cut(shortOp(n.op), 26);
      line2 = cut(n.id, 30);
      title.textContent = n.id + " (" + n.op + ")" + (n.ns ? " in " + n.ns : "");
    }
    u.rect = svg("rect", {width: BOX_W, height: BOX_H, rx: u.group !== null ? 8 : 3}, g);
    svg("text", {x: 8, y: 15, "font-size": 12}, g).textContent = line1;
    svg("text", {x: 8, y: 29, "font-size": 10, fill: "#555"}, g).textContent = line2;
    u.el = g;
  }

  function drawFrames(root, g) {
    var boxes = new Map();
    g.units.forEach(function (u) {
      var ns = u.group !== null ? u.group : g.stage.nodes[u.node].ns;
      prefixes(ns).forEach(function (p) {
        if (!state.expanded.has(p)) { return; }
        var b = boxes.get(p) || {x0: Infinity, y0: Infinity, x1: -Infinity, y1: -Infinity};
        b.x0 = Math.min(b.x0, u.x); b.y0 = Math.min(b.y0, u.y);
        b.x1 = Math.max(b.x1, u.x + BOX_W); b.y1 = Math.max(b.y1, u.y + BOX_H);
        boxes.set(p, b);
      });
    });
    var layer = svg("g", {"class": "frames"}, root);
    Array.from(boxes.keys()).sort(function (a, b) { return a.length - b.length; }).forEach(function (p) {
      var b = boxes.get(p), pad = 6 + 2 * Math.max(0, 6 - p.split(".").length);
      svg("rect", {"class": "frame", x: b.x0 - pad, y: b.y0 - pad - 12, width: b.x1 - b.x0 + 2 * pad,
                   height: b.y1 - b.y0 + 2 * pad + 12, rx: 6}, layer);
      var label = svg("text", {"class": "frame-label", x: b.x0 - pad + 4, y: b.y0 - pad - 2,
                               "data-fold": p}, layer);
      label.textContent = "\u25be " + p + " (click to fold)";
    });
  }

  function applyZoom(root) {
    root = root || document.getElementById("graph-svg");
    if (!root || !current) { return; }
    root.setAttribute("width", Math.round(current.width * state.zoom));
    root.setAttribute("height", Math.round(current.height * state.zoom));
  }

  // -- overlays: a node shows its own value; a folded block the values of the measured stage's nodes that compute
  // any of its nodes' sources, each counted once, reduced as the overlay says (sum, max, min or join)
  function unitValue(ov, stage, u) {
    var values = ov.values[stage.stage] || [];
    if (u.node >= 0) { return values[u.node]; }
    var measured = DATA.stages.filter(function (s) { return s.stage === ov.stage && ov.values[s.stage]; })[0];
    var out = [];
    if (!measured) {
      u.members.forEach(function (i) { if (values[i] !== null && values[i] !== undefined) { out.push(values[i]); } });
      return reduce(out, ov.reduce === "sum" ? "max" : ov.reduce);  // a sum over members would count twice
    }
    var bySource = prepare(measured).bySource, seen = new Set(), mv = ov.values[measured.stage];
    u.members.forEach(function (i) {
      sources(stage.nodes[i]).forEach(function (s) {
        (bySource.get(s) || []).forEach(function (j) {
          if (seen.has(j)) { return; }
          seen.add(j);
          if (mv[j] !== null && mv[j] !== undefined) { out.push(mv[j]); }
        });
      });
    });
    return reduce(out, ov.reduce);
  }
  function reduce(values, how) {
    if (!values.length) { return null; }
    if (how === "join" || values.some(function (v) { return typeof v === "string"; })) {
      return Array.from(new Set(values.map(String))).join("; ");
    }
    if (how === "max" || how === "min") { return Math[how].apply(null, values); }  // min: an SQNR's worst
    return values.reduce(function (a, b) { return a + b; }, 0);
  }
  function ramp(t) {
    var seg = t < 0.5 ? 0 : 1, f = t < 0.5 ? t * 2 : (t - 0.5) * 2, a = RAMP[seg], b = RAMP[seg + 1];
    return "rgb(" + a.map(function (c, k) { return Math.round(c + (b[k] - c) * f); }).join(",") + ")";
  }

  function colour() {
    if (!current) { return; }
    var ov = DATA.overlays[state.overlay], stage = current.stage;
    var legend = document.getElementById("legend");
    legend.textContent = "";
    current.units.forEach(function (u) {
      u.value = ov ? unitValue(ov, stage, u) : null;
      var related = state.related && u.members.some(function (i) {
        return sources(stage.nodes[i]).some(function (s) { return state.related.has(s); });
      });
      u.el.classList.toggle("related", !!related);
      u.el.classList.toggle("selected", !!state.selected && state.selected.stage === state.stage &&
                            state.selected.key === u.key);
    });
    current.units.forEach(function (u) { u.el.classList.remove("dark"); });
    if (!ov) {
      current.units.forEach(function (u) { u.rect.setAttribute("fill", u.group !== null ? GROUP_FILL : NODE_FILL); });
      return;
    }
    var numbers = current.units.map(function (u) { return u.value; })
      .filter(function (v) { return typeof v === "number"; });
    var texts = current.units.map(function (u) { return u.value; })
      .filter(function (v) { return typeof v === "string"; });
    if (numbers.length >= texts.length && numbers.length) {
      colourNumbers(ov, numbers, legend);
    } else {
      colourCategories(texts, legend);
    }
    var sw = html("span", null, legend);
    sw.className = "swatch";
    sw.style.background = NO_VALUE;
    html("span", "no value", legend);
  }

  function colourNumbers(ov, numbers, legend) {
    var lo = Math.min.apply(null, numbers), hi = Math.max.apply(null, numbers);
    var log = lo > 0 && hi / lo > 1000;
    function t(v) {
      if (hi === lo) { return 1; }
      return log ? (Math.log(v) - Math.log(lo)) / (Math.log(hi) - Math.log(lo)) : (v - lo) / (hi - lo);
    }
    current.units.forEach(function (u) {
      var v = u.value;
      u.el.classList.toggle("dark", typeof v === "number" && t(v) > 0.6);  // white text on the dark end
      u.rect.setAttribute("fill", typeof v === "number" ? ramp(t(v)) : v === null || v === undefined ? NO_VALUE
                                                                                                  : NON_FINITE);
    });
    html("b", ov.name + (ov.unit ? " (" + ov.unit + ")" : ""), legend);
    html("span", fmt(lo), legend);
    html("span", null, legend).className = "ramp";
    html("span", fmt(hi) + (log ? " (log scale)" : ""), legend);
  }

  function colourCategories(texts, legend) {
    var counts = new Map();
    texts.forEach(function (v) { counts.set(v, (counts.get(v) || 0) + 1); });
    var cats = Array.from(counts.keys()).sort(function (a, b) { return counts.get(b) - counts.get(a); });
    var colourOf = new Map();
    cats.forEach(function (c, k) { colourOf.set(c, k < PALETTE.length - 1 ? PALETTE[k] : PALETTE[PALETTE.length - 1]); });
    current.units.forEach(function (u) {
      u.rect.setAttribute("fill", typeof u.value === "string" ? colourOf.get(u.value) : NO_VALUE);
    });
    html("b", DATA.overlays[state.overlay].name, legend);
    cats.slice(0, PALETTE.length).forEach(function (c, k) {
      var sw = html("span", null, legend);
      sw.className = "swatch";
      sw.style.background = colourOf.get(c);
      html("span", cut(k === PALETTE.length - 1 && cats.length > PALETTE.length ? "other" : c, 60), legend);
    });
  }
  function fmt(v) {
    if (typeof v !== "number") { return String(v); }
    return Math.abs(v) >= 1e5 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(3) : String(+v.toPrecision(6));
  }

  // -- the node panel
  function showPanel(stage, u) {
    var panel = document.getElementById("panel");
    panel.textContent = "";
    var dl;
    function item(name, value) { html("dt", name, dl); html("dd", value, dl); }
    if (u.group !== null) {
      html("h3", u.group, panel);
      dl = html("dl", null, panel);
      item("stage", stage.stage);
      item("nodes", u.members.length);
      var ops = new Map();
      u.members.forEach(function (i) { var op = shortOp(stage.nodes[i].op); ops.set(op, (ops.get(op) || 0) + 1); });
      item("ops", Array.from(ops.entries()).sort(function (a, b) { return b[1] - a[1]; }).slice(0, 12)
        .map(function (e) { return e[0] + " \u00d7" + e[1]; }).join("\n"));
    } else {
      var n = stage.nodes[u.node];
      html("h3", n.id, panel);
      dl = html("dl", null, panel);
      item("stage", stage.stage);
      item("op", n.op);
      item("module", n.ns || "(top)");
      item("outputs", n.out.map(function (o) { return o[0] + "  " + JSON.stringify(o[1]) + "  " + o[2]; }).join("\n"));
      item("inputs from", n["in"].map(function (j) { return stage.nodes[j].id; }).join("\n") || "(graph inputs)");
      if (n.attrs) {
        item("attributes", Object.keys(n.attrs).map(function (k) { return k + " = " + JSON.stringify(n.attrs[k]); })
          .join("\n"));
      }
      var srcs = sources(n);
      item("sources (" + srcs.length + ")", srcs.slice(0, 40).join("\n") + (srcs.length > 40 ? "\n\u2026" : ""));
      if (n.rules) { item("rules", n.rules.join("\n")); }
    }
    DATA.overlays.forEach(function (ov) {
      var v = unitValue(ov, stage, u);
      item(ov.name + (ov.unit ? " (" + ov.unit + ")" : ""), v === null || v === undefined ? "\u2014" : fmt(v));
    });
  }

  function select(u) {
    var stage = current.stage, related = new Set();
    u.members.forEach(function (i) { sources(stage.nodes[i]).forEach(function (s) { related.add(s); }); });
    state.selected = {stage: state.stage, key: u.key};
    state.related = related;
    showPanel(stage, u);
  }

  // -- events
  function onGraphClick(event) {
    var target = event.target;
    var fold = target.closest && target.closest("[data-fold]");
    if (fold) {
      state.expanded["delete"](fold.getAttribute("data-fold"));
      draw();
      return;
    }
    var el = target.closest && target.closest("g.unit");
    if (!el || !current) { return; }
    var u = current.units.filter(function (x) { return x.el === el; })[0];
    if (!u) { return; }
    if (u.group !== null) {
      showPanel(current.stage, u);
      state.expanded.add(u.group);
      draw();
    } else {
      select(u);
      colour();
    }
  }

  function fillSelects() {
    var stageSel = document.getElementById("stage"), ovSel = document.getElementById("overlay");
    DATA.stages.forEach(function (s, i) { html("option", s.stage + " (" + s.nodes.length + " nodes)", stageSel).value = i; });
    html("option", "none", ovSel).value = -1;
    DATA.overlays.forEach(function (o, i) { html("option", o.name + (o.unit ? " (" + o.unit + ")" : ""), ovSel).value = i; });
    stageSel.addEventListener("change", function () { state.stage = +stageSel.value; draw(); });
    ovSel.addEventListener("change", function () { state.overlay = +ovSel.value; colour(); });
  }

  function wireButtons() {
    document.getElementById("fold-all").addEventListener("click", function () { state.expanded.clear(); draw(); });
    document.getElementById("unfold-all").addEventListener("click", function () {
      var counts = prepare(DATA.stages[state.stage]).counts;
      counts.forEach(function (_, p) { if (foldable(p, counts)) { state.expanded.add(p); } });
      draw();
    });
    document.getElementById("zoom-in").addEventListener("click", function () { state.zoom *= 1.25; applyZoom(); });
    document.getElementById("zoom-out").addEventListener("click", function () { state.zoom /= 1.25; applyZoom(); });
    document.getElementById("graph").addEventListener("click", onGraphClick);
  }

  // -- the memory plan: x the dispatch step (-1: live on entry, steps: live on exit), y the arena offset
  function drawTimeline() {
    var m = DATA.memory, host = document.getElementById("timeline");
    if (!m) { html("p", "No compiled program.", host); return; }
    var W = 900, H = 320, L = 90, T = 10, B = 34, arena = Math.max(m.arena_bytes, 1), cols = m.steps + 2;
    var root = svg("svg", {id: "timeline-svg", width: L + W + 20, height: T + H + B}, host);
    function x(step) { return L + (step + 1) / cols * W; }
    function y(offset) { return T + offset / arena * H; }
    svg("rect", {x: L, y: T, width: W, height: H, fill: "#fafafa", stroke: "#999"}, root);
    m.tensors.forEach(function (t, k) {
      var r = svg("rect", {"class": "life", x: x(t[3]), y: y(t[1]), width: Math.max(x(t[4] + 1) - x(t[3]), 0.5),
                           height: Math.max(t[2] / arena * H, 0.5), fill: PALETTE[k % PALETTE.length],
                           "data-tensor": t[0], "data-offset": t[1], "data-bytes": t[2]}, root);
      svg("title", {}, r).textContent = t[0] + ": " + t[2] + " bytes at offset " + t[1] + ", steps " + t[3] +
        " to " + t[4];
    });
    svg("text", {x: L, y: T + H + 14, "font-size": 11}, root).textContent = "-1 (inputs)";
    svg("text", {x: L + W, y: T + H + 14, "font-size": 11, "text-anchor": "end"}, root).textContent =
      m.steps + " (outputs)";
    svg("text", {x: L + W / 2, y: T + H + 28, "font-size": 12, "text-anchor": "middle"}, root).textContent =
      "dispatch step";
    svg("text", {x: L - 6, y: T + 10, "font-size": 11, "text-anchor": "end"}, root).textContent = "offset 0";
    svg("text", {x: L - 6, y: T + H, "font-size": 11, "text-anchor": "end"}, root).textContent =
      fmt(m.arena_bytes) + " B";
  }

  fillSelects();
  wireButtons();
  draw();
  drawTimeline();
}());
