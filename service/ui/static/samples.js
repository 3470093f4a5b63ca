/* A job's samples, from GET /v1/jobs/{id}/rollouts: a step slider, the completions of each
   group side by side with reward, per-verifier scores, advantage and verifier errors; sort and
   filter by reward; a reward histogram of the step; the same record at two steps. Every tenant
   string goes in through textContent. */
"use strict";

const SAMPLES_CAP = 5000;  // rows of one step read into the page; the count says when cut

/* The prompt a group shares. A chat-shaped record's `messages` is its prompt; an episode's is
   its whole transcript (its `completion` the last assistant turn), whose prompt is what came
   before the model's first turn: the rest differs from one episode of the group to another. */
function messagesText(row) {
  if (!Array.isArray(row.messages)) return row.prompt;
  const episode = row.messages.some((m) => m.role === "assistant" && m.content === row.completion);
  const first = episode ? row.messages.findIndex((m) => m.role === "assistant") : -1;
  const prompt = first >= 0 ? row.messages.slice(0, first) : row.messages;
  return prompt.map((m) => `${m.role}: ${typeof m.content === "string"
    ? m.content : JSON.stringify(m.content)}`).join("\n");
}

function sampleCard(row) {
  const card = node("article", null, "sample", {id: row.id, reward: row.reward, step: row.step});
  if (Object.keys(row.errors || {}).length) card.classList.add("has-error");
  const head = node("div", null, "sample-head");
  head.append(node("span", `#${row.index}`, "muted"), node("strong", `reward ${num(row.reward)}`,
    "reward"), node("span", `adv ${row.advantage === null ? "—" : num(row.advantage)}`, "muted"));
  card.appendChild(head);
  const scores = node("div", null, "scores");
  for (const [name, value] of Object.entries(row.scores || {})) {
    const score = node("span", `${name} ${value === null ? "—" : num(value)}`, "score",
      {verifier: name});
    if (value === null) score.classList.add("failed");
    scores.appendChild(score);
  }
  card.appendChild(scores);
  const meta = `${row.length} tokens · ${row.finish_reason}${row.truncated ? " · truncated" : ""}`;
  card.appendChild(node("div", meta, "muted small"));
  for (const [name, message] of Object.entries(row.errors || {})) {
    card.appendChild(node("p", `${name}: ${message}`, "verifier-error", {verifier: name}));
  }
  card.appendChild(node("pre", row.completion, "completion"));
  return card;
}

const byReward = (order) => (a, b) => (order === "asc" ? a.reward - b.reward : b.reward - a.reward);
const mean = (rows) => rows.reduce((s, r) => s + r.reward, 0) / (rows.length || 1);

