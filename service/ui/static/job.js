/* One job: summary, curves (smoothed, with tooltips), a chart per verifier, samples, the
   cancel button, checkpoints and events; polled until the job is final. */
"use strict";

/* [chart id, [[metric, label], ...]]: the names the engine logs (workers/grpo/trainer.py,
   evaluation.py, scoring.py). */
const JOB_CHARTS = [
  ["chart-reward", [["reward_mean", "train"], ["eval_reward_mean", "held-out"]]],
  ["chart-kl", [["kl", "KL"]]],
  ["chart-entropy", [["entropy", "entropy"]]],
  ["chart-grad-norm", [["grad_norm", "grad norm"]]],
  ["chart-loss", [["loss", "loss"]]],
  ["chart-length", [["completion_len_mean", "train"], ["eval_completion_len_mean", "held-out"]]],
  ["chart-clip", [["clip_ratio", "clip ratio"]]],
  ["chart-time", [["step_seconds", "step time"]]],
];
const CANCELLABLE = new Set(["queued", "running", "paused"]);

/* A chart per verifier (`reward/<name>`, held-out `eval_reward/<name>`) and one of verifier
   errors per step (`errors/<name>`), made for the names found in the metrics. */
function verifierCharts(rows) {
  const names = new Set();
  const errorNames = new Set();
  for (const row of rows) {
    for (const key of Object.keys(row)) {
      const match = /^(eval_)?(reward|errors)\/(.+)$/.exec(key);
      if (match) (match[2] === "reward" ? names : errorNames).add(match[3]);
    }
  }
  const charts = [...names].sort().map((name, i) => [`chart-verifier-${i}`,
    [[`reward/${name}`, "train"], [`eval_reward/${name}`, "held-out"]], `Verifier ${name}`, name]);
  if (errorNames.size) {
    const series = [...errorNames].sort().map((name) => [`errors/${name}`, name]);
    charts.push(["chart-verifier-errors", series, "Verifier errors per step", ""]);
  }
  return charts;
}

function ensureFigure(id, caption, verifier) {
  if ($(id)) return $(id);
  const figure = document.createElement("figure");
  figure.appendChild(node("figcaption", caption));
  const chart = node("div", null, "chart", {verifier});
  chart.id = id;
  figure.appendChild(chart);
  $("charts").appendChild(figure);
  return chart;
}

function drawMetricCharts(rows, smoothing) {
  const charts = JOB_CHARTS.map(([id, defs]) => [id, defs, null, null]).concat(verifierCharts(rows));
  for (const [id, defs, caption, verifier] of charts) {
    const target = caption ? ensureFigure(id, caption, verifier) : $(id);
    const series = defs.map(([key, label], i) => ({
      key, label, color: GrpoCharts.PALETTE[i % GrpoCharts.PALETTE.length],
      points: rows.filter((r) => typeof r[key] === "number").map((r) => [r.step, r[key]]),
    }));
    const legend = id === "chart-verifier-errors";  // its series are verifiers, even one
    GrpoCharts.line(target, series.filter((s) => s.points.length || s === series[0]),
      {smoothing, legend});
  }
}

async function jobPage(jobId) {
  const rows = [];
  const events = [];
  let checkpointIds = "";
  let current = null;
  const base = `/v1/jobs/${encodeURIComponent(jobId)}`;
  const samples = samplesView(base);
  const smoothing = smoothingControl((w) => drawMetricCharts(rows, w));

  function drawJob(job) {
    current = job;
    document.title = `${jobLabel(job)} · grpo-service`;
    $("job-title").textContent = job.spec.name ? `${job.spec.name} (${job.id})` : job.id;
    const status = $("job-status");
    status.className = `status status-${job.status}`;
    status.textContent = job.status;
    $("job-cancel").hidden = !CANCELLABLE.has(job.status);
    $("job-bar").style.width = `${job.total_steps ? 100 * job.step / job.total_steps : 0}%`;
    const m = job.latest_metrics || {};
    const parts = [`step ${job.step}/${job.total_steps}`, `model ${job.spec.base_model}`];
    if ("reward_mean" in m) parts.push(`reward ${num(m.reward_mean)}`);
    if ("eval_reward_mean" in m) parts.push(`held-out ${num(m.eval_reward_mean)}`);
    if (job.memory_estimate) parts.push(`memory planned ${mib(job.memory_estimate.total)}`);
    if ("peak_memory_bytes" in m) parts.push(`peak ${mib(m.peak_memory_bytes)}`);
    $("job-summary").textContent = parts.join(" · ");
    $("job-playground").href = `/ui/jobs/${encodeURIComponent(job.id)}/playground`;
    const lineage = $("job-lineage");
    lineage.textContent = "";
    if (job.parent_checkpoint) {
      lineage.append("fine-tuned from checkpoint ", node("code", job.parent_checkpoint));
      const chain = (job.spec.lineage || []).slice(1);
      if (chain.length) lineage.append(` (on ${chain.join(", ")})`);
    }
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
    const ids = list.map((c) => c.id).join();
    if (ids === checkpointIds) return;
    checkpointIds = ids;
    const body = document.querySelector("#checkpoints tbody");
    body.textContent = "";
    for (const ckpt of list) {
      const row = body.insertRow();
      cell(row, String(ckpt.step), "num");
      cell(row, ckpt.format);
      cell(row, bytes(ckpt.size_bytes), "num");
      cell(row, ckpt.sha256.slice(0, 16), "mono").title = ckpt.sha256;
      const button = node("button", "Download", "download");
      button.onclick = () => download(ckpt, button);
      cell(row, button);
    }
  }

  function download(ckpt, button) {
    return saveDownload(`${base}/checkpoints/${ckpt.step}/download`,
      `${jobId}-step-${ckpt.step}.tar`, button);
  }


  $("job-cancel").onclick = async () => {
    if (!current || !confirm(`Cancel job ${jobLabel(current)}? A running job stops at its next step.`)) return;
    $("job-cancel").disabled = true;
    try {
      // A retried click must not cancel twice: the API replays the first answer for one key.
      const key = `ui-cancel-${jobId}-${Date.now()}-${Math.random().toString(36).slice(2)}`;
      const response = await api(`${base}/cancel`, {method: "POST", headers: {"Idempotency-Key": key}});
      drawJob(await response.json());
    } catch (err) {
      if (err.status !== 401) $("job-error").textContent = `Could not cancel: ${err.message}`;
    } finally {
      $("job-cancel").disabled = false;
    }
  };

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
    if (metrics.data.length || !document.querySelector("#chart-reward svg")) {
      drawMetricCharts(rows, smoothing());
    }
    await samples.update(job, rows, metrics.data.length > 0);
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
