// The charts of the `trajkit compare` page, drawn as inline SVG from the comparison embedded in the
// page (`compare-data`). The page's tables and text are rendered by its template; this draws the
// figures people would rather look at than read.
const DATA = JSON.parse(document.getElementById("compare-data").textContent);
const RUNS = DATA.runs;
const BASELINE = RUNS[0];
const GROUPS = ["all", ...DATA.rows.scored_sources];
const runClass = (i) => "run-" + (i % 8);
const figuresOf = (run, group) => group === "all" ? run.figures : run.by_source[group];
const signed = (x) => (x >= 0 ? "+" : "") + (100 * x).toFixed(1);

function legend(box) {
  const line = el("div", {class: "legend"});
  RUNS.forEach((run, i) => line.append(el("i", {class: "swatch " + runClass(i)}), run.label));
  box.legendLine = line;
}

// Rows of {label, group, value, lo, hi, cls, title} as dots with whiskers on a horizontal axis
// from `min` to `max`; `zero` draws a reference line there; `format` writes the axis ticks.
function intervalChart(box, rows, min, max, format, zero) {
  if (!rows.length) return empty(box, "nothing to show");
  const W = chartWidth(box), labelW = Math.min(220, Math.round(W * 0.34)), right = 70, rowH = 20;
  const top = 8, axisH = 22, plotW = W - labelW - right;
  const H = top + rows.length * rowH + axisH;
  const x = (v) => labelW + plotW * (v - min) / ((max - min) || 1);
  const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, role: "img"});
  for (let i = 0; i <= 4; i++) {
    const v = min + (max - min) * i / 4;
    root.append(svg("line", {class: "axis", x1: x(v), y1: top, x2: x(v), y2: H - axisH}));
    root.append(svg("text", {x: x(v), y: H - 6, "text-anchor": "middle", class: "dim"}, format(v)));
  }
  if (zero !== undefined) root.append(svg("line", {class: "zero", x1: x(zero), y1: top, x2: x(zero), y2: H - axisH}));
  let group = null;
  rows.forEach((row, i) => {
    const y = top + i * rowH + rowH / 2;
    if (row.group !== group) {
      group = row.group;
      root.append(svg("text", {x: 0, y: y + 4, class: "group"}, clipLabel(group, 24)));
    }
    root.append(svg("text", {x: labelW - 8, y: y + 4, "text-anchor": "end"}, clipLabel(row.label, 22)));
    if (row.value === null || row.value === undefined) {
      root.append(svg("text", {x: labelW + 4, y: y + 4, class: "dim"}, "no scored trajectories"));
      return;
    }
    const whisker = svg("line", {class: "whisker " + row.cls, x1: x(row.lo), y1: y, x2: x(row.hi), y2: y});
    const dot = svg("circle", {class: "dot " + row.cls, cx: x(row.value), cy: y, r: 4.5});
    dot.append(svg("title", {}, row.title));
    root.append(whisker, dot, svg("text", {x: W - right + 6, y: y + 4, class: "dim"}, row.note));
  });
  finish(box, root);
}

function passRatesChart() {
  const box = chartBox("chart-pass-rates", "Pass rate with its 95 % Wilson interval, by source");
  legend(box);
  const rows = [];
  for (const group of GROUPS) {
    RUNS.forEach((run, i) => {
      const f = figuresOf(run, group);
      const [lo, hi] = f.pass_rate_interval || [null, null];
      rows.push({group, label: run.label, value: f.pass_rate, lo, hi, cls: runClass(i), note: pct(f.pass_rate),
        title: `${run.label}, ${group}: ${pct(f.pass_rate)} of ${fmt(f.scored)} [${pct(lo)}, ${pct(hi)}]`});
    });
  }
  intervalChart(box, rows, 0, 1, (v) => (100 * v).toFixed(0) + "%");
}

function pairedChart() {
  if (RUNS.length < 2) return;
  const box = chartBox("chart-paired", `Difference from ${BASELINE.label} on the prompts both scored (paired, 95 %)`);
  const rows = [];
  for (const group of GROUPS) {
    RUNS.forEach((run, i) => {
      if (i === 0) return;
      const p = group === "all" ? run.paired : (run.paired.by_source || {})[group];
      if (!p || p.difference === null || p.difference === undefined) {
        rows.push({group, label: run.label, value: null});
        return;
      }
      rows.push({group, label: run.label, value: p.difference, lo: p.interval[0], hi: p.interval[1],
        cls: runClass(i), note: signed(p.difference) + " pts",
        title: `${run.label} - ${BASELINE.label}, ${group}: ${signed(p.difference)} points ` +
          `[${signed(p.interval[0])}, ${signed(p.interval[1])}] over ${p.prompts} prompts (${p.method})`});
    });
  }
  const reach = Math.max(0.05, ...rows.filter(r => r.value !== null).map(r => Math.max(Math.abs(r.lo), Math.abs(r.hi))));
  intervalChart(box, rows, -reach, reach, (v) => signed(v), 0);
  box.append(el("div", {class: "legend"}, "points of pass rate; " +
    ((RUNS[1].paired || {}).method || "")));
}

