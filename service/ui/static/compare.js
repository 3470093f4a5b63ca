/* 2-4 runs on one chart per metric (/ui/compare?jobs=a,b): one curve per job, a legend with
   the jobs' names, the same smoothing and tooltips as a job's page. */
"use strict";

const COMPARE_METRICS = [
  ["reward_mean", "Reward mean (train)"],
  ["eval_reward_mean", "Reward mean (held-out)"],
  ["kl", "KL to reference"],
  ["entropy", "Entropy"],
  ["grad_norm", "Gradient norm"],
  ["loss", "Loss"],
  ["completion_len_mean", "Completion length (tokens)"],
  ["step_seconds", "Step time (s)"],
];

async function comparePage() {
  const ids = (new URLSearchParams(location.search).get("jobs") || "").split(",").filter(Boolean);
  if (ids.length < 2 || ids.length > COMPARE_MAX) {
    $("compare-error").textContent = `Pick 2 to ${COMPARE_MAX} jobs in the jobs list.`;
    return;
  }
  const runs = await Promise.all(ids.map(async (id) => {
    const base = `/v1/jobs/${encodeURIComponent(id)}`;
    const [job, metrics] = await Promise.all([getJson(base), getJson(`${base}/metrics`)]);
    return {job, rows: metrics.data};
  }));
  const names = $("compare-jobs");
  names.textContent = "";
  runs.forEach(({job}, i) => {
    const link = node("a", jobLabel(job));
    link.href = `/ui/jobs/${encodeURIComponent(job.id)}`;
    if (i) names.append(" vs ");
    names.append(link, " ", statusBadge(job.status));
  });
  // Two runs of one name stay apart in the legend.
  const labels = runs.map(({job}) => jobLabel(job));
  const legendLabel = (job, i) => (labels.indexOf(labels[i]) === i && labels.lastIndexOf(labels[i]) === i
    ? labels[i] : `${labels[i]} (${job.id})`);
  const box = $("compare-charts");
  for (const [key, caption] of COMPARE_METRICS) {
    if (!runs.some(({rows}) => rows.some((r) => typeof r[key] === "number"))) continue;
    const figure = document.createElement("figure");
    figure.appendChild(node("figcaption", caption));
    const chart = node("div", null, "chart", {metric: key});
    chart.id = `compare-${key}`;
    figure.appendChild(chart);
    box.appendChild(figure);
  }
  const draw = (smoothing) => {
    for (const [key] of COMPARE_METRICS) {
      const chart = $(`compare-${key}`);
      if (!chart) continue;
      const series = runs.map(({job, rows}, i) => ({
        key: job.id, label: legendLabel(job, i), color: GrpoCharts.PALETTE[i],
        points: rows.filter((r) => typeof r[key] === "number").map((r) => [r.step, r[key]]),
      }));
      GrpoCharts.line(chart, series, {smoothing, legend: true});
    }
    document.body.dataset.drawn = String(runs.length);
  };
  const smoothing = smoothingControl(draw);
  draw(smoothing());
}
