/* What every page shares: the API call with the key from sessionStorage, the login form's
   state, and small builders. Tenant strings (names, prompts, completions, errors) only ever
   reach the page through textContent, never as HTML. */
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
  const opts = options || {};
  const headers = {...(opts.headers || {}),
    Authorization: `Bearer ${sessionStorage.getItem(KEY) || ""}`};
  const response = await fetch(path, {...opts, headers});
  if (!response.ok) {
    let problem = {title: response.statusText};
    try { problem = await response.json(); } catch (_) { /* not JSON */ }
    if (response.status === 401) showLogin("That API key was not accepted.");
    throw new ApiError(response.status, problem);
  }
  return response;
}
const getJson = async (path) => (await api(path)).json();

/* Every row of a paged list: `after=next` until has_more is false, at most `cap` rows. */
async function getAll(path, cap) {
  const rows = [];
  let after = null;
  const sep = path.includes("?") ? "&" : "?";
  for (;;) {
    const cursor = after ? `&after=${encodeURIComponent(after)}` : "";
    const page = await getJson(`${path}${sep}limit=100${cursor}`);
    rows.push(...page.data);
    if (!page.has_more || !page.next || rows.length >= (cap || Infinity)) {
      return {rows, complete: !page.has_more};
    }
    after = page.next;
  }
}

function showLogin(message) {
  sessionStorage.removeItem(KEY);
  $("content").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("api-key").focus();
}

const showError = (id) => (err) => { if (err.status !== 401) $(id).textContent = err.message; };

/* An element with text content only, and optional class and data attributes. */
function node(tag, text, className, data) {
  const element = document.createElement(tag);
  if (text !== undefined && text !== null) element.textContent = String(text);
  if (className) element.className = className;
  for (const [k, v] of Object.entries(data || {})) element.dataset[k] = String(v);
  return element;
}

function cell(row, text, className) {
  const td = row.insertCell();
  if (text instanceof Node) td.appendChild(text); else td.textContent = text ?? "";
  if (className) td.className = className;
  return td;
}

function statusBadge(status) {
  return node("span", status, `status status-${status}`);
}

function progressBar(step, total) {
  const outer = node("div", null, "progress small");
  const inner = document.createElement("div");
  inner.style.width = `${total ? Math.min(100, 100 * step / total) : 0}%`;
  outer.appendChild(inner);
  const wrap = document.createElement("span");
  wrap.append(outer, node("span", ` ${step}/${total}`));
  return wrap;
}

const jobLabel = (job) => (job.spec && job.spec.name ? job.spec.name : job.id);
const num = (v, digits) => (typeof v === "number" ? v.toFixed(digits ?? 3) : "");
const mib = (bytes) => `${(bytes / 2 ** 20).toFixed(0)} MiB`;
const when = (iso) => (iso ? new Date(iso).toLocaleString() : "");
function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

/* The EMA slider shared by the chart pages; its value is kept for the tab. */
function smoothingControl(onChange) {
  const input = $("smoothing");
  const label = $("smoothing-value");
  const saved = sessionStorage.getItem("grpo_smoothing");
  if (saved !== null) input.value = saved;
  const update = () => {
    label.textContent = Number(input.value).toFixed(2);
    sessionStorage.setItem("grpo_smoothing", input.value);
  };
  update();
  input.addEventListener("input", () => { update(); onChange(Number(input.value)); });
  return () => Number(input.value);
}

/* Fetches `path` with the key (a link cannot carry it) and saves it as `filename`; `button`
   says what is going on meanwhile. */
async function saveDownload(path, filename, button) {
  button.disabled = true;
  button.textContent = "Downloading…";
  try {
    const blob = await (await api(path)).blob();
    const url = URL.createObjectURL(blob);
    const a = document.createElement("a");
    a.href = url;
    a.download = filename;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
    button.textContent = "Download";
    button.dataset.bytes = String(blob.size);
  } catch (err) {
    button.textContent = `Failed: ${err.message}`;
  } finally {
    button.disabled = false;
  }
}
