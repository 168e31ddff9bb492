// The REST API, as the console calls it: JSON requests, the streamed answer (server-sent events
// read from a fetch body, since EventSource cannot POST) and uploads with progress (XHR).
// The API key lives in sessionStorage: this tab only, gone when it closes.

const KEY_NAME = "ragservice.apiKey";

export function getKey() {
  return sessionStorage.getItem(KEY_NAME);
}

export function setKey(key) {
  sessionStorage.setItem(KEY_NAME, key);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY_NAME);
}

/** An error the API answered (its `error`, `detail` and `request_id`), or a network failure. */
export class ApiError extends Error {
  constructor(status, error, detail, requestId = null) {
    super(detail);
    this.name = "ApiError";
    this.status = status;
    this.error = error;
    this.detail = detail;
    this.requestId = requestId;
  }
}

let unauthorized = () => {};

/** `handler(error)` runs when a call is refused with 401 (a revoked or expired key). */
export function onUnauthorized(handler) {
  unauthorized = handler;
}

function headers(extra = {}) {
  const result = new Headers(extra);
  const key = getKey();
  if (key) result.set("Authorization", `Bearer ${key}`);
  return result;
}

function fromBody(status, statusText, body) {
  const detail = body && typeof body.detail === "string" ? body.detail : `${status} ${statusText}`.trim();
  const error = new ApiError(status, (body && body.error) || "HTTP", detail, body && body.request_id);
  if (status === 401) unauthorized(error);
  return error;
}

async function errorOf(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  return fromBody(response.status, response.statusText, body);
}

function networkError(error) {
  if (error && error.name === "AbortError") return error;
  return new ApiError(0, "Network", `the service did not answer (${error.message || error})`);
}

export const enc = encodeURIComponent;

/** `method path` with a JSON body (when given); resolves to the parsed reply (null for 204). */
export async function api(method, path, body, { signal } = {}) {
  const init = { method, signal, headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }) };
  if (body !== undefined) init.body = JSON.stringify(body);
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    throw networkError(error);
  }
  if (!response.ok) throw await errorOf(response);
  if (response.status === 204) return null;
  const type = response.headers.get("content-type") || "";
  return type.includes("json") ? response.json() : response.text();
}

export const get = (path, options) => api("GET", path, undefined, options);

/** A path with its query string, leaving out null/undefined/"" parameters. */
export function withQuery(path, params) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== "") query.set(key, String(value));
  }
  const text = query.toString();
  return text ? `${path}?${text}` : path;
}

/**
 * Server-sent events from `text`: the complete events and what is left of an unfinished one.
 * Lines end in \n, \r\n or \r; `data:` lines join with \n; comments and other fields are skipped.
 */
export function parseEvents(text) {
  const events = [];
  // A trailing \r may be the first half of \r\n: keep it for the next read.
  const complete = text.endsWith("\r") ? text.slice(0, -1) : text;
  const held = text.slice(complete.length);
  const lines = complete.split(/\r\n|\r|\n/);
  const rest = lines.pop(); // the unfinished last line ("" when the text ended a line)
  let name = "message";
  let data = [];
  let start = 0;
  let consumed = 0;
  for (let i = 0; i < lines.length; i += 1) {
    const line = lines[i];
    if (line === "") {
      if (data.length) events.push({ event: name, data: data.join("\n") });
      name = "message";
      data = [];
      start = i + 1;
      consumed = start;
      continue;
    }
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const fieldName = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (fieldName === "event") name = value;
    else if (fieldName === "data") data.push(value);
  }
  const pending = lines.slice(consumed);
  const leftover = pending.length ? `${pending.join("\n")}\n${rest}` : rest;
  return { events, rest: leftover + held };
}

/**
 * Ask with `stream: true`; `on.token(text)`, `on.citations({citations, sources})` and
 * `on.done(rest)` run as the events arrive. An `error` event rejects with its ApiError.
 */
export async function streamQuery(body, on, { signal } = {}) {
  let response;
  try {
    response = await fetch("/v1/query", {
      method: "POST",
      signal,
      headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream" }),
      body: JSON.stringify({ ...body, stream: true }),
    });
  } catch (error) {
    throw networkError(error);
  }
  if (!response.ok) throw await errorOf(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let finished = false;
  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch (error) {
      throw networkError(error);
    }
    if (chunk.done) break;
    const parsed = parseEvents(buffer + chunk.value);
    buffer = parsed.rest;
    for (const { event, data } of parsed.events) {
      const payload = JSON.parse(data);
      if (event === "token") on.token(payload.text);
      else if (event === "citations") on.citations(payload);
      else if (event === "done") {
        finished = true;
        on.done(payload);
      } else if (event === "error") throw fromBody(0, "", payload);
    }
  }
  if (!finished) throw new ApiError(0, "Network", "the answer's stream ended early");
}

/** Upload `files` to a collection (multipart field `files`); `onProgress(loaded, total)`. */
export function uploadFiles(collection, files, onProgress, { signal } = {}) {
  return new Promise((resolve, reject) => {
    const form = new FormData();
    for (const file of files) form.append("files", file, file.name);
    const xhr = new XMLHttpRequest();
    xhr.open("POST", `/v1/collections/${enc(collection)}/documents/files`);
    const key = getKey();
    if (key) xhr.setRequestHeader("Authorization", `Bearer ${key}`);
    xhr.upload.addEventListener("progress", (event) => {
      onProgress(event.loaded, event.lengthComputable ? event.total : null);
    });
    xhr.addEventListener("load", () => {
      let body = null;
      try {
        body = JSON.parse(xhr.responseText);
      } catch {
        body = null;
      }
      if (xhr.status >= 200 && xhr.status < 300) resolve(body);
      else reject(fromBody(xhr.status, xhr.statusText, body));
    });
    xhr.addEventListener("error", () => reject(new ApiError(0, "Network", "the upload failed: the service did not answer")));
    xhr.addEventListener("abort", () => reject(new DOMException("upload cancelled", "AbortError")));
    if (signal) signal.addEventListener("abort", () => xhr.abort(), { once: true });
    xhr.send(form);
  });
}
