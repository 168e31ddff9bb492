// Cache (admins): a collection's cached answers, hit rate and lifetime; set the lifetime of new
// entries; purge every entry with confirmation.

import { api, enc, get, withQuery } from "../api.js";
import {
  alertError, announce, clear, confirmDialog, field, fmtBytes, fmtPct, fmtSeconds, h, table, timeEl,
} from "../dom.js";

let remembered = "";
const clip = (text, n = 200) => (text && text.length > n ? `${text.slice(0, n)}…` : text || "—"); // the collection last shown, kept while the tab lives

export function render(main, ctx) {
  main.append(h("h1", {}, "Cache"));
  if (!ctx.me.cache_enabled) {
    main.append(h("p", {}, "The prompt cache is off on this server (RAGSERVICE_CACHE_ENABLED=false)."));
    return;
  }
  const select = h("select", { name: "collection" });
  const slot = h("div", {});
  main.append(h("form", { class: "panel row", onsubmit: (event) => event.preventDefault() }, field("Collection", select)), slot);
  select.addEventListener("change", () => {
    remembered = select.value;
    show(ctx, select.value, slot);
  });
  (async () => {
    try {
      const { collections } = await get("/v1/collections", { signal: ctx.signal });
      if (!collections.length) {
        slot.append(h("p", { class: "muted" }, "No collections yet."));
        return;
      }
      for (const c of collections) select.append(h("option", { value: c.name, selected: c.name === remembered }, c.name));
      show(ctx, select.value, slot);
    } catch (error) {
      alertError(error);
    }
  })();
}

async function show(ctx, name, slot) {
  clear(slot).append(h("p", { class: "muted" }, "Loading…"));
  const base = `/v1/collections/${enc(name)}`;
  try {
    const [stats, entries, collection] = await Promise.all([
      get(`${base}/cache`, { signal: ctx.signal }),
      get(withQuery(`${base}/cache/entries`, { limit: 50 }), { signal: ctx.signal }),
      get(base, { signal: ctx.signal }),
    ]);
    const reload = () => show(ctx, name, slot);
    clear(slot).append(
      h("h2", {}, "Statistics"),
      h("dl", { class: "facts panel" },
        h("dt", {}, "Hit rate"), h("dd", { id: "cache-hit-rate" }, `${fmtPct(stats.hit_rate)} (${stats.cache_hits} of ${stats.queries} questions)`),
        h("dt", {}, "Live entries"), h("dd", { id: "cache-entries" }, String(stats.entries)),
        h("dt", {}, "Size"), h("dd", {}, fmtBytes(stats.bytes)),
        h("dt", {}, "Hits served by live entries"), h("dd", {}, String(stats.entry_hits)),
        h("dt", {}, "Lifetime"), h("dd", {}, entries.ttl_seconds == null
          ? `${fmtSeconds(entries.default_ttl_seconds)} (the service default)`
          : fmtSeconds(entries.ttl_seconds))),
      ttlForm(name, collection.cache_ttl_seconds, reload),
      h("h2", {}, "Entries"),
      table([
        { label: "Question", value: (e) => e.question },
        { label: "Answer", value: (e) => clip(e.answer) },
        { label: "Model", value: (e) => e.model },
        { label: "Created", value: (e) => timeEl(e.created_at) },
        { label: "Expires", value: (e) => timeEl(e.expires_at) },
        { label: "Hits", num: true, value: (e) => String(e.hits) },
        { label: "Last hit", value: (e) => timeEl(e.last_hit_at) },
        { label: "Size", num: true, value: (e) => fmtBytes(e.bytes) },
      ], entries.entries, { caption: `Cached answers of ${name} (newest 50)`, empty: "No cached answers." }),
      h("div", { class: "actions" }, h("button", {
        type: "button",
        class: "danger",
        onclick: () => purge(name, stats.entries, reload),
      }, "Purge cache")));
  } catch (error) {
    clear(slot);
    alertError(error);
  }
}

function ttlForm(name, current, reload) {
  const seconds = h("input", { type: "number", name: "ttl", min: "1", step: "1", value: current ?? "" });
  const useDefault = h("button", { type: "button" }, "Use the service default");
  const form = h("form", { class: "panel" },
    field("Lifetime of new entries (seconds)", seconds, "Entries already cached keep their expiry."),
    h("div", { class: "actions" }, h("button", { type: "submit", class: "primary" }, "Save lifetime"), useDefault));
  async function save(value) {
    try {
      await api("PATCH", `/v1/collections/${enc(name)}`, { cache_ttl_seconds: value });
      announce(`Cache lifetime of ${name}: ${fmtSeconds(value)}.`);
      reload();
    } catch (error) {
      alertError(error);
    }
  }
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (!seconds.reportValidity()) return;
    save(seconds.value ? Number(seconds.value) : null);
  });
  useDefault.addEventListener("click", () => save(null));
  return form;
}

async function purge(name, entries, reload) {
  const yes = await confirmDialog({
    title: `Purge the cache of ${name}?`,
    message: `All ${entries} cached answers covering ${name} are deleted; the next questions are answered afresh.`,
    confirm: "Purge",
  });
  if (!yes) return;
  try {
    const { purged } = await api("DELETE", `/v1/collections/${enc(name)}/cache`);
    announce(`Purged ${purged} cached answer${purged === 1 ? "" : "s"}.`);
    reload();
  } catch (error) {
    alertError(error);
  }
}
