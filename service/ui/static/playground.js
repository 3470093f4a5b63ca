/* The playground (/ui/jobs/{id}/playground): one prompt, answered side by side by the job's
   base model and one of its checkpoints, both streamed from /v1/chat/completions (server-sent
   events read from fetch's body). Answers reach the page as text only. */
"use strict";

/* Stream one chat completion into a pane; resolves when the stream ends. */
async function streamInto(pane, model, prompt, maxTokens, temperature) {
  const text = pane.querySelector(".pane-text");
  const status = pane.querySelector(".pane-status");
  pane.querySelector(".pane-model").textContent = model;
  text.textContent = "";
  status.textContent = "…";
  pane.dataset.done = "false";
  const body = {model, messages: [{role: "user", content: prompt}], max_tokens: maxTokens,
    temperature, stream: true};
  try {
    const response = await api("/v1/chat/completions", {
      method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
    });
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let finish = null;
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      const lines = buffer.split("\n");
      buffer = lines.pop();
      for (const line of lines) {
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        const chunk = JSON.parse(line.slice(6));
        if (chunk.error) throw new Error(chunk.error.message || "the model failed");
        for (const choice of chunk.choices || []) {
          if (choice.delta && choice.delta.content) text.textContent += choice.delta.content;
          if (choice.finish_reason) finish = choice.finish_reason;
        }
      }
    }
    status.textContent = finish ? `finished: ${finish}` : "finished";
  } catch (err) {
    status.textContent = err.message;
    status.className = "pane-status error";
  } finally {
    pane.dataset.done = "true";
  }
}

/* A prompt from the job's own data: its first stored rollout's (a chat record's last user
   message, else the prompt text); null when it has none stored. */
async function jobPrompt(base) {
  try {
    const [row] = (await getJson(`${base}/rollouts?limit=1`)).data;
    if (!row) return null;
    const users = (row.messages || []).filter((m) => m.role === "user");
    const last = users.length ? users[users.length - 1].content : null;
    return typeof last === "string" ? last : row.prompt;
  } catch (err) {
    return null;  // no rollouts endpoint or none readable: the page's example prompt stays
  }
}

async function playgroundPage(jobId) {
  const base = `/v1/jobs/${encodeURIComponent(jobId)}`;
  const [job, checkpoints] = await Promise.all([getJson(base), getJson(`${base}/checkpoints`)]);
  const link = $("playground-job");
  link.textContent = jobLabel(job);
  link.href = `/ui/jobs/${encodeURIComponent(job.id)}`;
  document.title = `Playground ${jobLabel(job)} · grpo-service`;
  const select = $("playground-checkpoint");
  const newest = [...checkpoints.data].sort((a, b) => b.step - a.step);
  for (const ckpt of newest) {
    const option = node("option", `step ${ckpt.step} (${ckpt.id})`);
    option.value = ckpt.id;
    select.appendChild(option);
  }
  if (!newest.length) {
    $("playground-error").textContent = "This job has no checkpoint yet.";
    $("playground-run").disabled = true;
    return;
  }
  const promptBox = $("playground-prompt");
  const example = promptBox.value;
  const prompt = await jobPrompt(base);
  if (prompt && promptBox.value === example) promptBox.value = prompt;  // unless already edited
  $("playground-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const prompt = $("playground-prompt").value;
    const maxTokens = Number($("playground-max-tokens").value) || 64;
    const temperature = Number($("playground-temperature").value) || 0;
    $("playground-run").disabled = true;
    try {
      await Promise.all([
        streamInto($("pane-base"), job.spec.base_model, prompt, maxTokens, temperature),
        streamInto($("pane-checkpoint"), select.value, prompt, maxTokens, temperature),
      ]);
    } finally {
      $("playground-run").disabled = false;
    }
  });
}
