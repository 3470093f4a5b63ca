/* The dashboard's pages. The API key lives in sessionStorage and goes out as a Bearer token;
   every number comes from the /v1 API. */
"use strict";

const KEY = "grpo_api_key";
const POLL_MS = 2000;
const FINAL = new Set(["succeeded", "failed", "cancelled"]);
const $ = (id) => document.getElementById(id);

class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

async function api(path, options) {
  const headers = {Authorization: `Bearer ${sessionStorage.getItem(KEY) || ""}`};
  const response = await fetch(path, {...(options || {}), headers});
  if (!response.ok) {
    let problem = {title: response.statusText};
    try { problem = await response.json(); } catch (_) { /* not JSON */ }
    if (response.status === 401) showLogin("That API key was not accepted.");
    throw new ApiError(response.status, problem);
  }
  return response;
}
const getJson = async (path) => (await api(path)).json();

function showLogin(message) {
  sessionStorage.removeItem(KEY);
  $("content").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("api-key").focus();
}

function cell(row, text, className) {
  const td = row.insertCell();
  if (text instanceof Node) td.appendChild(text); else td.textContent = text ?? "";
  if (className) td.className = className;
  return td;
}

function statusBadge(status) {
  const span = document.createElement("span");
  span.className = `status status-${status}`;
  span.textContent = status;
  return span;
}

function progressBar(step, total) {
  const outer = document.createElement("div");
  outer.className = "progress small";
  const inner = document.createElement("div");
  inner.style.width = `${total ? Math.min(100, 100 * step / total) : 0}%`;
  outer.appendChild(inner);
  const label = document.createElement("span");
  label.textContent = ` ${step}/${total}`;
  const wrap = document.createElement("span");
  wrap.append(outer, label);
  return wrap;
}

const num = (v, digits) => (typeof v === "number" ? v.toFixed(digits ?? 3) : "");
const when = (iso) => (iso ? new Date(iso).toLocaleString() : "");
function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

/* ---- jobs list ------------------------------------------------------------------------- */

async function jobsPage() {
  let after = null;
  const body = document.querySelector("#jobs tbody");
  async function load(append) {
    const page = await getJson(`/v1/jobs?limit=50${append && after ? `&after=${after}` : ""}`);
    if (!append) body.textContent = "";
    for (const job of page.data) {
      const row = body.insertRow();
      row.dataset.jobId = job.id;
      const link = document.createElement("a");
      link.href = `/ui/jobs/${encodeURIComponent(job.id)}`;
      link.textContent = job.id;
      cell(row, link);
      cell(row, statusBadge(job.status));
      cell(row, progressBar(job.step, job.total_steps));
      cell(row, num((job.latest_metrics || {}).reward_mean), "num");
      cell(row, job.spec.base_model);
      cell(row, when(job.created_at));
    }
    after = page.next;
    $("jobs-more").hidden = !page.has_more;
    $("jobs-empty").hidden = body.rows.length > 0;
    $("jobs-error").textContent = "";
  }
  $("jobs-more").onclick = () => load(true);
  await load(false);
  setInterval(() => {
    if (!after && sessionStorage.getItem(KEY)) load(false).catch(showError("jobs-error"));
  }, 5000);
}

/* ---- one job --------------------------------------------------------------------------- */

const CHARTS = [
  ["chart-reward", [["reward_mean", "train", "#2563eb"], ["eval_reward_mean", "held-out", "#16a34a"]]],
  ["chart-kl", [["kl", "KL", "#9333ea"]]],
  ["chart-loss", [["loss", "loss", "#dc2626"]]],
  ["chart-length", [["completion_len_mean", "length", "#0891b2"]]],
  ["chart-clip", [["clip_ratio", "clip ratio", "#ea580c"]]],
  ["chart-time", [["step_seconds", "step time", "#4b5563"]]],
];

