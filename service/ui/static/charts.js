/* Line charts as inline SVG, no library. GrpoCharts.line(element, series, options)
   series: [{key, label, color, points: [[x, y], ...]}]; one polyline per series, with
   data-series and data-points attributes (and a dot per point up to 300 points). */
"use strict";

const GrpoCharts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const W = 420, H = 200, M = {l: 52, r: 12, t: 24, b: 26};

  function el(name, attrs, parent) {
    const node = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (parent) parent.appendChild(node);
    return node;
  }

  function fmt(v) {
    if (v === 0) return "0";
    const a = Math.abs(v);
    if (a >= 1000 || a < 0.01) return v.toExponential(1);
    return v.toPrecision(3).replace(/\.?0+$/, "");
  }

  function extent(values) {
    let lo = Math.min(...values), hi = Math.max(...values);
    if (!isFinite(lo)) return [0, 1];
    if (lo === hi) { const pad = Math.abs(lo) * 0.1 || 1; lo -= pad; hi += pad; }
    return [lo, hi];
  }

  function line(container, series, options) {
    const opts = options || {};
    container.textContent = "";
    const finite = (p) => Number.isFinite(p[0]) && Number.isFinite(p[1]);
    const shown = series.map((s) => ({...s, points: s.points.filter(finite)}));
    const all = shown.flatMap((s) => s.points);
    const svg = el("svg", {viewBox: `0 0 ${W} ${H}`, class: "line-chart", role: "img",
      "aria-label": opts.title || "chart"}, container);
    if (!all.length) {
      el("text", {x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty"}, svg)
        .textContent = "no data yet";
      return svg;
    }
    const [x0, x1] = extent(all.map((p) => p[0]));
    const [y0, y1] = extent(all.map((p) => p[1]));
    const sx = (x) => M.l + (x - x0) / (x1 - x0) * (W - M.l - M.r);
    const sy = (y) => H - M.b - (y - y0) / (y1 - y0) * (H - M.t - M.b);
    for (let i = 0; i <= 4; i++) {
      const y = y0 + (y1 - y0) * i / 4;
      el("line", {x1: M.l, x2: W - M.r, y1: sy(y), y2: sy(y), class: "grid"}, svg);
      el("text", {x: M.l - 6, y: sy(y) + 4, "text-anchor": "end", class: "tick"}, svg)
        .textContent = fmt(y);
    }
    const integer = all.every((p) => Number.isInteger(p[0]));
    const ticks = new Set([x0, x1]);
    for (let i = 1; i < 4; i++) ticks.add(integer ? Math.round(x0 + (x1 - x0) * i / 4) : x0 + (x1 - x0) * i / 4);
    for (const x of ticks) {
      el("text", {x: sx(x), y: H - 8, "text-anchor": "middle", class: "tick"}, svg)
        .textContent = integer ? String(x) : fmt(x);
    }
    shown.forEach((s, i) => {
      if (!s.points.length) return;
      const pts = s.points.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`);
      el("polyline", {points: pts.join(" "), fill: "none", stroke: s.color, "stroke-width": 2,
        "data-series": s.key, "data-points": s.points.length}, svg);
      if (s.points.length <= 300) {
        for (const p of s.points) {
          const dot = el("circle", {cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: s.color,
            "data-series": s.key, "data-step": p[0]}, svg);
          el("title", {}, dot).textContent = `${s.label} · step ${p[0]}: ${fmt(p[1])}`;
        }
      }
      if (shown.length > 1) {
        const lx = M.l + i * 110;
        el("rect", {x: lx, y: 4, width: 10, height: 10, fill: s.color}, svg);
        el("text", {x: lx + 14, y: 13, class: "legend"}, svg).textContent = s.label;
      }
    });
    return svg;
  }

  return {line};
})();
