// AutoCompress dashboard: plain JavaScript, no build step. Talks to the
// daemon's /v1 API; live progress comes from the job's SSE stream.
"use strict";
const $ = (s) => document.querySelector(s);
const STAGES = ["load", "calibrate", "profile", "search", "prune", "evaluate", "export"];
// the bar shown: STAGES, with "distill" after prune when the job distils (its stage events count one more)
// and "puzzle" (spec puzzle.enabled) after it
let stages = STAGES;
function drawStages() { $("#stages").innerHTML = stages.map((s) => `<span>${s}</span>`).join(""); }
let source = null;

function token() { return localStorage.getItem("ac_token") || ""; }
function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (token()) h["Authorization"] = "Bearer " + token();
  return h;
}
async function api(method, path, body) {
  const r = await fetch(path, { method, headers: headers(body ? { "Content-Type": "application/json" } : {}), body: body ? JSON.stringify(body) : undefined });
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = text; }
  return { status: r.status, data };
}
function esc(s) { return String(s == null ? "" : s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c])); }
function fmtTime(t) { return t ? new Date(t * 1000).toLocaleString() : ""; }

// the jobs ticked for comparison: kept across the list's refreshes (every 3 s), which redraw its rows
const picked = new Set();

async function loadJobs() {
  const r = await api("GET", "/v1/jobs?limit=1000");
  const tb = $("#jobs tbody");
  if (r.status !== 200) { tb.innerHTML = `<tr><td colspan="8">${esc(r.data && r.data.error ? r.data.error.message : r.status)}</td></tr>`; return; }
  tb.innerHTML = r.data.jobs.slice().reverse().map((j) =>
    `<tr class="job" data-id="${j.id}"><td><input type="checkbox" class="pick" value="${j.id}"${picked.has(String(j.id)) ? " checked" : ""} aria-label="compare job ${j.id}"></td><td>${j.id}</td><td>${esc(j.name)}</td><td><span class="state ${j.state}">${j.state}</span></td>` +
    `<td>${esc(j.device)}</td><td>${esc(j.reason)}</td><td>${fmtTime(j.created_at)}</td><td><a href="#job/${j.id}">open</a></td></tr>`).join("");
  tb.querySelectorAll("tr.job").forEach((tr) => tr.addEventListener("click", (e) => { if (!e.target.classList.contains("pick")) location.hash = "job/" + tr.dataset.id; }));
  tb.querySelectorAll("input.pick").forEach((b) => b.addEventListener("change", () => { if (b.checked) picked.add(b.value); else picked.delete(b.value); }));
}

// the executor jobs go to (GET /v1/config): "local" or "slurm" with its partition; asked again after a restart
let executorText = "", lastUptime = Infinity;
async function executorLabel(uptime) {
  if (executorText && uptime >= lastUptime) return executorText;
  lastUptime = uptime;
  const c = await api("GET", "/v1/config");
  if (c.status !== 200 || !c.data.executor) return "";
  const p = c.data.slurm && c.data.slurm.partition;
  executorText = ` · executor ${c.data.executor}` + (p ? ` (partition ${p})` : "");
  return executorText;
}

async function health() {
  try {
    const r = await api("GET", "/healthz");
    $("#health").textContent = r.status === 200 ?
      `v${r.data.version} · up ${Math.round(r.data.uptime_s)} s` + await executorLabel(r.data.uptime_s) : "unhealthy";
  } catch (e) { $("#health").textContent = "unreachable"; }
}

function exampleSpec() {
  return JSON.stringify({
    name: "tiny-h100-tpot",
    model: "/path/to/model",
    calibration: "/path/to/calib.txt",
    heldout: "/path/to/heldout.txt",
    target: { device: "H100", engine: { weights_dtype: "bf16" }, workload: { batch: 1, prompt_len: 2048, gen_len: 256 } },
    constraints: { max_tpot_ms: 5 },
    method: "autocompress",
    search: { steps: 300, seed: 0 },
  }, null, 2);
}