async function jobPage(jobId) {
  const rows = [];
  const events = [];
  let checkpointSteps = "";
  const base = `/v1/jobs/${encodeURIComponent(jobId)}`;

  function drawCharts() {
    for (const [id, defs] of CHARTS) {
      const series = defs.map(([key, label, color]) => ({
        key, label, color, points: rows.filter((r) => key in r).map((r) => [r.step, r[key]]),
      }));
      GrpoCharts.line($(id), series.filter((s) => s.points.length || s.key === defs[0][0]));
    }
  }

  function drawJob(job) {
    document.title = `${job.id} · grpo-service`;
    $("job-title").textContent = job.id;
    const status = $("job-status");
    status.className = `status status-${job.status}`;
    status.textContent = job.status;
    $("job-bar").style.width = `${job.total_steps ? 100 * job.step / job.total_steps : 0}%`;
    const m = job.latest_metrics || {};
    const parts = [`step ${job.step}/${job.total_steps}`, `model ${job.spec.base_model}`];
    if ("reward_mean" in m) parts.push(`reward ${num(m.reward_mean)}`);
    if ("eval_reward_mean" in m) parts.push(`held-out ${num(m.eval_reward_mean)}`);
    $("job-summary").textContent = parts.join(" · ");
    $("job-error").textContent = job.error ? `${job.error.code}: ${job.error.message}` : "";
    $("job-spec").textContent = JSON.stringify(job.spec, null, 2);
  }

  function addEvents(page) {
    const body = document.querySelector("#events tbody");
    for (const event of page) {
      events.push(event);
      const row = body.insertRow(0);
      row.dataset.type = event.type;
      if (event.type === "reward_hacking_suspected") row.className = "warn";
      cell(row, when(event.at));
      cell(row, event.type);
      cell(row, event.message);
    }
    const alarms = events.filter((e) => e.type === "reward_hacking_suspected");
    if (alarms.length) {
      $("hacking-banner").hidden = false;
      $("hacking-text").textContent = alarms[alarms.length - 1].message;
    }
  }

  function drawCheckpoints(list) {
    const key = list.map((c) => c.id).join();
    if (key === checkpointSteps) return;
    checkpointSteps = key;
    const body = document.querySelector("#checkpoints tbody");
    body.textContent = "";
    for (const ckpt of list) {
      const row = body.insertRow();
      cell(row, String(ckpt.step), "num");
      cell(row, ckpt.format);
      cell(row, bytes(ckpt.size_bytes), "num");
      cell(row, ckpt.sha256.slice(0, 16), "mono").title = ckpt.sha256;
      const button = document.createElement("button");
      button.textContent = "Download";
      button.className = "download";
      button.onclick = () => download(ckpt, button);
      cell(row, button);
    }
  }

  async function download(ckpt, button) {
    button.disabled = true;
    button.textContent = "Downloading…";
    try {
      const blob = await (await api(`${base}/checkpoints/${ckpt.step}/download`)).blob();
      const url = URL.createObjectURL(blob);
      const a = document.createElement("a");
      a.href = url;
      a.download = `${jobId}-step-${ckpt.step}.tar`;
      document.body.appendChild(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
      button.textContent = "Download";
    } catch (err) {
      button.textContent = `Failed: ${err.message}`;
    } finally {
      button.disabled = false;
    }
  }

  async function refresh() {
    const job = await getJson(base);
    const after = rows.length ? rows[rows.length - 1].step : 0;
    const lastEvent = events.length ? events[events.length - 1].id : 0;
    const [metrics, newEvents, ckpts] = await Promise.all([
      getJson(`${base}/metrics?after_step=${after}`),
      getJson(`${base}/events?after=${lastEvent}`),
      getJson(`${base}/checkpoints`),
    ]);
    rows.push(...metrics.data);
    drawJob(job);
    addEvents(newEvents.data);
    drawCheckpoints(ckpts.data);
    if (metrics.data.length || !document.querySelector("#chart-reward svg")) drawCharts();
    $("job-error").dataset.loaded = "true";
    document.body.dataset.loadedStep = String(rows.length ? rows[rows.length - 1].step : 0);
    return FINAL.has(job.status);
  }

  async function loop() {
    let final = false;
    try {
      final = await refresh();
    } catch (err) {
      if (err.status !== 401) $("job-error").textContent = `Could not load the job: ${err.message}`;
      if (err.status === 404 || err.status === 401) return;
    }
    if (final) document.body.dataset.final = "true";
    else if (sessionStorage.getItem(KEY)) setTimeout(loop, POLL_MS);
  }
  await loop();
}

/* ---- start ----------------------------------------------------------------------------- */

const showError = (id) => (err) => { if (err.status !== 401) $(id).textContent = err.message; };

function start() {
  if (!sessionStorage.getItem(KEY)) { showLogin(); return; }
  $("login").hidden = true;
  $("content").hidden = false;
  $("logout").hidden = false;
  const page = document.body.dataset.page;
  const run = page === "job" ? jobPage(document.body.dataset.jobId) : jobsPage();
  run.catch(showError(page === "job" ? "job-error" : "jobs-error"));
}

$("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const key = $("api-key").value.trim();
  const response = await fetch("/v1/jobs?limit=1", {headers: {Authorization: `Bearer ${key}`}});
  if (!response.ok) {
    $("login-error").textContent = response.status === 401
      ? "That API key was not accepted." : `The API answered ${response.status}.`;
    return;
  }
  sessionStorage.setItem(KEY, key);
  location.reload();
});
$("logout").addEventListener("click", () => showLogin("Logged out."));
start();
