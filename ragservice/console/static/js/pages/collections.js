// Collections and documents: create and delete collections; upload files (drag and drop, with
// upload progress, then the job's live status); page through documents; open a document's
// chunks; delete with confirmation. Routes: #/collections, #/collections/NAME,
// #/collections/NAME/documents/EXTERNAL_ID, and #/collections/NAME/sources (sources.js).

import { api, enc, get, uploadFiles, withQuery } from "../api.js";
import {
  alertError, announce, clear, confirmDialog, field, fmtBytes, fmtPages, fmtSeconds, h, table, timeEl,
} from "../dom.js";
import { countsText, jobSummary, watchJob } from "./jobs.js";
import * as sources from "./sources.js";

const PAGE_SIZE = 50;
let formatsLoaded = null; // GET /v1/formats, asked once: the file types an upload may hold

function uploadFormats() {
  formatsLoaded ??= get("/v1/formats").catch((error) => {
    formatsLoaded = null; // asked again next time
    throw error;
  });
  return formatsLoaded;
}

export function render(main, ctx) {
  const [name, sub, externalId] = ctx.params;
  if (!name) listPage(main, ctx);
  else if (sub === "documents" && externalId !== undefined) documentPage(main, ctx, name, externalId);
  else if (sub === "sources") sources.render(main, ctx, name);
  else collectionPage(main, ctx, name);
}

const collectionHash = (name) => `#/collections/${enc(name)}`;
const documentHash = (name, id) => `${collectionHash(name)}/documents/${enc(id)}`;

// -- the list --------------------------------------------------------------------------------

function listPage(main, ctx) {
  const slot = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  main.append(h("h1", {}, "Collections"));
  if (ctx.can.write) main.append(createForm(ctx, () => refresh()));
  main.append(slot);

  async function refresh() {
    try {
      const { collections } = await get("/v1/collections", { signal: ctx.signal });
      clear(slot).append(collectionsTable(ctx, collections, refresh));
    } catch (error) {
      alertError(error);
    }
  }
  refresh();
}

function createForm(ctx, done) {
  const name = h("input", { type: "text", name: "name", required: true, maxlength: "128", pattern: "[A-Za-z0-9][A-Za-z0-9._\\-]{0,127}", autocomplete: "off" });
  const description = h("input", { type: "text", name: "description", maxlength: "2000" });
  const form = h("form", { class: "panel" },
    h("h2", {}, "New collection"),
    h("div", { class: "row" },
      field("Name", name, "Letters, digits, . _ -"),
      field("Description", description)),
    h("div", { class: "actions" }, h("button", { type: "submit", class: "primary" }, "Create collection")));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!name.reportValidity()) return;
    try {
      const body = { name: name.value.trim() };
      if (description.value.trim()) body.description = description.value.trim();
      await api("POST", "/v1/collections", body, { signal: ctx.signal });
      announce(`Collection ${body.name} created.`);
      form.reset();
      done();
    } catch (error) {
      alertError(error);
    }
  });
  return form;
}

function collectionsTable(ctx, collections, refresh) {
  const columns = [
    { label: "Name", value: (c) => h("a", { href: collectionHash(c.name) }, c.name) },
    { label: "Description", value: (c) => c.description || "—" },
    { label: "Documents", num: true, value: (c) => String(c.document_count) },
    { label: "Chunks", num: true, value: (c) => String(c.chunk_count) },
    { label: "Cache lifetime", value: (c) => fmtSeconds(c.cache_ttl_seconds) },
    { label: "Created", value: (c) => timeEl(c.created_at) },
  ];
  if (ctx.can.admin) {
    columns.push({
      label: "Actions",
      value: (c) => h("button", {
        type: "button",
        class: "small danger",
        "aria-label": `Delete collection ${c.name}`,
        onclick: async () => {
          const yes = await confirmDialog({
            title: `Delete collection ${c.name}?`,
            message: `Its ${c.document_count} documents, their chunks and embeddings, its jobs and cached answers are deleted. This cannot be undone.`,
            confirm: "Delete collection",
          });
          if (!yes) return;
          try {
            await api("DELETE", `/v1/collections/${enc(c.name)}`);
            announce(`Collection ${c.name} deleted.`);
            refresh();
          } catch (error) {
            alertError(error);
          }
        },
      }, "Delete"),
    });
  }
  return table(columns, collections, { caption: "Your collections", empty: "No collections yet." });
}

// -- one collection: upload, documents -------------------------------------------------------

