// tpuops dashboard: fills the pages from the data API and keeps them live over server-sent events.
// No framework, no CDN: what the page needs and nothing else.
"use strict";

const csrf = document.querySelector('meta[name="tpuops-csrf"]').content;

function progress(text) {
  const el = document.getElementById("progress");
  el.hidden = !text;
  el.textContent = text || "";
}

function say(text, bad) {
  const el = document.getElementById("message");
  el.textContent = text;
  el.className = bad ? "message bad" : "message";
  el.hidden = false;
}

async function getJSON(url) {
  const response = await fetch(url, {credentials: "same-origin"});
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function fmt(value, digits) {
  if (value === null || value === undefined) return "";
  return typeof value === "number" ? value.toFixed(digits) : String(value);
}

function textRow(texts) {
  const tr = document.createElement("tr");
  for (const text of texts) {
    const td = document.createElement("td");
    td.textContent = text;
    tr.appendChild(td);
  }
  return tr;
}

function linkIn(td, href) {
  const a = document.createElement("a");
  a.href = href;
  a.textContent = td.textContent;
  td.replaceChildren(a);
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "";
  if (seconds < 120) return seconds.toFixed(0) + " s";
  if (seconds < 7200) return (seconds / 60).toFixed(0) + " min";
  return (seconds / 3600).toFixed(1) + " h";
}

// -- runs page: rows painted from the index, details fetched in pages, then kept live -------------

function fillRow(tr, row) {
  const cells = tr.children;
  cells[1].textContent = row.sweep || "";
  cells[2].textContent = row.outcome ? row.phase + " (" + row.outcome + ")" : row.phase;
  cells[2].title = row.damaged || "";
  cells[3].textContent = row.total_steps ? row.step + " / " + row.total_steps : row.step;
  cells[4].textContent = fmt(row.examples_per_sec, 0);
  cells[5].textContent = fmt(row.checkpoint, 0);
  cells[6].textContent = row.goodput === null ? "" : (row.goodput * 100).toFixed(0) + " %";
  cells[7].textContent = fmt(row.usd, 4);
  cells[8].textContent = row.preemptions;
  cells[9].textContent = age(row.age_s);
  tr.dataset.phase = row.phase;
  tr.dataset.sweep = row.sweep || "";
  tr.dataset.step = row.step;
  tr.classList.remove("pending");
}

function applyFilters() {
  const sweep = document.getElementById("filter-sweep").value.trim();
  const phase = document.getElementById("filter-phase").value.trim();
  let shown = 0;
  for (const tr of document.querySelectorAll("#runs tbody tr")) {
    const ok = (!sweep || tr.dataset.sweep === sweep) && (!phase || tr.dataset.phase === phase);
    tr.hidden = !ok;
    if (ok) shown += 1;
  }
  document.getElementById("count").textContent = shown;
}

async function loadRows(ids) {
  const table = document.getElementById("runs");
  const size = Number(table.dataset.pageRows);
  for (let i = 0; i < ids.length; i += size) {
    progress("loading runs " + Math.min(i + size, ids.length) + " / " + ids.length + "…");
    const rows = await getJSON("/data/runs?ids=" + encodeURIComponent(ids.slice(i, i + size).join(",")));
    for (const row of rows) {
      const tr = table.querySelector('tr[data-run="' + CSS.escape(row.run_id) + '"]');
      if (tr) fillRow(tr, row);
    }
  }
  progress("");
  applyFilters();
}

function runsPage() {
  const ids = Array.from(document.querySelectorAll("#runs tbody tr")).map((tr) => tr.dataset.run);
  loadRows(ids).catch((err) => say(err.message, true));
  for (const id of ["filter-sweep", "filter-phase"]) document.getElementById(id).addEventListener("input", applyFilters);
  const live = new EventSource("/live/runs");
  live.addEventListener("runs", (event) => {
    const changed = JSON.parse(event.data).changed;
    const known = changed.filter((id) => document.querySelector('tr[data-run="' + CSS.escape(id) + '"]'));
    if (known.length < changed.length) { location.reload(); return; }  // a new run: the index grew
    loadRows(known).catch((err) => say(err.message, true));
  });
}

// -- one run: the panel (timeline, goodput, events) and the live log ---------------------------

async function loadPanel(runId) {
  progress("reading the run, its ledger intervals and events…");
  try {
    const panel = await getJSON("/data/runs/" + encodeURIComponent(runId) + "/panel");
    const row = panel.row;
    document.getElementById("run-phase").textContent = (row.outcome ? row.phase + " (" + row.outcome + ")" : row.phase) +
      (row.damaged ? ": " + row.damaged : "");
    document.getElementById("run-summary").textContent = "step " + row.step + (row.total_steps ? " / " + row.total_steps : "") +
      " · " + fmt(row.examples_per_sec, 0) + " examples/s · checkpoint " + fmt(row.checkpoint, 0) +
      " · preemptions " + row.preemptions + " · cost $" + fmt(panel.cost_usd, 4);
    const timeline = document.getElementById("timeline");
    timeline.classList.remove("loading");
    timeline.innerHTML = panel.timeline;  // drawn and escaped server-side (tpuops/dashboard/svg.py)
    document.getElementById("goodput").innerHTML = panel.goodput;
    document.getElementById("goodput-text").textContent = panel.goodput_text;
    document.getElementById("recoveries").textContent = panel.recoveries.length ?
      "preemption to first new step: " + panel.recoveries.map((s) => s + " s").join(", ") : "";
    const body = document.querySelector("#events tbody");
    body.replaceChildren(...panel.events.map((e) => textRow([e.at, e.kind, e.message])));
    document.querySelector("#notices tbody").replaceChildren(
      ...panel.notices.map((n) => textRow([n.at, n.kind, n.title, n.deliveries])));
  } finally {
    progress("");
  }
}

function runPage() {
  const runId = document.getElementById("run").dataset.run;
  loadPanel(runId).catch((err) => say(err.message, true));
  const log = document.getElementById("log");
  const live = new EventSource("/live/runs/" + encodeURIComponent(runId));
  live.addEventListener("open", () => { log.textContent = ""; });  // every stream starts from the first chunk
  live.addEventListener("log", (event) => {
    const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    log.append(JSON.parse(event.data).join("\n") + "\n");
    if (atBottom) log.scrollTop = log.scrollHeight;
  });
  live.addEventListener("changed", () => loadPanel(runId).catch((err) => say(err.message, true)));
}

// -- nodes: the listing again every NODES_EVERY_MS (one ListNodes per zone: the cloud has no push) ----------

const NODES_EVERY_MS = 15000;

// A slice's hosts, and which of its workers are unhealthy ("4 (w2 down)"): the same cell as `tpuops status`.
function hostsCell(node) {
  const down = node.unhealthy_workers || [];
  return String(node.hosts) + (down.length ? " (" + down.map((w) => "w" + w).join(", ") + " down)" : "");
}

function nodeRow(node) {
  const tr = textRow([node.name, node.zone, node.accelerator, hostsCell(node), node.capacity, node.state,
    (node.run_id || "") + (node.orphan ? " (orphan)" : "") + (node.damaged ? " (damaged)" : ""), age(node.age_s)]);
  tr.dataset.node = node.name;
  const last = document.createElement("td");
  const old = document.querySelector('#nodes tr[data-node="' + CSS.escape(node.name) + '"] button[data-action]');
  if (old) last.appendChild(old);  // the orphan's guarded button, kept with its handler
  tr.appendChild(last);
  return tr;
}

function nodesPage() {
  setInterval(async () => {
    try {
      const nodes = await getJSON("/data/nodes");
      document.querySelector("#nodes tbody").replaceChildren(...nodes.map(nodeRow));
    } catch (err) {
      say(err.message, true);
    }
  }, NODES_EVERY_MS);
}

// -- sweeps: the shell first, then the list or the trials table from the data API (a sweep's status
// reads every trial's run and ledger intervals, so the page says so while it waits) ---------------

function wideRow(tbody, text) {
  const tr = textRow([text]);
  tr.cells[0].colSpan = tbody.closest("table").tHead.rows[0].cells.length;
  return tr;
}

async function fillTable(tbody, url, what, toRows, empty) {
  progress("reading " + what + "…");
  try {
    const rows = toRows(await getJSON(url));
    tbody.replaceChildren(...(rows.length ? rows : [wideRow(tbody, empty)]));
  } catch (err) {
    tbody.replaceChildren(wideRow(tbody, err.message));
    throw err;
  } finally {
    progress("");
  }
}

function sweepRow(s) {
  const tr = textRow([s.sweep, s.phase, s.outcome || "", s.last_pass || "", "Optuna"]);
  tr.dataset.sweep = s.sweep;
  linkIn(tr.cells[0], "/sweeps/" + encodeURIComponent(s.sweep));
  linkIn(tr.cells[4], "/sweeps/" + encodeURIComponent(s.sweep) + "/optuna");
  return tr;
}

function sweepsPage() {
  fillTable(document.querySelector("#sweeps tbody"), "/data/sweeps", "the sweeps",
    (sweeps) => sweeps.map(sweepRow), "no sweeps in this store").catch((err) => say(err.message, true));
}

function significant(value) {
  return value === null || value === undefined ? "" : String(Number(value.toPrecision(5)));
}

function trialRow(t) {
  const params = Object.entries(t.params).map(([k, v]) => k + "=" + v).join(" ");
  const tr = textRow([t.number, t.run_id, params, t.state, significant(t.value), t.preemptions,
    fmt(t.cost_usd, 4), fmt(t.lost_usd, 4)]);
  tr.dataset.trial = t.number;
  linkIn(tr.cells[1], "/runs/" + encodeURIComponent(t.run_id));
  return tr;
}

function sweepPage() {
  const name = document.getElementById("sweep").dataset.sweep;
  fillTable(document.querySelector("#trials tbody"), "/data/sweeps/" + encodeURIComponent(name),
    "the trials, their runs and ledger intervals", (sweep) => {
      document.getElementById("sweep-phase").textContent = sweep.phase;
      document.getElementById("sweep-summary").textContent = sweep.metric + " (" + sweep.direction + ") · " +
        sweep.trials.length + " of " + sweep.wanted + " trials · spent $" + fmt(sweep.spent_usd, 4) +
        (sweep.budget_usd ? " of $" + fmt(sweep.budget_usd, 2) : "");
      return sweep.trials.map(trialRow);
    }, "no trials yet").catch((err) => say(err.message, true));
}

// -- guarded actions: confirm, then POST with the CSRF header and the target repeated -----------

async function act(button) {
  const target = button.dataset.confirm;
  if (!window.confirm(button.textContent + ": " + target + "?")) return;
  button.disabled = true;
  try {
    const response = await fetch(button.dataset.action, {
      method: "POST", credentials: "same-origin",
      headers: {"Content-Type": "application/json", "X-Tpuops-Csrf": csrf},
      body: JSON.stringify({confirm: target}),
    });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    say(body.done, false);
  } catch (err) {
    say(err.message, true);
  } finally {
    button.disabled = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  for (const button of document.querySelectorAll("button[data-action]")) button.addEventListener("click", () => act(button));
  const page = document.body.dataset.page;
  if (page === "runs") runsPage();
  if (page === "run") runPage();
  if (page === "nodes") nodesPage();
  if (page === "sweeps") sweepsPage();
  if (page === "sweep") sweepPage();
});