function atKChart() {
  const largest = Math.max(0, ...RUNS.map(run => run.figures.at_k.length));
  if (largest < 2) return;
  const box = chartBox("chart-at-k", "pass@k (solid) and pass^k (dashed) against k");
  legend(box);
  const W = chartWidth(box), H = 220, left = 40, right = 12, top = 10, bottom = 30;
  const plotW = W - left - right, plotH = H - top - bottom;
  const x = (k) => left + plotW * (k - 1) / (largest - 1), y = (v) => top + plotH * (1 - v);
  const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, role: "img"});
  for (const v of [0, 0.5, 1]) {
    root.append(svg("line", {class: "axis", x1: left, y1: y(v), x2: W - right, y2: y(v)}));
    root.append(svg("text", {x: left - 6, y: y(v) + 4, "text-anchor": "end", class: "dim"}, (100 * v) + "%"));
  }
  for (let k = 1; k <= largest; k++) {
    if (largest <= 12 || k === 1 || k === largest || k % Math.ceil(largest / 8) === 0) {
      root.append(svg("text", {x: x(k), y: H - 12, "text-anchor": "middle", class: "dim"}, "k=" + k));
    }
  }
  RUNS.forEach((run, i) => {
    for (const [key, dashed] of [["pass_at_k", false], ["pass_hat_k", true]]) {
      const points = run.figures.at_k.map(a => `${x(a.k)},${y(a[key])}`).join(" ");
      root.append(svg("polyline", {class: "line " + runClass(i) + (dashed ? " dashed" : ""), points}));
      for (const a of run.figures.at_k) {
        const dot = svg("circle", {class: "dot " + runClass(i), cx: x(a.k), cy: y(a[key]), r: 3});
        dot.append(svg("title", {}, `${run.label}: ${key === "pass_at_k" ? "pass@" : "pass^"}${a.k} = ${pct(a[key])} over ${a.prompts} prompts`));
        root.append(dot);
      }
    }
  });
  finish(box, root);
}

function costChart() {
  const box = chartBox("chart-cost", "Cost per trajectory against pass rate (95 % interval)");
  legend(box);
  const known = RUNS.map((run, i) => ({run, i, f: run.figures})).filter(p => p.f.cost_per_trajectory !== null && p.f.pass_rate !== null);
  if (!known.length) return empty(box, "no run reports a cost and a pass rate");
  const W = chartWidth(box), H = 250, left = 44, right = 16, top = 12, bottom = 40;
  const plotW = W - left - right, plotH = H - top - bottom;
  const most = Math.max(...known.map(p => p.f.cost_per_trajectory)) * 1.15 || 1;
  const x = (c) => left + plotW * c / most, y = (v) => top + plotH * (1 - v);
  const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, role: "img"});
  for (const v of [0, 0.25, 0.5, 0.75, 1]) {
    root.append(svg("line", {class: "axis", x1: left, y1: y(v), x2: W - right, y2: y(v)}));
    root.append(svg("text", {x: left - 6, y: y(v) + 4, "text-anchor": "end", class: "dim"}, (100 * v) + "%"));
  }
  for (let i = 0; i <= 4; i++) {
    const c = most * i / 4;
    root.append(svg("text", {x: x(c), y: H - 22, "text-anchor": "middle", class: "dim"}, "$" + c.toPrecision(2)));
  }
  root.append(svg("text", {x: left + plotW / 2, y: H - 2, "text-anchor": "middle", class: "dim"}, "cost per trajectory"));
  for (const {run, i, f} of known) {
    const [lo, hi] = f.pass_rate_interval;
    root.append(svg("line", {class: "whisker " + runClass(i), x1: x(f.cost_per_trajectory), y1: y(lo), x2: x(f.cost_per_trajectory), y2: y(hi)}));
    const dot = svg("circle", {class: "dot " + runClass(i), cx: x(f.cost_per_trajectory), cy: y(f.pass_rate), r: 5.5});
    dot.append(svg("title", {}, `${run.label}: ${pct(f.pass_rate)} at $${f.cost_per_trajectory} a trajectory` +
      (f.cost_per_passed === null ? "" : `, $${f.cost_per_passed} a passed one`)));
    root.append(dot, svg("text", {x: x(f.cost_per_trajectory) + 8, y: y(f.pass_rate) - 6}, clipLabel(run.label, 24)));
  }
  finish(box, root);
}

function toolsChart() {
  const box = chartBox("chart-tools", "Tool calls per trajectory, by tool (failed calls in red)");
  legend(box);
  const tools = [...new Set(RUNS.flatMap(run => Object.keys(run.figures.tools)))].sort();
  const rows = [];
  for (const tool of tools) {
    RUNS.forEach((run, i) => {
      const t = run.figures.tools[tool] || {calls: 0, errors: 0, calls_per_trajectory: 0};
      const n = run.figures.trajectories || 1, failed = t.errors / n;
      const note = t.calls ? `${fmt(t.calls_per_trajectory)} · ${pct(t.error_rate)} failed` : "no calls";
      rows.push({label: `${tool} · ${run.label}`, note, parts: [
        {value: t.calls_per_trajectory - failed, cls: runClass(i), title: `${run.label}: ${tool} ${fmt(t.calls)} calls`},
        {value: failed, cls: "bad", title: `${run.label}: ${tool} ${fmt(t.errors)} failed calls`}]});
    });
  }
  barsChart(box, rows);
}

function perTrajectoryChart(id, title, value, format) {
  const box = chartBox(id, title);
  barsChart(box, RUNS.map((run, i) => ({label: run.label, note: format(value(run.figures)), parts: [
    {value: value(run.figures) || 0, cls: runClass(i), title: `${run.label}: ${format(value(run.figures))}`}]})));
}

passRatesChart();
pairedChart();
atKChart();
costChart();
toolsChart();
perTrajectoryChart("chart-turns", "Turns (model calls) per trajectory", (f) => f.turns, fmt);
perTrajectoryChart("chart-tokens", "Tokens per trajectory", (f) => f.tokens.total, fmt);
perTrajectoryChart("chart-latency", "Latency per trajectory (mean)", (f) => f.latency_s.mean, dur);
document.body.dataset.ready = "1";