async function submit(ev) {
  ev.preventDefault();
  const msg = $("#submit-msg");
  let spec;
  try { spec = JSON.parse($("#spec").value); } catch (e) { msg.className = "err"; msg.textContent = "not valid JSON: " + e.message; return; }
  const r = await api("POST", "/v1/jobs", spec);
  if (r.status === 201) {
    msg.className = ""; msg.textContent = `job ${r.data.id} queued`;
    await loadJobs();
    location.hash = "job/" + r.data.id;
  } else {
    msg.className = "err";
    msg.textContent = r.data && r.data.error ? `${r.status} ${r.data.error.code}: ${r.data.error.message}` : "HTTP " + r.status;
  }
}

// ---- job page ----
const series = { loss: [], metric: [], limit: null, metricName: "", distill: {} };

function drawLine(canvas, pts, color, limit, label) {
  const c = canvas.getContext("2d"), W = canvas.width, H = canvas.height, pad = 34;
  c.clearRect(0, 0, W, H);
  c.strokeStyle = "#9ca3af"; c.strokeRect(pad, 8, W - pad - 8, H - pad - 8);
  if (!pts.length) return;
  const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]).concat(limit != null ? [limit] : []);
  const x0 = Math.min(...xs), x1 = Math.max(...xs) || 1, y0 = Math.min(0, ...ys), y1 = Math.max(...ys) * 1.1 || 1;
  const X = (x) => pad + (x - x0) / ((x1 - x0) || 1) * (W - pad - 8), Y = (y) => H - pad - (y - y0) / ((y1 - y0) || 1) * (H - pad - 16);
  c.strokeStyle = color; c.lineWidth = 2; c.beginPath();
  pts.forEach((p, i) => (i ? c.lineTo(X(p[0]), Y(p[1])) : c.moveTo(X(p[0]), Y(p[1]))));
  c.stroke();
  if (limit != null) { c.strokeStyle = "#dc2626"; c.setLineDash([5, 4]); c.beginPath(); c.moveTo(pad, Y(limit)); c.lineTo(W - 8, Y(limit)); c.stroke(); c.setLineDash([]); }
  c.fillStyle = "#374151"; c.font = "11px sans-serif";
  c.fillText(y1.toPrecision(3), 2, 16); c.fillText(y0.toPrecision(3), 2, H - pad);
  c.fillText(`step ${x1}`, W - 60, H - 12);
  if (label) c.fillText(label, pad + 4, H - 12);
}

/* A hybrid (nemotron_h) layer has one mixer, named by its type: one bar, its
 * width kept against the base's (Mamba heads, KV heads, MLP width or
 * experts); a removed layer none. */
function hybridLayer(l, b, i) {
  const t = l.type, k = {mamba: ["ssm_heads", "Mamba heads"], attention: ["kv_heads", "KV heads"],
    mlp: ["ffn", "MLP width"], moe: ["experts", "experts"]}[t === "removed" ? b.type : t];
  const v = t === "removed" ? 0 : +(l[k[0]] || 0), of = +(b[k[0]] || 0);
  const title = t === "removed" ? `${b.type} layer removed` : `${k[1]} ${v.toFixed(0)} of ${of}`;
  return `<div class="layer" data-layer="${i}" title="${title}"><div class="bars"><div class="bar ${t === "mamba" || b.type === "mamba" ? "ssm" : t === "attention" ? "kv" : "ffn"}" ` +
    `style="height:${Math.round(100 * (of ? v / of : 0))}px" title="${title}"></div></div>L${i} ${{mamba: "M", attention: "*", mlp: "-", moe: "E"}[b.type] || ""}</div>`;
}