function collectionPage(main, ctx, name) {
  const facts = h("p", { class: "muted" }, "Loading…");
  const documentsSlot = h("div", {});
  main.append(h("h1", {}, `Collection ${name}`), facts,
    h("p", {}, h("a", { href: "#/collections" }, "All collections"), " · ",
      h("a", { href: `${collectionHash(name)}/sources` }, "Sources")));
  const pager = { stack: [], after: null };

  async function refreshFacts() {
    try {
      const c = await get(`/v1/collections/${enc(name)}`, { signal: ctx.signal });
      facts.textContent = [c.description, `${c.document_count} documents`, `${c.chunk_count} chunks`,
        `cache lifetime ${fmtSeconds(c.cache_ttl_seconds)}`].filter(Boolean).join(" · ");
    } catch (error) {
      facts.textContent = "";
      alertError(error);
    }
  }

  async function refreshDocuments() {
    try {
      const page = await get(withQuery(`/v1/collections/${enc(name)}/documents`, { limit: PAGE_SIZE, after: pager.after }), { signal: ctx.signal });
      clear(documentsSlot).append(documentsTable(ctx, name, page, pager, refreshAll));
    } catch (error) {
      alertError(error);
    }
  }

  function refreshAll() {
    refreshFacts();
    refreshDocuments();
  }

  if (ctx.can.write) main.append(uploadSection(ctx, name, refreshAll));
  main.append(h("h2", {}, "Documents"), documentsSlot);
  pager.reload = refreshDocuments;
  refreshAll();
}

function uploadSection(ctx, name, landed) {
  const me = ctx.me;
  const input = h("input", { type: "file", id: "upload-files", multiple: true });
  let suffixes = []; // until the server says which: none refused here (the server checks too)
  const chosen = h("ul", { class: "files", "aria-label": "Files to upload" });
  const progress = h("progress", { id: "upload-progress", max: "100", value: "0", hidden: true });
  const progressLabel = h("label", { for: progress.id, hidden: true }, "Upload progress");
  const uploadButton = h("button", { type: "submit", class: "primary", disabled: true }, "Upload");
  const jobSlot = h("div", { class: "job-status" }); // its end is announced, not each poll
  let files = [];

  const hintText = () => `or drop them here (${suffixes.length ? `${suffixes.join(" ")}; ` : ""}up to ${fmtBytes(me.max_file_bytes)} each, ${me.max_files_per_upload} at once)`;
  const hint = h("p", { class: "hint" }, hintText());
  const zone = h("div", { class: "dropzone" },
    h("label", { for: input.id }, "Choose files"),
    input,
    hint);
  uploadFormats().then((formats) => {
    suffixes = formats.suffixes;
    input.accept = suffixes.join(",");
    hint.textContent = hintText();
  }, alertError);

  function choose(list) {
    files = [...list];
    clear(chosen);
    const problems = [];
    for (const file of files) {
      const okType = !suffixes.length || suffixes.some((suffix) => file.name.toLowerCase().endsWith(suffix));
      if (!okType) problems.push(`${file.name}: unsupported file type`);
      if (file.size > me.max_file_bytes) problems.push(`${file.name}: larger than ${fmtBytes(me.max_file_bytes)}`);
      chosen.append(h("li", {}, `${file.name} (${fmtBytes(file.size)})`));
    }
    if (files.length > me.max_files_per_upload) problems.push(`more than ${me.max_files_per_upload} files`);
    uploadButton.disabled = !files.length || problems.length > 0;
    if (problems.length) alertError(new Error(`Cannot upload: ${problems.join("; ")}`));
    else if (files.length) announce(`${files.length} file${files.length > 1 ? "s" : ""} chosen.`);
  }

  input.addEventListener("change", () => choose(input.files));
  zone.addEventListener("dragover", (event) => {
    event.preventDefault();
    zone.classList.add("over");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("over");
    if (event.dataTransfer && event.dataTransfer.files.length) choose(event.dataTransfer.files);
  });

  const form = h("form", { class: "panel" }, h("h2", {}, "Upload files"), zone, chosen,
    progressLabel, progress, h("div", { class: "actions" }, uploadButton), jobSlot);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!files.length) return;
    uploadButton.disabled = true;
    progress.hidden = progressLabel.hidden = false;
    progress.value = 0;
    try {
      const job = await uploadFiles(name, files, (loaded, total) => {
        if (total) progress.value = Math.round((loaded / total) * 100);
      }, { signal: ctx.signal });
      progress.value = 100;
      announce(`Uploaded ${files.length} file${files.length > 1 ? "s" : ""}; ingest job queued.`);
      files = [];
      clear(chosen);
      input.value = "";
      const status = h("span", {});
      clear(jobSlot).append(h("div", {}, h("a", { href: "#/jobs" }, "Ingest job"), ": ", status));
      const finished = await watchJob(job, (current) => {
        clear(status).append(jobSummary(current));
      }, ctx.signal);
      announce(`Ingest job ${finished.status}: ${countsText(finished.counts) || "nothing to do"}.`);
      landed();
    } catch (error) {
      alertError(error);
    } finally {
      progress.hidden = progressLabel.hidden = true;
      uploadButton.disabled = !files.length;
    }
  });
  return form;
}

