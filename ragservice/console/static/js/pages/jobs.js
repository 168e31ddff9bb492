// Jobs: the ingest jobs' live status, counts and per-file errors (polled while any is queued
// or running), filtered by collection and status; failed jobs can be queued again (writers).

import { api, get, withQuery } from "../api.js";
import { alertError, announce, clear, field, h, shortId, table, timeEl } from "../dom.js";

// The job statuses (ragservice.types.JobStatus; tests/unit/test_job_statuses.py holds them
// equal), and those of a job not yet ended.
export const JobStatus = Object.freeze({ QUEUED: "queued", RUNNING: "running", DONE: "done", FAILED: "failed" });
export const ACTIVE = new Set([JobStatus.QUEUED, JobStatus.RUNNING]);
const POLL_ACTIVE_MS = 1000;
const POLL_IDLE_MS = 10000;

/** A job's non-zero counts as words: `2 new, 1 failed, 2 chunks written`. */
export function countsText(counts) {
  return Object.entries(counts || {}).filter(([, n]) => n).map(([k, n]) => `${n} ${k.replaceAll("_", " ")}`).join(", ");
}

/** A job's status, counts and per-file errors: `done · 2 new, 1 failed`. */
export function jobSummary(job) {
  const counts = countsText(job.counts);
  return h("span", {},
    h("span", { class: `badge ${job.status}` }, job.status),
    counts ? ` · ${counts}` : "",
    job.errors && job.errors.length ? errorList(job.errors) : null);
}

function errorList(errors) {
  return h("ul", { class: "errors", "aria-label": "Errors" },
    errors.map((e) => h("li", {}, e.source ? `${e.source}: ${e.error}` : e.error)));
}

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      reject(new DOMException("left the page", "AbortError"));
    }, { once: true });
  });
}

/** Poll `job` until it is done or failed, calling `update(job)` with each state. */
export async function watchJob(job, update, signal) {
  let current = job;
  update(current);
  while (ACTIVE.has(current.status)) {
    await sleep(POLL_ACTIVE_MS, signal);
    current = await get(`/v1/jobs/${current.id}`, { signal });
    update(current);
  }
  return current;
}

export function render(main, ctx) {
  const collection = h("select", { name: "collection" }, h("option", { value: "" }, "All collections"));
  const status = h("select", { name: "status" },
    ["", ...Object.values(JobStatus)].map((value) => h("option", { value }, value || "Any status")));
  const slot = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  main.append(h("h1", {}, "Jobs"),
    h("p", { class: "hint" }, "Ingest jobs of your uploads, newest first; refreshed while any is queued or running."),
    h("form", { class: "panel row", onsubmit: (event) => event.preventDefault() },
      field("Collection", collection), field("Status", status)),
    slot);

  const names = new Map(); // collection id → name
  const seen = new Map(); // job id → last status, to announce changes
  let timer = null;
  let lastShown = null;

  async function refresh() {
    clearTimeout(timer);
    try {
      const { jobs } = await get(withQuery("/v1/jobs", { collection: collection.value, status: status.value, limit: 50 }), { signal: ctx.signal });
      for (const job of jobs) {
        const before = seen.get(job.id);
        if (before && before !== job.status) announce(`Job ${shortId(job.id)} is ${job.status}.`);
        seen.set(job.id, job.status);
      }
      const shown = JSON.stringify(jobs);
      if (shown !== lastShown) clear(slot).append(jobsTable(ctx, jobs, names, refresh)); // keeps focus when unchanged
      lastShown = shown;
      timer = setTimeout(refresh, jobs.some((j) => ACTIVE.has(j.status)) ? POLL_ACTIVE_MS : POLL_IDLE_MS);
    } catch (error) {
      alertError(error);
    }
  }

  ctx.signal.addEventListener("abort", () => clearTimeout(timer));
  collection.addEventListener("change", refresh);
  status.addEventListener("change", refresh);
  (async () => {
    try {
      const { collections } = await get("/v1/collections", { signal: ctx.signal });
      for (const c of collections) {
        names.set(c.id, c.name);
        collection.append(h("option", { value: c.name }, c.name));
      }
    } catch (error) {
      alertError(error);
    }
    refresh();
  })();
}

function jobsTable(ctx, jobs, names, refresh) {
  const columns = [
    { label: "Job", value: (j) => h("code", { title: j.id }, shortId(j.id)) },
    { label: "Collection", value: (j) => names.get(j.collection_id) || "—" },
    { label: "Status", value: (j) => jobSummary(j) },
    { label: "Created", value: (j) => timeEl(j.created_at) },
    { label: "Finished", value: (j) => timeEl(j.finished_at) },
  ];
  if (ctx.can.write) {
    columns.push({
      label: "Actions",
      value: (j) => (j.status === JobStatus.FAILED ? h("button", {
        type: "button",
        class: "small",
        "aria-label": `Retry job ${shortId(j.id)}`,
        onclick: async () => {
          try {
            await api("POST", `/v1/jobs/${j.id}/retry`);
            announce(`Job ${shortId(j.id)} queued again.`);
            refresh();
          } catch (error) {
            alertError(error);
          }
        },
      }, "Retry") : ""),
    });
  }
  return table(columns, jobs, { caption: "Ingest jobs", empty: "No jobs match." });
}