function drawArch(layers, base) {
  const el = $("#arch");
  el.innerHTML = layers.map((l, i) => {
    const b = base && base[i] ? base[i] : null;
    if (b && b.type && l.type) return hybridLayer(l, b, i);
    // a mixture-of-experts layer: its FFN bar is the experts kept (of the base's)
    const moe = b && b.experts, kv = b ? l.kv_heads / b.kv_heads : l.kv_frac,
      ff = moe ? (l.experts || 0) / b.experts : b ? l.ffn / b.ffn : l.ffn_frac,
      ftitle = moe ? `experts ${(+(l.experts || 0)).toFixed(1)} of ${b.experts}` : `FFN ${(+l.ffn).toFixed(0)}`;
    return `<div class="layer" data-layer="${i}"><div class="bars"><div class="bar kv" style="height:${Math.round(100 * (kv || 0))}px" title="KV heads ${(+l.kv_heads).toFixed(1)}"></div>` +
      `<div class="bar ffn" style="height:${Math.round(100 * (ff || 0))}px" title="${ftitle}"></div></div>L${i}</div>`;
  }).join("");
}

let baseLayers = null;
const archHistory = []; // [step, layers] of every search event: the architecture as it evolves

/* A heat map of the search: one column per event, per layer two rows
 * (KV heads kept, FFN width kept, expected values under the gates for
 * dnas), dark = kept. */
function drawArchHistory(cv, hist, base) {
  const c = cv.getContext("2d"), W = cv.width, H = cv.height, L = base.length, n = hist.length;
  c.clearRect(0, 0, W, H);
  if (!n) return;
  const left = 34, rowH = (H - 16) / (2 * L), colW = (W - left) / n;
  c.font = "10px sans-serif"; c.fillStyle = "#374151";
  hist.forEach(([, layers], j) => layers.forEach((l, i) => {
    const b = base[i] || {}, kv = b.kv_heads ? l.kv_heads / b.kv_heads : 0,
      ff = b.experts ? (l.experts || 0) / b.experts : b.ffn ? l.ffn / b.ffn : 0;
    [kv, ff].forEach((v, r) => {
      const g = Math.round(235 - 200 * Math.max(0, Math.min(1, v)));
      c.fillStyle = r ? `rgb(250,${g},${Math.round(g * 0.6)})` : `rgb(${Math.round(g * 0.6)},${g},250)`;
      c.fillRect(left + j * colW, (2 * i + r) * rowH, Math.ceil(colW), Math.ceil(rowH) - 1);
    });
  }));
  c.fillStyle = "#374151";
  for (let i = 0; i < L; i++) c.fillText(`L${i}`, 2, (2 * i + 1.3) * rowH);
  c.fillText(`step ${hist[0][0]}`, left, H - 3);
  c.fillText(`step ${hist[n - 1][0]}`, W - 60, H - 3);
}

