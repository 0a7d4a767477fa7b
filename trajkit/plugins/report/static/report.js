// The script of the `trajkit report` page: summary cards, SVG charts and the trajectory browser.
// It reads everything from the page's `report-data` element and fetches nothing: the page's
// Content-Security-Policy forbids it. Loaded after page.js, in the same element.
const DATA = JSON.parse(document.getElementById("report-data").textContent);

// -- summary ------------------------------------------------------------------------------------
function renderSummary() {
  const run = DATA.run, s = DATA.statistics, f = s.failures || {}, tok = s.tokens || {};
  document.getElementById("title").textContent = "trajkit report: " + run.name;
  document.getElementById("subtitle").textContent = [
    run.model && ("model " + run.model), run.distribution && ("distribution " + run.distribution),
    run.dataset_file && ("dataset " + run.dataset_file), "trajkit " + run.trajkit_version,
    "generated " + run.generated].filter(Boolean).join(" · ");
  const cards = [
    ["dataset rows", fmt(s.dataset_rows)], ["done", fmt(s.done)], ["kept", fmt(s.kept), "ok"],
    ["rejected", fmt(s.rejected), s.rejected ? "bad" : ""], ["pending", fmt(s.pending), s.pending ? "warn" : ""],
    ["failing", fmt(f.failing || 0), f.failing ? "bad" : ""], ["failed attempts", fmt(f.failed_attempts || 0)],
    ["reasoning coverage", pct(s.reasoning_coverage)], ["api calls", fmt(s.api_calls)],
    ["tokens", fmt(tok.total)], ["cost", "$" + Number(s.cost || 0).toFixed(4)],
    ["spent", "$" + Number((s.spent || {}).cost || 0).toFixed(4)],
    ["wall time", dur(s.wall_seconds)], ["invocations", fmt(s.invocations)],
    ["invalid tool calls", fmt(s.invalid_tool_calls)],
  ];
  const sc = s.scores || {};
  if (sc.scored) {
    cards.push(["pass rate", pct(sc.pass_rate), sc.pass_rate === 1 ? "ok" : (sc.passed ? "warn" : "bad")],
      ["passed / scored", `${fmt(sc.passed)} / ${fmt(sc.scored)}`]);
  }
  const box = document.getElementById("summary");
  for (const [label, value, cls] of cards) {
    box.append(el("div", {class: "card", "data-key": label},
      el("div", {class: "label"}, label), el("div", {class: "value " + (cls || "")}, value)));
  }
}

// -- charts -------------------------------------------------------------------------------------
// Vertical histogram of integer bins {lo, hi, count}.
function histogramChart(box, bins, unit) {
  if (!bins.length) return empty(box, "no trajectories");
  const W = chartWidth(box), H = 190, left = 40, bottom = 34, top = 10;
  const plotW = W - left - 8, plotH = H - top - bottom;
  const max = Math.max(1, ...bins.map(b => b.count));
  const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, role: "img"});
  root.append(svg("line", {class: "axis", x1: left, y1: top + plotH, x2: W - 8, y2: top + plotH}));
  root.append(svg("text", {x: left - 6, y: top + 8, "text-anchor": "end", class: "dim"}, fmt(max)));
  root.append(svg("text", {x: left - 6, y: top + plotH, "text-anchor": "end", class: "dim"}, "0"));
  const bw = plotW / bins.length;
  const every = Math.ceil(bins.length / 6);
  const range = (b) => b.lo === b.hi ? fmt(b.lo) : `${fmt(b.lo)}–${fmt(b.hi)}`;
  bins.forEach((b, i) => {
    const h = plotH * b.count / max, x = left + i * bw, w = Math.max(1, Math.min(bw - 2, 56));
    if (b.count) {
      const rect = svg("rect", {class: "bar neutral", x: x + (bw - w) / 2, y: top + plotH - h, width: w, height: h, rx: 1});
      rect.append(svg("title", {}, `${range(b)} ${unit}: ${fmt(b.count)} trajectories`));
      root.append(rect);
    }
    if (i % every === 0) {
      const at = b.lo === b.hi ? x + bw / 2 : x;  // a value under its bar, a range's start at its edge
      root.append(svg("text", {x: at, y: top + plotH + 14, "text-anchor": "middle", class: "dim"}, fmt(b.lo)));
    }
  });
  root.append(svg("text", {x: left + plotW / 2, y: H - 4, "text-anchor": "middle", class: "dim"},
    `${unit} per trajectory (trajectories on the vertical axis)`));
  finish(box, root);
}

