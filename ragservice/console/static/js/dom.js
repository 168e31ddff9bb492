// DOM helpers. Text from documents, answers, questions and file names is untrusted: it only
// ever becomes text nodes or attribute values here, never markup (there is no innerHTML in the
// console), and the page's Content-Security-Policy would refuse inline script and style anyway.

const PROPERTIES = new Set([
  "value", "checked", "disabled", "open", "selected", "hidden", "multiple", "required",
  "indeterminate", "max", "min",
]);

function set(el, key, value) {
  if (value === undefined || value === null || value === false) return;
  if (key === "style" || key === "innerHTML" || key === "outerHTML") {
    throw new Error(`${key} is not allowed (CSP and untrusted text): use classes and text`);
  }
  if (key === "class") el.setAttribute("class", value);
  else if (key === "text") el.textContent = String(value);
  else if (key.startsWith("on") && typeof value === "function") {
    el.addEventListener(key.slice(2).toLowerCase(), value);
  } else if (key === "dataset") Object.assign(el.dataset, value);
  else if (PROPERTIES.has(key) && key in el) el[key] = value;
  else el.setAttribute(key, value === true ? "" : String(value));
}

export function append(el, ...children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : String(child)); // a string becomes a text node
  }
  return el;
}

/** An HTML element: `h("button", {type: "button", onclick}, "Delete")`. */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) set(el, key, value);
  return append(el, ...children);
}

const SVG = "http://www.w3.org/2000/svg";

/** An SVG element, for the charts. */
export function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) set(el, key, value);
  return append(el, ...children);
}

export function clear(el) {
  el.replaceChildren();
  return el;
}

let ids = 0;
/** A fresh id for label/aria wiring. */
export function uid(prefix = "id") {
  ids += 1;
  return `${prefix}-${ids}`;
}

/** A labelled control: `[label, control]`, wired with a fresh id. */
export function field(labelText, control, hint) {
  control.id ||= uid("field");
  const parts = [h("label", { for: control.id }, labelText)];
  if (hint) {
    const hintEl = h("p", { class: "hint", id: uid("hint") }, hint);
    control.setAttribute("aria-describedby", hintEl.id);
    parts.push(control, hintEl);
  } else parts.push(control);
  return h("div", { class: "field" }, parts);
}

/** A table from column definitions: {label, value(row) → text|Node, num?}. Narrow screens show
 * each row as a card whose cells are labelled by their column (CSS `data-label`). */
export function table(columns, rows, { caption, empty = "Nothing yet.", className = "" } = {}) {
  if (!rows.length) return h("p", { class: "muted" }, empty);
  const head = h("tr", {}, columns.map((c) => h("th", { scope: "col", class: c.num ? "num" : null }, c.label)));
  const body = rows.map((row) =>
    h("tr", {}, columns.map((c) =>
      h("td", { class: c.num ? "num" : null, "data-label": c.label || null }, c.value(row)))));
  return h("div", { class: "table-wrap" },
    h("table", { class: `stack ${className}`.trim() },
      caption ? h("caption", {}, caption) : null,
      h("thead", {}, head), h("tbody", {}, body)));
}

const statusEl = () => document.getElementById("status");
const alertEl = () => document.getElementById("alert");

/** A message for everyone, screen readers included (a polite live region). */
export function announce(message) {
  alertEl().textContent = "";
  statusEl().textContent = message;
}

/** An error, read out at once (role=alert); `error` may be an ApiError or any Error. */
export function alertError(error) {
  if (error && error.name === "AbortError") return;
  statusEl().textContent = "";
  alertEl().textContent = errorText(error);
}

export function clearMessages() {
  statusEl().textContent = "";
  alertEl().textContent = "";
}

export function errorText(error) {
  if (!error) return "Something went wrong.";
  if (error.detail) return `${error.detail}${error.status ? ` (${error.status})` : ""}`;
  return error.message || String(error);
}

/**
 * Ask before doing something that cannot be undone: a modal <dialog> (Escape or Cancel says no;
 * focus starts on Cancel and returns to where it was). Resolves to null when cancelled, else to
 * {force} when `force` (a checkbox label) is offered, else {}.
 */
export function confirmDialog({ title, message, confirm, danger = true, force = null }) {
  return new Promise((resolve) => {
    const titleId = uid("dialog-title");
    const forceBox = force ? h("input", { type: "checkbox", id: uid("force") }) : null;
    const cancel = h("button", { type: "button", autofocus: true }, "Cancel");
    const ok = h("button", { type: "button", class: danger ? "primary danger" : "primary" }, confirm);
    const dialog = h("dialog", { "aria-labelledby": titleId },
      h("h2", { id: titleId }, title),
      h("p", {}, message),
      forceBox ? h("p", {}, h("label", { class: "inline", for: forceBox.id }, forceBox, force)) : null,
      h("div", { class: "actions" }, cancel, ok));
    const opener = document.activeElement;
    let answer = null;
    cancel.addEventListener("click", () => dialog.close());
    ok.addEventListener("click", () => {
      answer = forceBox ? { force: forceBox.checked } : {};
      dialog.close();
    });
    dialog.addEventListener("close", () => {
      dialog.remove();
      if (opener instanceof HTMLElement && opener.isConnected) opener.focus();
      resolve(answer);
    });
    document.body.append(dialog);
    dialog.showModal();
    cancel.focus();
  });
}

// -- formatting -------------------------------------------------------------------------------

export function fmtDate(iso) {
  if (!iso) return "—";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? String(iso) : date.toLocaleString();
}

export function timeEl(iso) {
  return iso ? h("time", { datetime: iso }, fmtDate(iso)) : "—";
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${unit ? value.toFixed(1) : value} ${units[unit]}`;
}

export function fmtMs(ms) {
  if (ms === null || ms === undefined) return "—";
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(ms < 10 ? 1 : 0)} ms`;
}

export function fmtPct(fraction) {
  if (fraction === null || fraction === undefined) return "—";
  return `${(fraction * 100).toFixed(fraction < 0.1 && fraction > 0 ? 1 : 0)} %`;
}

export function fmtSeconds(seconds) {
  if (seconds === null || seconds === undefined) return "service default";
  const units = [["d", 86400], ["h", 3600], ["min", 60]];
  for (const [name, size] of units) {
    if (seconds >= size && seconds % size === 0) return `${seconds / size} ${name}`;
  }
  return `${seconds} s`;
}

export function fmtPages(pages) {
  if (!pages || !pages.length) return null;
  const first = pages[0];
  const last = pages[pages.length - 1];
  return first === last ? `p. ${first}` : `pp. ${first}–${last}`;
}

export function shortId(id) {
  return String(id).slice(0, 8);
}