function onEvent(kind, data) {
  const pre = $("#events");
  pre.textContent += `${kind}: ${JSON.stringify(data).slice(0, 300)}\n`;
  pre.scrollTop = pre.scrollHeight;
  if (kind === "stage") {
    // the optional stages between prune and evaluate: both when the events count two more; one more is
    // distill until a puzzle stage shows it was the puzzle arm's
    const extra = data.of - STAGES.length;
    let want = stages;
    if (extra === 2) want = [...STAGES.slice(0, 5), "distill", "puzzle", ...STAGES.slice(5)];
    else if (extra === 1 && stages === STAGES) want = [...STAGES.slice(0, 5), data.stage === "puzzle" ? "puzzle" : "distill", ...STAGES.slice(5)];
    if (data.stage === "puzzle" && !want.includes("puzzle")) want = want.map((x) => (x === "distill" ? "puzzle" : x));
    if (want.join() !== stages.join()) { stages = want; drawStages(); }
    const idx = stages.indexOf(data.stage);
    document.querySelectorAll("#stages span").forEach((s, i) => { s.className = i < idx ? "done" : i === idx ? "now" : ""; });
  } else if (kind === "log" && data.architecture) {
    baseLayers = data.architecture.layers;
  } else if (kind === "search" && (data.phase === "autocompress" || data.phase === "dnas")) {
    series.loss.push([data.step, data.phase === "dnas" ? data.task_loss : data.loss]);
    const names = Object.keys(data.metrics || {});
    const pick = names.find((n) => n.endsWith("_ms")) || names[0];
    if (pick) {
      series.metricName = pick;
      series.metric.push([data.step, data.metrics[pick].value]);
      series.limit = data.metrics[pick].limit;
    }
    drawLine($("#loss-chart"), series.loss, "#2563eb", null, data.phase === "dnas" ? "distillation KL (gated model)" : "lagrangian");
    drawLine($("#metric-chart"), series.metric, "#059669", series.limit, pick);
    const row = AC_CONSTRAINTS.find((c) => c.metric === pick);
    $("#metric-caption").textContent = `Predicted ${pick}${row ? ` (${row.unit})` : ""} vs limit (dashed)`;
    if (data.architecture && baseLayers) {
      drawArch(data.architecture.layers, baseLayers);
      archHistory.push([data.step, data.architecture.layers]);
      $("#arch-history-fig").hidden = false;
      drawArchHistory($("#arch-history"), archHistory, baseLayers);
    }
    if (data.multipliers) $("#metric-caption").textContent += " · multipliers " +
      Object.entries(data.multipliers).map(([k, v]) => `${k} ${(+v).toFixed(3)}`).join(", ");
  } else if (kind === "distill") {
    // one curve per arm (minitron, autocompress); the arm being distilled is drawn
    (series.distill[data.arm] = series.distill[data.arm] || []).push([data.step, data.loss]);
    $("#distill-fig").hidden = false;
    $("#distill-caption").textContent = `Distillation loss (${data.arm}, step ${data.step} of ${data.steps})`;
    drawLine($("#distill-chart"), series.distill[data.arm], "#9333ea", null, data.arm + " KL");
  } else if (kind === "slurm") {
    showExecutor("slurm", data);
  } else if (kind === "error" || kind === "infeasible") {
    $("#job-error").hidden = false;
    $("#job-error").textContent = kind === "error" ? `Failed: ${data.message}` :
      `Infeasible: the limits cannot be met; closest reachable ${JSON.stringify(data.closest)}`;
  } else if (kind === "result") {
    showResult(data);
  } else if (kind === "state") {
    $("#job-state").textContent = data.state; $("#job-state").className = "state " + data.state;
    $("#cancel").hidden = ["succeeded", "failed", "cancelled"].includes(data.state);
    if (data.reason) $("#job-reason").textContent = data.reason;
    if (["succeeded", "failed", "cancelled"].includes(data.state)) {
      document.querySelectorAll("#stages span").forEach((s) => { if (data.state === "succeeded") s.className = "done"; });
    }
  }
}

// A limit's verdict for a figure: "met" or "missed" (kind max: value <= limit; min: value >= limit).
function verdict(c, v) { return v == null ? null : (c.kind === "min" ? v >= c.limit : v <= c.limit) ? "met" : "missed"; }

