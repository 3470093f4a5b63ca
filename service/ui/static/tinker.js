/* Tinker runs (/ui/tinker): the tenant's training runs from /api/v1/training_runs (the Tinker
   API also takes the dashboard's Bearer key), each with its checkpoints' tinker:// paths. */
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
    const list = node("ul", "", "checkpoints");
    const found = await getJson(
      `/api/v1/training_runs/${encodeURIComponent(run.training_run_id)}/checkpoints`);
    for (const c of found.checkpoints) {
      list.appendChild(node("li", `${c.tinker_path} (${c.checkpoint_type}, ${bytes(c.size_bytes)})`));
    }
    cell(row, found.checkpoints.length ? list : "none");
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
