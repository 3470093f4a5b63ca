/* Tinker runs (/ui/tinker): the tenant's training runs from /api/v1/training_runs (the Tinker
   API also takes the dashboard's Bearer key), each with its loss curve (one point a forward
   pass, /api/v1/training_runs/{id}/loss) and its checkpoints' tinker:// paths and downloads. */
"use strict";

async function tinkerPage() {
  const body = document.querySelector("#tinker-runs tbody");
  const limit = 50;
  let offset = 0;

  async function addRow(run) {
    const row = body.insertRow();
    row.dataset.runId = run.training_run_id;
    cell(row, run.training_run_id);
    cell(row, run.base_model);
    cell(row, run.lora_rank, "num");
    cell(row, when(run.last_request_time));
    const runPath = `/api/v1/training_runs/${encodeURIComponent(run.training_run_id)}`;
    const list = node("ul", "", "checkpoints");
    const found = await getJson(`${runPath}/checkpoints`);
    for (const c of found.checkpoints) {
      const item = node("li", `${c.tinker_path} (${c.checkpoint_type}, ${bytes(c.size_bytes)}) `);
      const button = node("button", "Download", "download");
      const name = c.tinker_path.split("/").pop();
      button.onclick = () => saveDownload(`${runPath}/checkpoints/${c.checkpoint_id}/archive`,
        `${run.training_run_id}-${name}.tar`, button);
      item.appendChild(button);
      list.appendChild(item);
    }
    cell(row, found.checkpoints.length ? list : "none");
    const losses = (await getJson(`${runPath}/loss`)).data;
    const chart = node("div", "", "loss-chart");
    cell(row, chart);
    GrpoCharts.line(chart, [{key: "loss", label: "loss", points: losses.map((p) => [p.n, p.loss])}],
      {title: "loss:sum by forward pass", emptyText: "no forward pass yet"});
  }

  async function load() {
    const page = await getJson(`/api/v1/training_runs?limit=${limit}&offset=${offset}`);
    for (const run of page.training_runs) await addRow(run);
    offset += page.training_runs.length;
    $("tinker-more").hidden = offset >= page.cursor.total_count;
    $("tinker-empty").hidden = body.rows.length > 0;
  }

  $("tinker-more").onclick = () => load().catch(showError("tinker-error"));
  await load();
}