function showResult(r) {
  const pick = r[r.chosen];
  if (pick && pick.architecture) {
    drawArch(pick.architecture.layers, r.model.architecture.layers);
    const moe = pick.architecture.top_k != null;
    $("#arch-caption").textContent = `Result (${r.chosen}): kept fraction of KV heads (blue) and ${moe ? "experts (orange, in a mixture-of-experts layer)" : "FFN width (orange)"} per layer; hidden ${pick.architecture.hidden}/${r.model.architecture.hidden}` +
      (moe ? `; top-k ${pick.architecture.top_k}/${r.model.architecture.top_k}.` : ".");
  }
  // the puzzle arm (spec puzzle.enabled) is a third pruned arm, reported for comparison
  const arms = ["baseline", "minitron", "autocompress", ...(r.puzzle ? ["puzzle"] : [])], pruned = arms.slice(1);
  const f = (x, d = 2) => (x == null ? "—" : (+x).toFixed(d));
  const get = (k) => r[k] || {};
  // rows of cells; a cell is text or {text, cls}
  const rows = [["", ...arms.map((a) => (a === r.chosen ? { text: a + " (chosen, exported)", cls: "chosen" } : a))]];
  rows.push(["perplexity", f(r.baseline.perplexity), ...pruned.map((a) => f(get(a).perplexity))]);
  if (pruned.some((a) => get(a).distill)) {
    rows.push(["perplexity before distillation", "", ...pruned.map((a) => f(get(a).perplexity_pruned))]);
    const d = (k) => (get(k).distill ? `${get(k).distill.tokens} tok, loss ${f(get(k).distill.loss_first, 3)} → ${f(get(k).distill.loss_last, 3)}` : "—");
    rows.push(["distillation", "", ...pruned.map(d)]);
  }
  // eval.tasks (docs/tasks.md): accuracy per task, acc_norm and the stderr of acc; before distillation in brackets
  for (const t of Object.keys(r.baseline.tasks || {})) {
    const acc = (k) => {
      const x = (get(k).tasks || {})[t], y = (get(k).tasks_pruned || {})[t];
      return x ? `${f(x.acc, 3)} ± ${f(x.stderr, 3)} (norm ${f(x.acc_norm, 3)})` + (y ? ` [${f(y.acc, 3)}]` : "") : "—";
    };
    rows.push([`task ${t} acc (n ${r.baseline.tasks[t].n})`, ...arms.map(acc)]);
  }
  // every limit the job set: each arm's predicted figure, met or missed
  const lim = get(r.chosen).constraints || get("minitron").constraints || {};
  for (const [name, c] of Object.entries(lim)) {
    const row = AC_CONSTRAINTS.find((x) => x.metric === name) || {};
    const cells = arms.map((a) => {
      const ac = (get(a).constraints || {})[name];
      const v = ac ? ac.value : a === "baseline" ? r.baseline.predicted[name] : null;
      const ok = ac ? (ac.met ? "met" : "missed") : verdict(c, v);
      return v == null ? "—" : { text: `${f(v, row.unit === "parameters" ? 0 : 3)} ${ok}`, cls: ok };
    });
    rows.push([`limit ${name} ${c.kind === "min" ? "≥" : "≤"} ${c.limit} (predicted)`, ...cells]);
  }
  // a mixture-of-experts model: each arm's top-k and the experts (and their width) kept per layer, as the bars show
  // heads and FFN width; the top-k choices the search tried (report.search.top_k_choices) in the top-k row's title
  const ma = (r.model || {}).architecture || {};
  if (ma.top_k != null) {
    const archOf = (a) => (a === "baseline" ? ma : (get(a).architecture || null));
    const per = (a, k) => { const x = archOf(a); return x ? x.layers.map((L) => (L[k] == null ? "—" : L[k])).join(" ") : "—"; };
    const tried = ((r.search || {}).top_k_choices || []).map((c) => `k=${c.top_k}${c.feasible ? "" : " (infeasible)"}`).join(", ");
    rows.push([tried ? `top-k (experts per token; search tried ${tried})` : "top-k (experts per token)",
      ...arms.map((a) => (archOf(a) ? String(archOf(a).top_k) : "—"))]);
    rows.push(["experts kept per layer", ...arms.map((a) => per(a, "experts"))]);
    rows.push(["expert FFN width per layer", ...arms.map((a) => per(a, "expert_ffn"))]);
  }
  rows.push(["all limits met", "", ...pruned.map((a) => (r[a] ? { text: r[a].feasible ? "yes" : "no", cls: r[a].feasible ? "met" : "missed" } : "—"))]);
  // one row per figure a limit can bound (the constraint table, constraints.js)
  for (const c of AC_CONSTRAINTS) {
    const m = c.metric, d = c.unit === "parameters" ? 0 : 3;
    rows.push([`${m} (pred., ${c.unit})`, f(r.baseline.predicted[m], d), ...pruned.map((a) => f((get(a).predicted || {})[m], d))]);
  }
  const ml = r.measured_local;
  if (ml && ml.baseline) { // measured_local names each arm it timed: baseline, minitron, autocompress
    const t = (a, k) => (ml[a] ? f(ml[a][k], 3) : "—");
    for (const k of ["ttft_ms", "tpot_ms"])
      rows.push([`${k} measured on this CPU (${ml.weights_dtype})`, t("baseline", k), t("minitron", k), t("autocompress", k), ...(r.puzzle ? ["—"] : [])]);
  }
  $("#summary tbody").innerHTML = rows.map((row, i) => `<tr>${row.map((c) => {
    const t = typeof c === "object" && c ? c : { text: c, cls: "" };
    return i ? `<td class="${t.cls}">${esc(t.text)}</td>` : `<th class="${t.cls}">${esc(t.text)}</th>`;
  }).join("")}</tr>`).join("");
  // the choice, stated: and when the arm not exported met every limit with a lower perplexity, that too
  const other = r.chosen === "autocompress" ? "minitron" : "autocompress", o = get(other), c = get(r.chosen);
  let note = `Exported: the ${r.chosen} arm` + (r.chosen_reason ? ` (${r.chosen_reason}).` : ".");
  if (o.feasible && o.perplexity < c.perplexity)
    note += ` The ${other} arm also met every limit with a lower perplexity (${f(o.perplexity)} vs ${f(c.perplexity)}).`;
  $("#choice").textContent = note;
}

