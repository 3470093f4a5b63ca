/* The dashboard's entry: the login form, then the page's view (common.js, charts.js,
   jobs.js, job.js, samples.js, compare.js, playground.js, evaluations.js and tinker.js are loaded before this file). The
   API key lives in sessionStorage and goes out as a Bearer token; every number comes from the
   /v1 API. */
"use strict";

const PAGES = {
  jobs: (body) => jobsPage(),
  job: (body) => jobPage(body.dataset.jobId),
  compare: (body) => comparePage(),
  playground: (body) => playgroundPage(body.dataset.jobId),
  evaluations: (body) => evaluationsPage(),
  tinker: (body) => tinkerPage(),
};

function start() {
  if (!sessionStorage.getItem(KEY)) { showLogin(); return; }
  $("login").hidden = true;
  $("content").hidden = false;
  $("logout").hidden = false;
  const page = document.body.dataset.page;
  PAGES[page](document.body).catch(showError(`${page}-error`));
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
