// Models (admins): the embedding model versions with their held-out evaluation figures;
// service admins activate one or roll back, with a confirmation.

import { api, get } from "../api.js";
import { alertError, announce, clear, confirmDialog, h, table, timeEl } from "../dom.js";

export function render(main, ctx) {
  const slot = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  main.append(h("h1", {}, "Models"), slot);
  const refresh = () => show(ctx, slot, refresh);
  refresh();
}

function figures(heldOut) {
  if (!heldOut) return "—";
  const before = heldOut.before || {};
  const after = heldOut.after || {};
  const metrics = [...new Set([...Object.keys(before), ...Object.keys(after)])];
  if (!metrics.length) return "—";
  const fmt = (v) => (typeof v === "number" ? v.toFixed(3) : "—");
  return h("ul", { class: "timings" }, metrics.map((m) => h("li", {}, `${m} ${fmt(before[m])} → ${fmt(after[m])}`)));
}

async function show(ctx, slot, refresh) {
  try {
    const data = await get("/v1/admin/models", { signal: ctx.signal });
    const canSwitch = data.can_switch; // the service admin's alone: every tenant shares the model
    const columns = [
      { label: "Model", value: (m) => `${m.name}:${m.version}` },
      { label: "State", value: (m) => (m.active ? h("span", { class: "badge active" }, "active") : "inactive") },
      { label: "Dimension", num: true, value: (m) => String(m.dimension) },
      { label: "Storage", value: (m) => m.storage },
      { label: "Embedded chunks", num: true, value: (m) => `${m.embedded} / ${m.chunks}` },
      { label: "Base", value: (m) => m.base || "—" },
      { label: "Held-out (before → after)", value: (m) => figures(m.held_out) },
      { label: "Created", value: (m) => timeEl(m.created) },
    ];
    if (canSwitch) {
      columns.push({
        label: "Actions",
        value: (m) => (m.active ? "" : h("button", {
          type: "button",
          class: "small",
          "aria-label": `Activate ${m.name}:${m.version}`,
          onclick: () => switchModel(`Activate ${m.name}:${m.version}?`,
            "Searches and new documents use this version from then on; answers cached for the previous one are not served.",
            "Activate", (force) => api("POST", "/v1/admin/models/activate", { model: `${m.name}:${m.version}`, force }), refresh),
        }, "Activate")),
      });
    }
    clear(slot).append(
      table(columns, data.models, { caption: "Embedding model versions", empty: "No models registered." }),
      canSwitch ? h("div", { class: "actions" }, h("button", {
        type: "button",
        onclick: () => switchModel("Roll back to the previous model?",
          "The version active before this one is activated again.",
          "Roll back", (force) => api("POST", "/v1/admin/models/rollback", { force }), refresh),
      }, "Roll back")) : h("p", { class: "hint" },
        "Every tenant shares the embedding model: only the service admin (an admin key of the default tenant) activates a version or rolls back."));
  } catch (error) {
    clear(slot);
    alertError(error);
  }
}

async function switchModel(title, message, confirm, call, refresh) {
  const answer = await confirmDialog({ title, message, confirm, danger: false, force: "Even when chunks lack its embeddings (force)" });
  if (!answer) return;
  try {
    const result = await call(answer.force);
    const name = `${result.model.name}:${result.model.version}`;
    announce(result.changed ? `${name} is active; servers switch once they have loaded it.` : `${name} was already active.`);
    refresh();
  } catch (error) {
    alertError(error);
  }
}
