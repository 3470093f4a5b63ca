/* The jobs list: status, progress, latest reward, names; tick 2-4 jobs to compare them. */
"use strict";

const COMPARE_MAX = 4;

async function jobsPage() {
  let after = null;
  const selected = new Set();
  const body = document.querySelector("#jobs tbody");
  const compare = $("compare");

  function updateCompare() {
    compare.disabled = selected.size < 2 || selected.size > COMPARE_MAX;
    $("compare-hint").textContent = selected.size > COMPARE_MAX
      ? `At most ${COMPARE_MAX} jobs on one chart.`
      : `${selected.size} selected; tick 2 to ${COMPARE_MAX} jobs to overlay their curves.`;
  }

  function addRow(job) {
    const row = body.insertRow();
    row.dataset.jobId = job.id;
    const box = document.createElement("input");
    box.type = "checkbox";
    box.className = "pick";
    box.checked = selected.has(job.id);
    box.setAttribute("aria-label", `compare ${job.id}`);
    box.onchange = () => {
      if (box.checked) selected.add(job.id); else selected.delete(job.id);
      updateCompare();
    };
    cell(row, box);
    const link = node("a", job.id);
    link.href = `/ui/jobs/${encodeURIComponent(job.id)}`;
    cell(row, link);
    cell(row, job.spec.name || "", "job-name");
    cell(row, statusBadge(job.status));
    cell(row, progressBar(job.step, job.total_steps));
    cell(row, num((job.latest_metrics || {}).reward_mean), "num");
    cell(row, job.spec.base_model);
    cell(row, when(job.created_at));
  }

  async function load(append) {
    const page = await getJson(`/v1/jobs?limit=50${append && after ? `&after=${after}` : ""}`);
    if (!append) body.textContent = "";
    page.data.forEach(addRow);
    after = page.next;
    $("jobs-more").hidden = !page.has_more;
    $("jobs-empty").hidden = body.rows.length > 0;
    $("jobs-error").textContent = "";
  }

  compare.onclick = () => {
    const ids = [...selected].map(encodeURIComponent).join(",");
    location.href = `/ui/compare?jobs=${ids}`;
  };
  $("jobs-more").onclick = () => load(true);
  updateCompare();
  await load(false);
  setInterval(() => {
    if (!after && sessionStorage.getItem(KEY)) load(false).catch(showError("jobs-error"));
  }, 5000);
}