function documentsTable(ctx, name, page, pager, changed) {
  const columns = [
    { label: "Document", value: (d) => h("a", { href: documentHash(name, d.external_id) }, d.external_id) },
    { label: "Title", value: (d) => d.title || "—" },
    { label: "Readers", value: (d) => (d.readers ? d.readers.join(", ") : "whole tenant") },
    { label: "Chunks", num: true, value: (d) => String(d.chunk_count) },
    { label: "Characters", num: true, value: (d) => d.char_count.toLocaleString() },
    { label: "Updated", value: (d) => timeEl(d.updated_at) },
  ];
  if (ctx.can.write) {
    columns.push({
      label: "Actions",
      value: (d) => h("button", {
        type: "button",
        class: "small danger",
        "aria-label": `Delete document ${d.external_id}`,
        onclick: async () => {
          if (await deleteDocument(name, d.external_id)) changed();
        },
      }, "Delete"),
    });
  }
  const previous = h("button", { type: "button", disabled: !pager.stack.length }, "Previous page");
  const next = h("button", { type: "button", disabled: !page.next_after }, "Next page");
  previous.addEventListener("click", () => {
    pager.after = pager.stack.pop() ?? null;
    pager.reload();
  });
  next.addEventListener("click", () => {
    pager.stack.push(pager.after);
    pager.after = page.next_after;
    pager.reload();
  });
  return h("div", {},
    table(columns, page.documents, { caption: `Documents of ${name}`, empty: "No documents yet." }),
    h("nav", { class: "actions", "aria-label": "Document pages" }, previous, next));
}

async function deleteDocument(name, externalId) {
  const yes = await confirmDialog({
    title: `Delete document ${externalId}?`,
    message: "Its chunks and embeddings are deleted, and cached answers built from it are dropped. This cannot be undone.",
    confirm: "Delete document",
  });
  if (!yes) return false;
  try {
    await api("DELETE", `/v1/collections/${enc(name)}/documents/${enc(externalId)}`);
    announce(`Document ${externalId} deleted.`);
    return true;
  } catch (error) {
    alertError(error);
    return false;
  }
}

// -- one document and its chunks ---------------------------------------------------------------

function documentPage(main, ctx, name, externalId) {
  const heading = h("h1", {}, externalId);
  const slot = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  main.append(heading, h("p", {}, h("a", { href: collectionHash(name) }, `Back to collection ${name}`)), slot);
  (async () => {
    try {
      const doc = await get(withQuery(`/v1/collections/${enc(name)}/documents/${enc(externalId)}`, { chunks: "true" }), { signal: ctx.signal });
      heading.textContent = doc.title || doc.external_id;
      clear(slot).append(
        h("dl", { class: "facts panel" },
          h("dt", {}, "External id"), h("dd", {}, doc.external_id),
          h("dt", {}, "Title"), h("dd", {}, doc.title || "—"),
          h("dt", {}, "Source"), h("dd", {}, doc.source || "—"),
          h("dt", {}, "Version"), h("dd", {}, String(doc.version)),
          h("dt", {}, "Size"), h("dd", {}, `${doc.chunk_count} chunks, ${doc.char_count.toLocaleString()} characters`),
          h("dt", {}, "Updated"), h("dd", {}, timeEl(doc.updated_at)),
          h("dt", {}, "Metadata"), h("dd", {}, h("pre", {}, JSON.stringify(doc.metadata, null, 2)))),
        ctx.can.write ? h("div", { class: "actions" }, h("button", {
          type: "button",
          class: "danger",
          onclick: async () => {
            if (await deleteDocument(name, doc.external_id)) ctx.navigate(collectionHash(name));
          },
        }, "Delete document")) : null,
        h("h2", {}, "Chunks"),
        h("ol", { class: "sources" }, (doc.chunks || []).map((chunk) => h("li", { class: "panel" },
          h("p", { class: "hint" }, [`Chunk ${chunk.ordinal}`, fmtPages(chunk.pages), `${chunk.token_count} tokens`,
            `characters ${chunk.start_char}–${chunk.end_char}`].filter(Boolean).join(" · ")),
          h("p", { class: "passage" }, chunk.text)))));
    } catch (error) {
      clear(slot);
      alertError(error);
    }
  })();
}