// ---- comparison of jobs: every arm side by side ----
const ARMS = ["baseline", "minitron", "autocompress", "puzzle"];

/* One column per arm of each succeeded job (a job that did not succeed: one column with its state and reason).
 * A column's limits: the arm's own verdicts from the report (the base's computed from its predicted figure),
 * against its job's limits; feasible only when it met every one. */
function compareColumns(jobs) {
  const cols = [];
  for (const x of jobs) {
    const r = x.report;
    if (!r) { cols.push({ x, arm: null }); continue; }
    const defs = (r[r.chosen] || r.minitron || r.autocompress || {}).constraints || {};
    for (const a of ARMS) {
      if (!r[a]) continue;
      const lim = {};
      for (const [name, c] of Object.entries(defs)) {
        const ac = (r[a].constraints || {})[name];
        const v = ac ? ac.value : (r[a].predicted || {})[name];
        lim[name] = { c, v, ok: ac ? (ac.met ? "met" : "missed") : verdict(c, v) };
      }
      const feasible = a === "baseline" ? Object.values(lim).every((l) => l.ok === "met") : !!r[a].feasible;
      cols.push({ x, arm: a, r, lim, feasible, ppl: r[a].perplexity });
    }
  }
  return cols;
}

async function openCompare(ids) {
  if (source) { source.close(); source = null; }
  $("#list-view").hidden = true; $("#job-view").hidden = true; $("#compare-view").hidden = false;
  $("#compare-title").textContent = "Compare jobs " + ids.join(", ");
  const jobs = await Promise.all(ids.map(async (id) => {
    const j = await api("GET", "/v1/jobs/" + id);
    const res = j.status === 200 && j.data.state === "succeeded" ? await api("GET", `/v1/jobs/${id}/result`) : null;
    return { id, job: j.status === 200 ? j.data : null, error: j.status === 200 ? null : (j.data && j.data.error ? j.data.error.message : "HTTP " + j.status),
      report: res && res.status === 200 ? res.data : null };
  }));
  const cols = compareColumns(jobs);
  const f = (x, d = 3) => (x == null ? "—" : (+x).toFixed(d));
  // the best perplexity among arms that met every limit of their job (the base included when it did)
  const ok = cols.filter((c) => c.arm && c.feasible && c.ppl != null);
  const best = ok.length ? Math.min(...ok.map((c) => c.ppl)) : null;
  const head1 = `<tr><th class=""></th>${cols.map((c) => `<th class="job">job ${c.x.id}${c.x.job && c.x.job.name ? " " + esc(c.x.job.name) : ""}</th>`).join("")}</tr>`;
  const head2 = `<tr><th class=""></th>${cols.map((c) => !c.arm ? `<th class="">${esc(c.x.job ? c.x.job.state : "unknown")}</th>` :
    `<th class="${c.arm === c.r.chosen ? "chosen" : ""}">${c.arm}${c.arm === c.r.chosen ? " (chosen, exported)" : ""}</th>`).join("")}</tr>`;
  $("#compare thead").innerHTML = head1 + head2;
  const rows = [];
  const cell = (text, cls = "") => ({ text, cls });
  rows.push(["target", ...cols.map((c) => (c.arm ? cell(`${c.r.target.device_name} · batch ${c.r.target.workload.batch}`) : cell(c.x.error || `${c.x.job.state}: ${c.x.job.reason || ""}`, c.x.job && c.x.job.state === "failed" ? "missed" : "")))]);
  const names = [...new Set(cols.flatMap((c) => (c.lim ? Object.keys(c.lim) : [])))];
  for (const n of names) {
    const row = AC_CONSTRAINTS.find((x) => x.metric === n) || {};
    rows.push([`limit ${n}`, ...cols.map((c) => {
      const l = c.lim && c.lim[n];
      if (!l) return cell(c.arm ? "no such limit" : "—");
      return cell(`${f(l.v, row.unit === "parameters" ? 0 : 3)} ${l.c.kind === "min" ? "≥" : "≤"} ${l.c.limit} ${l.ok}`, l.ok);
    })]);
  }
  rows.push(["all limits met", ...cols.map((c) => (c.arm ? cell(c.feasible ? "yes" : "no", c.feasible ? "met" : "missed") : cell("—")))]);
  rows.push(["perplexity", ...cols.map((c) => {
    if (!c.arm || c.ppl == null) return cell("—");
    if (!c.feasible) return cell(`${f(c.ppl)} (missed a limit)`, "missed");
    return c.ppl === best ? cell(`${f(c.ppl)} (best that met every limit)`, "best") : cell(f(c.ppl));
  })]);
  // eval.tasks: a row per task any job scored (acc ± its stderr, acc_norm; "not scored" where the job had no such task)
  const tasks = [...new Set(cols.flatMap((c) => (c.arm ? Object.keys(c.r.baseline.tasks || {}) : [])))];
  for (const t of tasks)
    rows.push([`task ${t} acc`, ...cols.map((c) => {
      const x = c.arm && (c.r[c.arm].tasks || {})[t];
      return cell(x ? `${f(x.acc)} ± ${f(x.stderr)} (norm ${f(x.acc_norm)}, n ${x.n})` : c.arm ? "not scored" : "—");
    })]);
  for (const m of ["params", "ttft_ms", "tpot_ms", "tokens_per_s", "memory_gib"])
    rows.push([`${m} (predicted)`, ...cols.map((c) => cell(c.arm ? f((c.r[c.arm].predicted || {})[m], m === "params" ? 0 : 3) : "—"))]);
  $("#compare tbody").innerHTML = rows.map((row) => `<tr>${row.map((c, i) => (i ? `<td class="${c.cls}">${esc(c.text)}</td>` : `<th class="">${esc(c)}</th>`)).join("")}</tr>`).join("");
  // stated in words: the lowest perplexity of an arm that missed a limit is no win
  const missed = cols.filter((c) => c.arm && !c.feasible && c.ppl != null && (best == null || c.ppl < best));
  let note = best == null ? "No arm met every limit of its job." :
    `Lowest perplexity among the arms that met every limit of their job: ${f(best)} (${ok.filter((c) => c.ppl === best).map((c) => `job ${c.x.id} ${c.arm}`).join(", ")}).`;
  for (const c of missed) note += ` Job ${c.x.id} ${c.arm} has a lower perplexity (${f(c.ppl)}) but missed ${Object.entries(c.lim).filter(([, l]) => l.ok !== "met").map(([k]) => k).join(", ")}: not a win.`;
  $("#compare-note").textContent = note;
}