function samplesView(base) {
  const cache = new Map();
  let job = null;
  let probed = null;  // null: not asked yet; false: nothing stored (yet); true: rows exist
  let steps = {train: [], eval: []};
  let follow = true;  // the slider tracks the latest step until it is moved
  let shown = "";
  let lastRows = [];  // the job's metric rows: which steps have train and eval rollouts

  async function rowsOf(split, step, record) {
    const key = `${split}/${step}/${record ?? ""}`;
    if (cache.has(key)) return cache.get(key);
    const recordParam = record === undefined ? "" : `&record=${record}`;
    const found = await getAll(`${base}/rollouts?split=${split}&step=${step}${recordParam}`, SAMPLES_CAP);
    if (found.rows.length || FINAL.has(job.status)) cache.set(key, found);
    return found;
  }

  async function probe() {
    try {
      const page = await getJson(`${base}/rollouts?limit=1`);
      probed = page.data.length > 0;
    } catch (err) {
      if (err.status !== 404) throw err;
      probed = false;  // an API without the rollouts endpoint: say so, as for none stored
    }
    const message = job.spec.rollouts === "none"
      ? "No rollouts stored for this job (its spec says rollouts: none)."
      : `No rollouts stored for this job${FINAL.has(job.status) ? "" : " yet"}.`;
    $("samples-empty").textContent = probed ? "" : message;
    $("samples-empty").hidden = probed;
    $("samples-body").hidden = !probed;
  }

  const split = () => $("samples-split").value;
  const chosenStep = () => steps[split()][Number($("samples-step").value)];

  function setSteps(metricRows) {
    steps = {
      train: metricRows.filter((r) => "reward_mean" in r).map((r) => r.step),
      eval: metricRows.filter((r) => "eval_reward_mean" in r).map((r) => r.step),
    };
    const slider = $("samples-step");
    const list = steps[split()];
    slider.max = String(Math.max(list.length - 1, 0));
    if (follow) slider.value = slider.max;
    $("samples-step-label").textContent = list.length ? `step ${chosenStep()}` : "no steps";
    for (const id of ["diff-a", "diff-b"]) {
      const select = $(id);
      const keep = select.value;
      select.textContent = "";
      for (const step of list) select.appendChild(new Option(`step ${step}`, String(step)));
      if (list.includes(Number(keep))) select.value = keep;
      else select.value = String(id === "diff-a" ? list[0] : list[list.length - 1]);
    }
  }

  function filtered(rows) {
    const low = $("samples-min").value === "" ? -Infinity : Number($("samples-min").value);
    const high = $("samples-max").value === "" ? Infinity : Number($("samples-max").value);
    const errorsOnly = $("samples-errors").checked;
    return rows.filter((r) => r.reward >= low && r.reward <= high
      && (!errorsOnly || Object.keys(r.errors || {}).length > 0));
  }

  function drawGroups(rows) {
    const order = $("samples-sort").value;
    const groups = new Map();
    for (const row of rows) {
      if (!groups.has(row.group)) groups.set(row.group, []);
      groups.get(row.group).push(row);
    }
    let list = [...groups.entries()].map(([group, members]) => ({group, members}));
    if (order !== "group") {
      list.forEach((g) => g.members.sort(byReward(order)));
      list.sort((a, b) => byReward(order)({reward: mean(a.members)}, {reward: mean(b.members)}));
    }
    const box = $("samples-groups");
    box.textContent = "";
    for (const {group, members} of list) {
      const first = members[0];
      const section = node("section", null, "group", {group, record: first.record});
      section.appendChild(node("div",
        `group ${group} · record ${first.record} · mean reward ${num(mean(members))}`, "group-head"));
      section.appendChild(node("pre", messagesText(first), "prompt"));
      const grid = node("div", null, "completions");
      members.forEach((row) => grid.appendChild(sampleCard(row)));
      section.appendChild(grid);
      box.appendChild(section);
    }
  }

  async function drawStep() {
    const step = chosenStep();
    if (step === undefined) return;
    $("samples-step-label").textContent = `step ${step}`;
    const {rows, complete} = await rowsOf(split(), step);
    const visible = filtered(rows);
    const errors = rows.filter((r) => Object.keys(r.errors || {}).length).length;
    const groups = new Set(rows.map((r) => r.group)).size;
    $("samples-count").textContent = rows.length
      ? `step ${step} (${split()}): ${rows.length}${complete ? "" : "+"} completions in ${groups}`
        + ` groups, ${visible.length} shown, ${errors} with verifier errors`
      : `no rollouts stored for step ${step} (${split()})`;
    $("histogram-caption").textContent = `Reward histogram, step ${step} (${split()})`;
    GrpoCharts.histogram($("chart-histogram"), rows.map((r) => r.reward), {title: "rewards"});
    drawGroups(visible);
    const records = $("diff-record");
    const keep = records.value;
    records.textContent = "";
    for (const row of rows.filter((r) => r.index === 0)) {
      const prompt = row.prompt.length > 60 ? `${row.prompt.slice(0, 60)}…` : row.prompt;
      records.appendChild(new Option(`record ${row.record}: ${prompt}`, String(row.record)));
    }
    if ([...records.options].some((o) => o.value === keep)) records.value = keep;
    await drawDiff();
    document.body.dataset.samplesStep = `${split()}-${step}`;
  }

  async function drawDiff() {
    const box = $("diff");
    const record = $("diff-record").value;
    box.textContent = "";
    $("diff-prompt").textContent = "";
    if (record === "") return;
    const pair = [Number($("diff-a").value), Number($("diff-b").value)];
    const found = await Promise.all(pair.map((step) => rowsOf(split(), step, Number(record))));
    const first = found.flatMap((f) => f.rows)[0];
    if (first) $("diff-prompt").textContent = messagesText(first);
    pair.forEach((step, i) => {
      const rows = found[i].rows;
      const column = node("div", null, "diff-col", {step});
      const delta = i === 1 && rows.length && found[0].rows.length
        ? ` (${mean(rows) >= mean(found[0].rows) ? "+" : ""}${num(mean(rows) - mean(found[0].rows))})` : "";
      column.appendChild(node("div", rows.length
        ? `step ${step} · mean reward ${num(mean(rows))}${delta}`
        : `step ${step}: record ${record} was not sampled`, "group-head"));
      rows.forEach((row) => column.appendChild(sampleCard(row)));
      box.appendChild(column);
    });
  }

  const redraw = () => drawStep().catch(showError("job-error"));
  $("samples-step").addEventListener("input", () => {
    follow = $("samples-step").value === $("samples-step").max;
    redraw();
  });
  $("samples-split").addEventListener("change", () => { follow = true; setSteps(lastRows); redraw(); });
  for (const id of ["samples-sort", "samples-min", "samples-max", "samples-errors"]) {
    $(id).addEventListener(id.endsWith("sort") || id.endsWith("errors") ? "change" : "input", redraw);
  }
  for (const id of ["diff-record", "diff-a", "diff-b"]) {
    $(id).addEventListener("change", () => drawDiff().catch(showError("job-error")));
  }

  async function update(current, metricRows, newMetrics) {
    job = current;
    lastRows = metricRows;
    if (probed !== true && (probed === null || newMetrics || FINAL.has(job.status))) await probe();
    if (!probed) return;
    setSteps(metricRows);
    const key = `${split()}-${chosenStep()}-${job.status}`;
    if (key !== shown) {
      shown = key;
      await drawStep();
    }
  }

  return {update};
}
