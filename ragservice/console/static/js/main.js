// The console's shell: who is calling (GET /v1/me), the API key prompt, the navigation and a
// small hash router (#/ask, #/collections, #/collections/NAME, #/jobs, #/cache, #/insights,
// #/models). Each page is a module whose `render(main, ctx)` builds its DOM; a page left is
// told through `ctx.signal` (its requests abort, its timers stop).

import { ApiError, forgetKey, get, getKey, onUnauthorized, setKey } from "./api.js";
import { alertError, announce, clear, clearMessages, errorText, field, h } from "./dom.js";
import * as ask from "./pages/ask.js";
import * as cache from "./pages/cache.js";
import * as collections from "./pages/collections.js";
import * as insights from "./pages/insights.js";
import * as jobs from "./pages/jobs.js";
import * as models from "./pages/models.js";

const isAdmin = (me) => me.role === "admin";

/** The pages, in the navigation's order; `allowed(me)`: whether the role may see it. */
const PAGES = [
  { path: "ask", title: "Ask", page: ask, allowed: () => true },
  { path: "collections", title: "Collections", page: collections, allowed: () => true },
  { path: "jobs", title: "Jobs", page: jobs, allowed: () => true },
  { path: "cache", title: "Cache", page: cache, allowed: isAdmin },
  { path: "insights", title: "Insights", page: insights, allowed: isAdmin },
  { path: "models", title: "Models", page: models, allowed: isAdmin },
];

const main = document.getElementById("main");
let me = null;
let leaving = null; // aborts the current page's work when another one is shown

/** The role's abilities, as the pages ask them. */
function abilities(who) {
  const rank = { reader: 0, writer: 1, admin: 2 }[who.role] ?? 0;
  return {
    write: rank >= 1, // upload and delete documents, create collections, retry jobs
    admin: rank >= 2, // delete collections, cache, insights, models (switching them: see models.js)
  };
}

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const parts = raw.split("/").filter(Boolean).map((part) => {
    try {
      return decodeURIComponent(part);
    } catch {
      return part;
    }
  });
  return { path: parts[0] || "ask", params: parts.slice(1) };
}

function renderNav(current) {
  const list = document.getElementById("nav-list");
  clear(list);
  for (const entry of PAGES.filter((p) => p.allowed(me))) {
    const link = h("a", { href: `#/${entry.path}` }, entry.title);
    if (entry.path === current) link.setAttribute("aria-current", "page");
    list.append(h("li", {}, link));
  }
  document.getElementById("nav").hidden = false;
}

function renderWho() {
  const who = document.getElementById("who");
  clear(who);
  const tenant = me.tenant ? me.tenant.name : "?";
  who.append(h("span", {}, `${tenant} · ${me.role}${me.auth_disabled ? " (authentication off)" : ""}`));
  if (getKey()) {
    who.append(h("button", { type: "button", class: "small", onclick: signOut }, "Forget key"));
  }
}

function route() {
  if (!me) return;
  if (leaving) leaving.abort();
  leaving = new AbortController();
  const { path, params } = parseHash();
  const entry = PAGES.find((p) => p.path === path);
  clearMessages();
  clear(main);
  if (!entry || !entry.allowed(me)) {
    renderNav(null);
    document.title = "Not found · ragservice console";
    main.append(h("h1", { tabindex: "-1" }, "Not found"),
      h("p", {}, entry ? "Your key's role may not see this page." : "There is no such page."),
      h("p", {}, h("a", { href: "#/ask" }, "Go to Ask")));
  } else {
    renderNav(entry.path);
    document.title = `${entry.title} · ragservice console`;
    try {
      entry.page.render(main, { me, can: abilities(me), params, signal: leaving.signal, navigate });
    } catch (error) {
      alertError(error);
    }
  }
  const heading = main.querySelector("h1");
  if (heading) {
    heading.setAttribute("tabindex", "-1");
    heading.focus();
  }
}

function navigate(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

function showKeyForm(reason) {
  if (leaving) leaving.abort();
  me = null;
  document.getElementById("nav").hidden = true;
  clear(document.getElementById("who"));
  clearMessages();
  clear(main);
  document.title = "API key · ragservice console";
  const input = h("input", { type: "password", name: "api-key", autocomplete: "off", spellcheck: "false", required: true });
  const problem = h("p", { class: "error", role: "alert", hidden: !reason }, reason || "");
  const form = h("form", { class: "panel", novalidate: true },
    field("API key", input, "Kept for this browser tab only (sessionStorage) and sent to this service alone."),
    h("div", { class: "actions" }, h("button", { type: "submit", class: "primary" }, "Use key")));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = input.value.trim();
    if (!key) {
      problem.hidden = false;
      problem.textContent = "Type or paste an API key (it starts with rsk_).";
      input.focus();
      return;
    }
    setKey(key);
    const error = await boot();
    if (error) {
      forgetKey();
      problem.hidden = false;
      problem.textContent = `The key was refused: ${errorText(error)}`;
      input.focus();
    }
  });
  const heading = h("h1", { tabindex: "-1" }, "Sign in with an API key");
  main.append(heading, h("p", {}, "This service needs an API key of yours to show its data."), problem, form);
  input.focus();
}

function signOut() {
  forgetKey();
  showKeyForm(null);
  announce("The key is forgotten.");
}

/** Who is calling; the key prompt on 401. Returns the 401's error, if any, for the prompt. */
async function boot() {
  let who;
  try {
    who = await get("/v1/me");
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) return error;
    clear(main);
    main.append(h("h1", { tabindex: "-1" }, "The console could not start"),
      h("p", { class: "error" }, errorText(error)));
    return null;
  }
  me = who;
  renderWho();
  route();
  return null;
}

onUnauthorized((error) => {
  // A key revoked or expired meanwhile: ask again (the failing call shows nothing itself).
  if (me && getKey()) {
    forgetKey();
    showKeyForm(`The service refused the key: ${error.detail}`);
  }
});

document.getElementById("skip-link").addEventListener("click", (event) => {
  event.preventDefault();
  (main.querySelector("h1") || main).focus();
});
window.addEventListener("hashchange", route);
boot().then((refused) => {
  if (!refused) return;
  const hadKey = Boolean(getKey());
  forgetKey();
  showKeyForm(hadKey ? `The service refused the key: ${refused.detail}` : null);
});
