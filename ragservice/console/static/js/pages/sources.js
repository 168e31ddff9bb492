// A collection's sources (web sites, S3 prefixes, folders an operator added): where each reads
// from, its schedule, its last run (when, status, counts, and the documents that failed, opened
// on demand); writers can run one now (a job the workers take, followed here until it ends) and
// add a web site or an S3 prefix (folders are for operators: `ragservice sources add`).
// Route: #/collections/NAME/sources. Refreshed while a run is queued or running.

import { api, enc, get } from "../api.js";
import {
  alertError, announce, clear, field, fmtSeconds, h, shortId, table, timeEl, uid,
} from "../dom.js";
import { ACTIVE, countsText, jobSummary, watchJob } from "./jobs.js";

const POLL_ACTIVE_MS = 1000;

const sourcesPath = (name) => `/v1/collections/${enc(name)}/sources`;

export function render(main, ctx, name) {
  const slot = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  const runSlot = h("div", { class: "job-status" }); // the run asked for here, until it ends
  main.append(h("h1", {}, `Sources of ${name}`),
    h("p", {}, h("a", { href: `#/collections/${enc(name)}` }, `Back to collection ${name}`)),
    h("p", { class: "hint" }, "Web sites, S3 prefixes and folders this collection follows: each run ingests what is new or changed and, unless the source keeps them, deletes the documents that are gone."),
    runSlot);
  main.append(h("h2", {}, "Sources"), slot);
  if (ctx.can.write) main.append(addForm(ctx, name, (source) => (source.queued_job_id ? follow(source, source.queued_job_id) : refresh())));
  let timer = null;
  let lastShown = null;

  async function refresh() {
    clearTimeout(timer);
    try {
      const listed = sourcesOf(await get(sourcesPath(name), { signal: ctx.signal }));
      const shown = JSON.stringify(listed);
      if (shown !== lastShown) clear(slot).append(sourcesTable(ctx, name, listed, runNow)); // keeps focus when unchanged
      lastShown = shown;
      if (listed.some((s) => s.last_run && ACTIVE.has(s.last_run.status))) timer = setTimeout(refresh, POLL_ACTIVE_MS);
    } catch (error) {
      alertError(error);
    }
  }

  async function runNow(source) {
    try {
      const reply = await api("POST", `${sourcesPath(name)}/${enc(source.id)}/run`, undefined, { signal: ctx.signal });
      await follow(source, reply.job_id);
    } catch (error) {
      alertError(error);
    }
  }

  /** Show the queued run `jobId` of `source` until it ends, and the list as it goes. */
  async function follow(source, jobId) {
    try {
      const job = await get(`/v1/jobs/${enc(jobId)}`, { signal: ctx.signal });
      announce(`Run of ${source.location} queued as job ${shortId(job.id)}.`);
      const status = h("span", {});
      clear(runSlot).append(h("div", { class: "source-run" }, h("a", { href: "#/jobs" }, `Job ${shortId(job.id)}`),
        ` (run of ${source.location}): `, status));
      refresh();
      const finished = await watchJob(job, (current) => clear(status).append(jobSummary(current)), ctx.signal);
      announce(`Run of ${source.location} ${finished.status}: ${countsText(finished.counts) || "nothing to do"}.`);
      refresh();
    } catch (error) {
      alertError(error);
    }
  }

  ctx.signal.addEventListener("abort", () => clearTimeout(timer));
  refresh();
}

/** The list a GET answered (`{sources: [...]}`). */
function sourcesOf(body) {
  return (body && body.sources) || [];
}

const SCHEDULES = [["", "Only when asked"], ["3600", "Every hour"], ["21600", "Every 6 hours"], ["86400", "Every day"], ["604800", "Every week"]];

