// Helpers of trajkit's pages (the report, the comparison): DOM and SVG builders, number formats,
// chart boxes and horizontal bar charts. Loaded before the page's own script, in the same element.
"use strict";
const SVGNS = "http://www.w3.org/2000/svg";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value; else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVGNS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}
const fmt = (n) => (n === null || n === undefined) ? "-" : Number(n).toLocaleString("en-US");
const pct = (x) => (x === null || x === undefined) ? "-" : (100 * x).toFixed(1) + "%";
function dur(s) {
  if (s === null || s === undefined) return "-";
  if (s < 60) return s.toFixed(1) + "s";
  const m = Math.floor(s / 60), h = Math.floor(m / 60);
  return h ? `${h}h ${String(m % 60).padStart(2, "0")}m` : `${m}m ${String(Math.round(s % 60)).padStart(2, "0")}s`;
}
const clipLabel = (t, n) => t.length > n ? t.slice(0, n - 1) + "…" : t;

// -- charts -------------------------------------------------------------------------------------
function chartBox(id, title, legend) {
  const box = el("div", {class: "chart", id});
  box.append(el("h3", {}, title));
  document.getElementById("charts").append(box);
  if (legend) {
    const line = el("div", {class: "legend"});
    for (const [cls, text] of legend) line.append(el("i", {style: `background: var(--${cls})`}), text);
    box.legendLine = line;
  }
  return box;
}
function finish(box, root) {
  box.append(root);
  if (box.legendLine) box.append(box.legendLine);
}
function empty(box, text) { box.append(el("div", {class: "empty"}, text)); }

// Horizontal bars: rows of {label, parts: [{value, cls, title}], note}. Drawn at the box's own width
// so text keeps its size whatever the layout; long labels (rejection reasons) go above their bar.
const chartWidth = (box) => Math.max(320, box.clientWidth - 28);
function barsChart(box, rows, labelsAbove) {
  if (!rows.length) return empty(box, "nothing to show");
  const W = chartWidth(box), noteW = 110, rowH = labelsAbove ? 36 : 22, offset = labelsAbove ? 14 : 0;
  const labelW = labelsAbove ? 0 : Math.min(210, Math.round(W * 0.36));
  const barW = W - labelW - noteW, chars = Math.floor(((labelsAbove ? W : labelW) - 10) / 6.6);
  const max = Math.max(1, ...rows.map(r => r.parts.reduce((a, p) => a + p.value, 0)));
  const root = svg("svg", {viewBox: `0 0 ${W} ${rows.length * rowH + 6}`, role: "img"});
  rows.forEach((row, i) => {
    const y = 3 + i * rowH;
    const label = labelsAbove ? svg("text", {x: 0, y: y + 10}, clipLabel(row.label, chars))
      : svg("text", {x: labelW - 8, y: y + 14, "text-anchor": "end"}, clipLabel(row.label, chars));
    label.append(svg("title", {}, row.label));
    root.append(label);
    let x = labelW;
    for (const part of row.parts) {
      if (!part.value) continue;
      const w = Math.max(1, barW * part.value / max);
      const rect = svg("rect", {class: "bar " + part.cls, x, y: y + offset + 3, width: w, height: 15, rx: 2});
      rect.append(svg("title", {}, part.title));
      root.append(rect);
      x += w;
    }
    root.append(svg("text", {x: x + 6, y: y + offset + 14, class: "dim"}, row.note));
  });
  finish(box, root);
}

