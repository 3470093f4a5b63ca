/* Evaluations (/ui/evaluations?ids=a,b): the list, and the ticked ones side by side: reward
   mean, each verifier's mean and pass@k with its 95% interval, one column per evaluation. */
"use strict";

async function evaluationsPage() {
  const picked = (new URLSearchParams(location.search).get("ids") || "").split(",").filter(Boolean);
  const selected = new Map(); // id -> evaluation, in the order ticked
  const body = document.querySelector("#evaluations tbody");
  let after = null;

  function addRow(evaluation) {
    const row = body.insertRow();
    row.dataset.evaluationId = evaluation.id;
    const box = document.createElement("input");
    box.type = "checkbox";
    box.className = "pick";
    box.setAttribute("aria-label", `compare ${evaluation.id}`);
    box.checked = picked.includes(evaluation.id);
    if (box.checked) selected.set(evaluation.id, evaluation);
    box.onchange = () => {
      if (box.checked) selected.set(evaluation.id, evaluation); else selected.delete(evaluation.id);
      drawComparison([...selected.values()]);
    };
    cell(row, box);
    cell(row, evaluation.id);
    cell(row, evaluation.model);
    cell(row, statusBadge(evaluation.status));
    cell(row, evaluation.dataset);
    cell(row, evaluation.samples_per_prompt, "num");
    cell(row, num((evaluation.results || {}).reward_mean), "num");
    cell(row, when(evaluation.created_at));
  }

  async function load(append) {
    const page = await getJson(`/v1/evaluations?limit=50${append && after ? `&after=${after}` : ""}`);
    page.data.forEach(addRow);
    after = page.next;
    $("evaluations-more").hidden = !page.has_more;
    $("evaluations-empty").hidden = body.rows.length > 0;
  }

  $("evaluations-more").onclick = () => load(true).catch(showError("evaluations-error"));
  await load(false);
  // the columns in the order the URL names them
  const ordered = picked.filter((id) => selected.has(id)).map((id) => [id, selected.get(id)]);
  selected.clear();
  ordered.forEach(([id, e]) => selected.set(id, e));
  drawComparison([...selected.values()]);
}

/* One row per figure, one column per evaluation; tenant strings as text only. */
function drawComparison(evaluations) {
  const head = document.querySelector("#comparison thead tr");
  const rows = document.querySelector("#comparison tbody");
  head.textContent = "";
  rows.textContent = "";
  $("comparison-hint").hidden = evaluations.length > 0;
  document.body.dataset.compared = String(evaluations.length);
  if (!evaluations.length) return;
  head.appendChild(node("th", ""));
  for (const e of evaluations) {
    const th = node("th", null, null, {evaluationId: e.id});
    th.append(node("div", e.model), node("div", e.id, "muted"));
    head.appendChild(th);
  }
  const results = evaluations.map((e) => e.results || null);
  const addFigure = (key, label, value) => {
    const row = rows.insertRow();
    row.dataset.figure = key;
    cell(row, label);
    results.forEach((r, i) => cell(row, r ? value(r, evaluations[i]) : evaluations[i].status, "num"));
  };
  addFigure("reward_mean", "Reward mean", (r) => num(r.reward_mean));
  const verifiers = [...new Set(results.flatMap((r) => (r ? Object.keys(r.per_verifier) : [])))].sort();
  for (const name of verifiers) {
    addFigure(`verifier:${name}`, `${name} (mean)`, (r) => num(r.per_verifier[name]));
  }
  const ks = [...new Set(results.flatMap((r) => (r ? Object.keys(r.pass_at_k) : [])))]
    .map(Number).sort((a, b) => a - b);
  for (const k of ks) {
    addFigure(`pass@${k}`, `pass@${k}`, (r) => {
      const p = r.pass_at_k[String(k)];
      return p ? `${num(p.estimate)} [${num(p.low, 2)}, ${num(p.high, 2)}]` : "";
    });
  }
  addFigure("samples", "Samples", (r) => `${r.samples} (${r.prompts} prompts)`);
}
