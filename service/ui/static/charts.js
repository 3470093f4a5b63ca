/* Charts as inline SVG, no library (none is vendored; the pages load nothing from outside).
   GrpoCharts.line(element, series, {smoothing, title}): series [{key, label, color, points:
   [[step, value], ...]}]; one polyline per series (data-series, data-points), smoothed by
   TensorBoard's debiased EMA when smoothing > 0 (the raw curve stays, faded), a dot per point
   up to 300 points, an HTML legend, and a tooltip with the step and every series' value.
   GrpoCharts.histogram(element, values, {title}): bars with data-count, and a tooltip. */
"use strict";

const GrpoCharts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const W = 420, H = 200, M = {l: 52, r: 12, t: 12, b: 26};
  const PALETTE = ["#2563eb", "#16a34a", "#dc2626", "#9333ea", "#ea580c", "#0891b2"];

  function el(name, attrs, parent) {
    const n = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, String(v));
    if (parent) parent.appendChild(n);
    return n;
  }

  function fmt(v) {
    if (v === 0) return "0";
    const a = Math.abs(v);
    if (a >= 1000 || a < 0.01) return v.toExponential(2);
    const text = v.toPrecision(4);
    return text.includes(".") ? text.replace(/\.?0+$/, "") : text;  // 100 stays 100
  }

  /* Axis labels with as many decimals as the tick spacing needs: a narrow range (entropy
     4.551-4.563) must not print the same label on every line. */
  function tick(v, spacing) {
    if (Math.abs(v) >= 1e5 || (v !== 0 && spacing < 1e-4)) return v.toExponential(2);
    const decimals = Math.min(Math.max(0, 1 - Math.floor(Math.log10(spacing || 1))), 8);
    return v.toFixed(decimals);
  }

  function extent(values) {
    let lo = Math.min(...values), hi = Math.max(...values);
    if (!isFinite(lo)) return [0, 1];
    if (lo === hi) { const pad = Math.abs(lo) * 0.1 || 1; lo -= pad; hi += pad; }
    return [lo, hi];
  }

  /* TensorBoard's smoothing: an EMA debiased by 1 - w^n, so the first points are not pulled
     towards zero; w = 0 leaves the curve as it is. */
  function ema(values, w) {
    if (!w) return values.slice();
    let last = 0;
    return values.map((v, i) => { last = last * w + (1 - w) * v; return last / (1 - w ** (i + 1)); });
  }

  function tip() {
    let box = document.getElementById("chart-tip");
    if (!box) {
      box = document.createElement("div");
      box.id = "chart-tip";
      box.hidden = true;
      document.body.appendChild(box);
    }
    return box;
  }

  function showTip(event, lines) {
    const box = tip();
    box.textContent = "";
    lines.forEach((text, i) => {
      const line = document.createElement("div");
      if (i === 0) line.className = "tip-head";
      line.textContent = text;
      box.appendChild(line);
    });
    box.hidden = false;
    box.style.left = `${Math.min(event.clientX + 14, window.innerWidth - 260)}px`;
    box.style.top = `${event.clientY + 14}px`;
  }

  function hideTip() { tip().hidden = true; }

  function frame(container, title) {
    container.textContent = "";
    return el("svg", {viewBox: `0 0 ${W} ${H}`, class: "line-chart", role: "img",
      "aria-label": title || "chart"}, container);
  }

  function empty(svg, text) {
    el("text", {x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty"}, svg)
      .textContent = text || "no data yet";
    return svg;
  }

  function axes(svg, sx, sy, [x0, x1], [y0, y1], integer) {
    for (let i = 0; i <= 4; i++) {
      const y = y0 + (y1 - y0) * i / 4;
      el("line", {x1: M.l, x2: W - M.r, y1: sy(y), y2: sy(y), class: "grid"}, svg);
      el("text", {x: M.l - 6, y: sy(y) + 4, "text-anchor": "end", class: "tick"}, svg)
        .textContent = tick(y, (y1 - y0) / 4);
    }
    const ticks = new Set([x0, x1]);
    for (let i = 1; i < 4; i++) {
      const x = x0 + (x1 - x0) * i / 4;
      ticks.add(integer ? Math.round(x) : x);
    }
    for (const x of ticks) {
      el("text", {x: sx(x), y: H - 8, "text-anchor": "middle", class: "tick"}, svg)
        .textContent = integer ? String(x) : tick(x, (x1 - x0) / 4);
    }
  }

  function legend(container, series) {
    const box = document.createElement("div");
    box.className = "legend";
    for (const s of series) {
      const item = document.createElement("span");
      item.className = "legend-item";
      item.dataset.series = s.key;
      const swatch = document.createElement("i");
      swatch.style.background = s.color;
      item.append(swatch, document.createTextNode(s.label));
      box.appendChild(item);
    }
    container.appendChild(box);
  }

  function line(container, series, options) {
    const opts = options || {};
    const w = Math.min(Math.max(Number(opts.smoothing) || 0, 0), 0.99);
    const finite = (p) => Number.isFinite(p[0]) && Number.isFinite(p[1]);
    const shown = series.map((s, i) => {
      const raw = s.points.filter(finite).sort((a, b) => a[0] - b[0]);
      const smooth = ema(raw.map((p) => p[1]), w);
      return {...s, color: s.color || PALETTE[i % PALETTE.length], raw,
        points: raw.map((p, j) => [p[0], smooth[j]])};
    });
    const svg = frame(container, opts.title);
    const all = shown.flatMap((s) => s.raw);
    if (!all.length) return empty(svg, opts.emptyText);
    const xr = extent(all.map((p) => p[0]));
    const yr = extent(all.map((p) => p[1]));
    const sx = (x) => M.l + (x - xr[0]) / (xr[1] - xr[0]) * (W - M.l - M.r);
    const sy = (y) => H - M.b - (y - yr[0]) / (yr[1] - yr[0]) * (H - M.t - M.b);
    axes(svg, sx, sy, xr, yr, all.every((p) => Number.isInteger(p[0])));
    const path = (pts) => pts.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
    for (const s of shown) {
      if (!s.raw.length) continue;
      if (w > 0) {
        el("polyline", {points: path(s.raw), fill: "none", stroke: s.color, "stroke-width": 1.5,
          class: "raw", "data-raw": s.key}, svg);
      }
      el("polyline", {points: path(s.points), fill: "none", stroke: s.color, "stroke-width": 2,
        "data-series": s.key, "data-points": s.points.length, "data-smoothing": w}, svg);
      if (s.points.length <= 300) {
        for (const p of s.points) {
          el("circle", {cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: s.color,
            "data-series": s.key, "data-step": p[0]}, svg);
        }
      }
    }
    const guide = el("line", {y1: M.t, y2: H - M.b, class: "guide", visibility: "hidden"}, svg);
    const steps = [...new Set(all.map((p) => p[0]))].sort((a, b) => a - b);
    const byStep = shown.map((s) => ({s, raw: new Map(s.raw.map((p) => [p[0], p[1]])),
      smooth: new Map(s.points.map((p) => [p[0], p[1]]))}));
    svg.addEventListener("mousemove", (event) => {
      const rect = svg.getBoundingClientRect();
      const x = xr[0] + ((event.clientX - rect.left) / rect.width * W - M.l)
        / (W - M.l - M.r) * (xr[1] - xr[0]);
      const step = steps.reduce((best, s) => (Math.abs(s - x) < Math.abs(best - x) ? s : best));
      guide.setAttribute("x1", sx(step));
      guide.setAttribute("x2", sx(step));
      guide.setAttribute("visibility", "visible");
      const lines = [`step ${step}`];
      for (const {s, raw, smooth} of byStep) {
        if (!raw.has(step)) continue;
        const value = w > 0 ? `${fmt(smooth.get(step))} (raw ${fmt(raw.get(step))})` : fmt(raw.get(step));
        lines.push(`${s.label}: ${value}`);
      }
      showTip(event, lines);
    });
    svg.addEventListener("mouseleave", () => { guide.setAttribute("visibility", "hidden"); hideTip(); });
    if (shown.length > 1 || opts.legend) legend(container, shown);
    return svg;
  }

  /* Bars of a reward distribution: one per distinct value when there are few (rewards are
     often 0/1), else 20 equal bins. */
  function histogram(container, values, options) {
    const opts = options || {};
    const svg = frame(container, opts.title);
    const finite = values.filter(Number.isFinite);
    if (!finite.length) return empty(svg, opts.emptyText || "no rewards");
    const distinct = [...new Set(finite)].sort((a, b) => a - b);
    let bins;
    if (distinct.length <= 12) {
      bins = distinct.map((v) => ({lo: v, hi: v, count: finite.filter((x) => x === v).length}));
    } else {
      const [lo, hi] = extent(finite);
      const width = (hi - lo) / 20;
      bins = Array.from({length: 20}, (_, i) => ({lo: lo + i * width, hi: lo + (i + 1) * width, count: 0}));
      for (const v of finite) bins[Math.min(19, Math.floor((v - lo) / width))].count++;
    }
    const top = Math.max(...bins.map((b) => b.count));
    const sy = (c) => H - M.b - c / top * (H - M.t - M.b);
    const slot = (W - M.l - M.r) / bins.length;
    for (let i = 0; i <= 4; i++) {
      const c = top * i / 4;
      el("line", {x1: M.l, x2: W - M.r, y1: sy(c), y2: sy(c), class: "grid"}, svg);
      el("text", {x: M.l - 6, y: sy(c) + 4, "text-anchor": "end", class: "tick"}, svg)
        .textContent = fmt(c);
    }
    bins.forEach((b, i) => {
      const x = M.l + i * slot;
      const label = b.lo === b.hi ? fmt(b.lo) : `${fmt(b.lo)}–${fmt(b.hi)}`;
      const bar = el("rect", {x: x + 1, y: sy(b.count), width: Math.max(slot - 2, 1),
        height: H - M.b - sy(b.count), class: "bar", "data-count": b.count,
        "data-label": label}, svg);
      bar.addEventListener("mousemove", (e) => showTip(e, [`reward ${label}`, `${b.count} completions`]));
      bar.addEventListener("mouseleave", hideTip);
      if (bins.length <= 12 || i % 4 === 0) {
        el("text", {x: x + slot / 2, y: H - 8, "text-anchor": "middle", class: "tick"}, svg)
          .textContent = fmt(b.lo);
      }
    });
    return svg;
  }

  return {line, histogram, fmt, PALETTE};
})();