/** Add a web site (crawled from the URL) or an S3 prefix; `added(source)` with the reply. */
function addForm(ctx, name, added) {
  const location = h("input", { type: "text", name: "location", required: true, maxlength: "2048", pattern: "(https?|s3)://.+", placeholder: "https://docs.example.com/", autocomplete: "off", spellcheck: "false" });
  const depth = h("input", { type: "number", name: "depth", min: "0", max: "100", inputmode: "numeric" });
  const maxPages = h("input", { type: "number", name: "max_pages", min: "1", inputmode: "numeric" });
  const username = h("input", { type: "text", name: "username", maxlength: "1024", autocomplete: "off", spellcheck: "false" });
  const password = h("input", { type: "password", name: "password", maxlength: "1024", autocomplete: "new-password" });
  const every = h("select", { name: "every" }, SCHEDULES.map(([value, label]) => h("option", { value }, label)));
  const keep = h("input", { type: "checkbox", name: "keep", id: uid("keep") });
  const runNow = h("input", { type: "checkbox", name: "run", id: uid("run"), checked: true });
  const form = h("form", { class: "panel" },
    h("h2", {}, "Add a source"),
    field("Location", location, "A web page (its site is crawled from there) or s3://bucket/prefix."),
    h("div", { class: "row" },
      field("Crawl depth", depth, "Web: links followed from the page (blank: the service's default)."),
      field("Pages at most", maxPages, "Web: per run (blank: the service's default)."),
      field("Schedule", every)),
    h("div", { class: "row" },
      field("User name", username, "If the site asks for one (S3: the access key id)."),
      field("Password", password, "Kept by the service and never shown again (S3: the secret key).")),
    h("p", {}, h("label", { class: "inline", for: keep.id }, keep, " Keep documents that are gone from the source")),
    h("p", {}, h("label", { class: "inline", for: runNow.id }, runNow, " Run it now")),
    h("div", { class: "actions" }, h("button", { type: "submit", class: "primary" }, "Add source")));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!location.reportValidity() || !depth.reportValidity() || !maxPages.reportValidity()) return;
    const options = {};
    if (depth.value !== "") options.depth = Number(depth.value);
    if (maxPages.value !== "") options.max_pages = Number(maxPages.value);
    const body = {
      location: location.value.trim(),
      options,
      every_seconds: every.value ? Number(every.value) : null,
      prune: !keep.checked,
      run: runNow.checked,
    };
    if (username.value !== "" || password.value !== "") {
      body.credentials = { username: username.value, password: password.value };
    }
    try {
      const source = await api("POST", sourcesPath(name), body, { signal: ctx.signal });
      announce(`Source ${source.location} added.`);
      form.reset();
      added(source);
    } catch (error) {
      alertError(error);
    }
  });
  return form;
}

function sourcesTable(ctx, name, sources, runNow) {
  const columns = [
    { label: "Location", value: (s) => h("span", {}, h("code", { title: s.id }, s.location), ` (${s.kind}${s.has_credentials ? ", with credentials" : ""})`) },
    { label: "Schedule", value: (s) => (s.every_seconds ? `every ${fmtSeconds(s.every_seconds)}` : "when asked") },
    { label: "Next run", value: (s) => timeEl(s.next_run_at) },
    { label: "Last run", value: (s) => lastRun(s.last_run) },
    { label: "Errors", value: (s) => errorsOf(s.last_run) },
  ];
  if (ctx.can.write) {
    columns.push({
      label: "Actions",
      value: (s) => h("button", {
        type: "button",
        class: "small",
        disabled: Boolean(s.last_run && ACTIVE.has(s.last_run.status)),
        "aria-label": `Run ${s.location} now`,
        onclick: () => runNow(s),
      }, "Run now"),
    });
  }
  return table(columns, sources, { caption: `Sources of ${name}`, empty: "No sources yet (an operator adds one with ragservice sources add)." });
}

function lastRun(run) {
  if (!run) return h("span", { class: "muted" }, "never run");
  const counts = countsText(run.counts);
  return h("span", { class: "last-run" },
    h("span", { class: `badge ${run.status}` }, run.status), " ",
    timeEl(run.finished_at || run.started_at),
    counts ? h("span", { class: "hint" }, ` · ${counts}`) : "");
}

/** The last run's per-document errors, folded: the count, opened to the list. */
function errorsOf(run) {
  const errors = (run && run.errors) || [];
  if (!errors.length) return "—";
  return h("details", { class: "source" },
    h("summary", {}, `${errors.length} error${errors.length > 1 ? "s" : ""}`),
    h("ul", { class: "errors", "aria-label": "Errors" },
      errors.map((e) => h("li", {}, e.source ? `${e.source}: ${e.error}` : e.error || String(e)))));
}