async function openJob(id) {
  if (source) { source.close(); source = null; }
  $("#list-view").hidden = true; $("#compare-view").hidden = true; $("#job-view").hidden = false;
  $("#job-title").textContent = "Job " + id;
  $("#events").textContent = ""; $("#arch").innerHTML = ""; archHistory.length = 0; $("#summary tbody").innerHTML = "";
  $("#choice").textContent = ""; $("#job-error").hidden = true; $("#job-error").textContent = "";
  series.loss = []; series.metric = []; series.limit = null; series.distill = {}; baseLayers = null;
  $("#distill-fig").hidden = true;
  stages = STAGES;
  drawStages();
  const r = await api("GET", "/v1/jobs/" + id);
  if (r.status !== 200) { $("#job-reason").textContent = r.data && r.data.error ? r.data.error.message : "HTTP " + r.status; return; }
  $("#job-state").textContent = r.data.state; $("#job-state").className = "state " + r.data.state;
  $("#job-reason").textContent = r.data.reason || "";
  showExecutor(r.data.executor, r.data.slurm);
  if (r.data.state === "failed") { $("#job-error").hidden = false; $("#job-error").textContent = "Failed: " + (r.data.reason || ""); }
  $("#cancel").hidden = ["succeeded", "failed", "cancelled"].includes(r.data.state);
  $("#cancel").onclick = async () => { const c = await api("DELETE", "/v1/jobs/" + id); $("#job-reason").textContent = c.status === 202 ? "cancelling…" : (c.data.error || {}).message; };
  const q = token() ? "?access_token=" + encodeURIComponent(token()) : "";
  source = new EventSource(`/v1/jobs/${id}/events${q}`);
  for (const k of ["state", "stage", "progress", "search", "distill", "log", "cost_table", "result", "error", "infeasible", "slurm"])
    source.addEventListener(k, (e) => { if (e.data !== undefined) onEvent(k, JSON.parse(e.data)); });
  source.onerror = () => { /* the browser reconnects with Last-Event-ID */ };
}