function renderCharts() {
  const c = DATA.charts;
  const used = c.tools.filter(t => t.success + t.failure > 0);
  const unused = c.tools.length - used.length;
  const tools = chartBox("chart-tools", "Tool calls and success rate", [["ok", "succeeded"], ["bad", "failed"]]);
  barsChart(tools, used.map(t => {
    const n = t.success + t.failure;
    return {label: t.name, note: `${fmt(n)} · ${pct(t.success / n)} ok`, parts: [
      {value: t.success, cls: "ok", title: `${t.name}: ${fmt(t.success)} succeeded`},
      {value: t.failure, cls: "bad", title: `${t.name}: ${fmt(t.failure)} failed`}]};
  }));
  if (unused) tools.append(el("div", {class: "legend"}, `${unused} offered tools never called`));

  histogramChart(chartBox("chart-turns", "Turns (model calls) per trajectory"), c.api_calls, "api calls");
  histogramChart(chartBox("chart-tokens", "Tokens per trajectory"), c.tokens, "tokens");

  const failures = chartBox("chart-failures", "Failed attempts by error class",
    [["bad", "rows still failing"], ["warn", "other failed attempts"]]);
  const attempts = (n) => `${fmt(n)} attempt${n === 1 ? "" : "s"}`;
  barsChart(failures, c.failures.map(f => ({label: f.name, note: attempts(f.attempts), parts: [
    {value: f.failing, cls: "bad", title: `${f.name}: ${fmt(f.failing)} rows still failing`},
    {value: f.attempts - f.failing, cls: "warn", title: `${f.name}: ${fmt(f.attempts - f.failing)} other failed attempts`}]})));
  for (const [cls, message] of Object.entries(c.failure_samples)) {
    failures.append(el("div", {class: "legend"}, `${cls}: ${clipLabel(message, 160)}`));
  }

  barsChart(chartBox("chart-rejections", "Rejections by reason"), c.rejections.map(r => ({
    label: r.name, note: fmt(r.count), parts: [{value: r.count, cls: "bad", title: `${r.name}: ${fmt(r.count)}`}]})), true);
  const rates = c.pass_rates || [];
  if (rates.length) {
    barsChart(chartBox("chart-pass-rates", "Pass rate of the rows' checks, by toolset offered and by source",
      [["ok", "passed"], ["bad", "failed"]]), rates.map(r => ({
      label: `${r.group} ${r.name}`, note: `${pct(r.passed / r.scored)} of ${fmt(r.scored)}`, parts: [
        {value: r.passed, cls: "ok", title: `${r.group} ${r.name}: ${fmt(r.passed)} passed`},
        {value: r.scored - r.passed, cls: "bad", title: `${r.group} ${r.name}: ${fmt(r.scored - r.passed)} failed`}]})));
  }
  const total = c.backends.reduce((a, b) => a + b.count, 0);
  barsChart(chartBox("chart-backends", "Sandbox backends"), c.backends.map(b => ({
    label: b.name, note: `${fmt(b.count)} · ${pct(b.count / total)}`,
    parts: [{value: b.count, cls: "neutral", title: `${b.name}: ${fmt(b.count)} trajectories`}]})));
}

// -- trajectory browser -------------------------------------------------------------------------
const ITEMS = DATA.browse.items;
const state = {query: "", status: "", tool: "", backend: "", selected: null};

function haystack(t) {
  if (t._hay === undefined) {
    const parts = [String(t.index), t.work_id, t.reason || ""];
    for (const turn of t.turns) {
      parts.push(turn.value, turn.reasoning || "", turn.name || "");
      for (const call of turn.tool_calls || []) parts.push(call.name, call.arguments);
    }
    t._hay = parts.join("\n").toLowerCase();
  }
  return t._hay;
}
function firstPrompt(t) {
  const human = t.turns.find(turn => turn.from === "human");
  return human ? human.value : "(no prompt)";
}
function options(select, label, values, counts) {
  select.append(el("option", {value: ""}, `all ${label}`));
  for (const v of values) select.append(el("option", {value: v}, counts ? `${v} (${fmt(counts[v] || 0)})` : v));
}
function matches(t) {
  return (!state.status || t.status === state.status) &&
    (!state.tool || t.tools.includes(state.tool)) &&
    (!state.backend || t.backend === state.backend) &&
    (!state.query || haystack(t).includes(state.query));
}

function renderList() {
  const list = document.getElementById("traj-list");
  list.replaceChildren();
  const shown = ITEMS.filter(matches);
  for (const t of shown) {
    const item = el("li", {"data-index": t.index, "data-status": t.status, title: t.reason},
      el("div", {class: "prompt"}, el("span", {class: "badge " + t.status}, t.status),
        `#${t.index}${t.sample ? " sample " + t.sample : ""} `, firstPrompt(t)),
      el("div", {class: "meta"}, [`${fmt(t.api_calls)} calls`, `${fmt(t.tokens)} tokens`, t.backend,
        t.tools.join(", ") || "no tools", t.score && (t.score.passed ? "check passed" : "check failed")]
        .filter(Boolean).join(" · ")));
    item.addEventListener("click", () => select(t));
    if (t === state.selected) item.classList.add("selected");
    list.append(item);
  }
  document.getElementById("shown-count").textContent = `${fmt(shown.length)} of ${fmt(ITEMS.length)} shown`;
  if (!shown.includes(state.selected)) select(shown[0] || null);
}