// Where the job runs: the daemon's own workers, or a Slurm batch job (its id and state).
function showExecutor(executor, slurm) {
  const el = $("#job-exec");
  if (executor !== "slurm") { el.textContent = executor ? " · " + executor : ""; return; }
  el.textContent = " · Slurm" + (slurm && slurm.job_id ? ` job ${slurm.job_id}` : "") +
    (slurm && slurm.state ? ` (${slurm.state})` : "");
}

function route() {
  const m = location.hash.match(/^#job\/(\d+)$/), cmp = location.hash.match(/^#compare\/(\d+(?:,\d+)*)$/);
  if (m) openJob(m[1]);
  else if (cmp) openCompare(cmp[1].split(","));
  else { if (source) { source.close(); source = null; } $("#job-view").hidden = true; $("#compare-view").hidden = true; $("#list-view").hidden = false; loadJobs(); }
}

$("#token").value = token();
$("#token").addEventListener("change", (e) => { localStorage.setItem("ac_token", e.target.value); loadJobs(); });
$("#refresh").addEventListener("click", loadJobs);
$("#submit").addEventListener("submit", submit);
$("#back").addEventListener("click", (e) => { e.preventDefault(); location.hash = ""; });
$("#compare-back").addEventListener("click", (e) => { e.preventDefault(); location.hash = ""; });
$("#compare-btn").addEventListener("click", () => {
  const ids = [...document.querySelectorAll("input.pick:checked")].map((x) => x.value).sort((a, b) => a - b);
  if (ids.length) location.hash = "compare/" + ids.join(",");
});
$("#spec").value = exampleSpec();
window.addEventListener("hashchange", route);
health(); setInterval(health, 10000);
setInterval(() => { if (!$("#list-view").hidden) loadJobs(); }, 3000);
route();