function select(t) {
  state.selected = t;
  for (const li of document.querySelectorAll("#traj-list li")) {
    li.classList.toggle("selected", t !== null && li.dataset.index === String(t.index) && li.dataset.status === t.status);
  }
  renderDetail(t);
}

function pretty(text) {
  try { return {text: JSON.stringify(JSON.parse(text), null, 2), ok: true}; }
  catch (e) { return {text, ok: false}; }
}
function renderTurn(turn) {
  const role = turn.from === "tool" ? `tool · ${turn.name || "?"} · ${turn.tool_call_id || ""}` : turn.from;
  const box = el("div", {class: "turn turn-" + turn.from}, el("div", {class: "role"}, role));
  if (turn.reasoning) box.append(el("div", {class: "reasoning"}, turn.reasoning));
  if (turn.from === "system") {
    box.append(el("details", {}, el("summary", {}, clipLabel(turn.value, 90)), el("div", {class: "text"}, turn.value)));
  } else if (turn.from === "tool") {
    const body = turn.value.trim().match(/^[[{]/) ? pretty(turn.value) : {text: turn.value};
    box.append(el("pre", {}, body.text));
  } else if (turn.value) {
    box.append(el("div", {class: "text"}, turn.value));
  }
  for (const call of turn.tool_calls || []) {
    const args = pretty(call.arguments);
    box.append(el("div", {class: "call"},
      el("div", {}, "→ ", el("span", {class: "name"}, call.name), el("span", {class: "muted"}, `  ${call.id}`)),
      args.ok ? null : el("div", {class: "bad-json"}, "arguments are not valid JSON:"),
      el("pre", {class: "args"}, args.text)));
  }
  return box;
}
function renderDetail(t) {
  const detail = document.getElementById("detail");
  detail.replaceChildren();
  if (!t) { detail.append(el("p", {class: "muted"}, "No trajectory matches.")); return; }
  detail.append(el("h2", {}, el("span", {class: "badge " + t.status}, t.status), `prompt #${t.index}`));
  if (t.reason) detail.append(el("div", {class: "reason"}, "rejected: " + t.reason));
  const facts = [["work id", t.work_id], ["completed", t.completed ? "yes" : "no (partial)"],
    ["finish reason", t.finish_reason], ["api calls", fmt(t.api_calls)], ["tokens", fmt(t.tokens)],
    ["cost", t.cost === null ? "not reported" : "$" + Number(t.cost).toFixed(5)], ["duration", dur(t.duration_s)],
    ["backend", t.backend + (t.image ? ` (${t.image})` : "")], ["sample", fmt(t.sample)],
    ["toolsets offered", t.toolsets_offered.join(", ")], ["toolsets used", t.toolsets.join(", ") || "none"],
    ["tools called", t.tools.join(", ") || "none"]];
  if (t.score) {
    facts.push(["score", `${t.score.passed ? "passed" : "failed"} (${t.score.value})`]);
    for (const c of t.score.checks) facts.push([`check: ${c.scorer}`, `${c.passed ? "passed" : "failed"}: ${c.detail}`]);
  }
  for (const [k, v] of Object.entries(t.metadata)) facts.push([k, typeof v === "string" ? v : JSON.stringify(v)]);
  const dl = el("dl");
  for (const [k, v] of facts) dl.append(el("dt", {}, k), el("dd", {}, v));
  detail.append(dl);
  for (const turn of t.turns) detail.append(renderTurn(turn));
  detail.scrollTop = 0;
}

function renderBrowser() {
  const b = DATA.browse, notes = [];
  if (b.embedded < b.total) {
    notes.push(`Showing the first ${fmt(b.embedded)} of ${fmt(b.total)} trajectories (dataset order) ` +
      `to keep this page small; the summary and charts cover all of them. ` +
      `trajkit report --max-conversations N embeds more.`);
  }
  if (b.note) notes.push(b.note);
  if (notes.length) {
    const note = document.getElementById("cap-note");
    note.hidden = false;
    note.textContent = notes.join(" ");
  }
  const statusCounts = {}, tools = new Set(), backends = new Set();
  for (const t of ITEMS) {
    statusCounts[t.status] = (statusCounts[t.status] || 0) + 1;
    t.tools.forEach(x => tools.add(x));
    if (t.backend) backends.add(t.backend);
  }
  options(document.getElementById("status-filter"), "statuses", ["kept", "rejected"], statusCounts);
  options(document.getElementById("tool-filter"), "tools", [...tools].sort());
  options(document.getElementById("backend-filter"), "backends", [...backends].sort());
  const bind = (id, key, event) => document.getElementById(id).addEventListener(event, (e) => {
    state[key] = key === "query" ? e.target.value.trim().toLowerCase() : e.target.value;
    renderList();
  });
  bind("search", "query", "input");
  bind("status-filter", "status", "change");
  bind("tool-filter", "tool", "change");
  bind("backend-filter", "backend", "change");
  renderList();
}

renderSummary();
renderCharts();
renderBrowser();
document.body.dataset.ready = "1";
