// Ask: pick collections, ask, watch the answer stream in; numbered citations open their
// passage; the cache outcome and stage timings; feedback (thumbs or stars, passages judged
// relevant or not, a corrected answer) stored with POST /v1/feedback.

import { api, get, streamQuery } from "../api.js";
import { alertError, announce, clear, field, fmtMs, fmtPages, h, uid } from "../dom.js";

const chosen = new Set(); // the collections ticked, kept while the tab lives

export function render(main, ctx) {
  const question = h("textarea", { name: "question", rows: "3", required: true, maxlength: "4000" });
  const choices = h("div", { class: "collections-choice" }, h("span", { class: "muted" }, "Loading collections…"));
  const askButton = h("button", { type: "submit", class: "primary" }, "Ask");
  const stopButton = h("button", { type: "button", hidden: true }, "Stop");
  const form = h("form", { class: "panel" },
    h("fieldset", {}, h("legend", {}, "Collections"),
      h("p", { class: "hint" }, "None ticked: all of your collections."), choices),
    field("Question", question, "Ctrl+Enter asks too."),
    h("div", { class: "actions" }, askButton, stopButton));

  const answerHeading = h("h2", { id: uid("answer-heading") }, "Answer");
  const answerText = h("div", { id: "answer", class: "answer", "aria-live": "polite", "aria-busy": "false", "aria-labelledby": answerHeading.id });
  const meta = h("div", { class: "meta" });
  const sourcesHeading = h("h2", { id: uid("sources-heading") }, "Sources");
  const sourcesList = h("ol", { class: "sources", "aria-labelledby": sourcesHeading.id });
  const feedbackSlot = h("div", {});
  const result = h("section", { "aria-labelledby": answerHeading.id, hidden: true },
    answerHeading, answerText, meta, sourcesHeading, sourcesList, feedbackSlot);

  main.append(h("h1", {}, "Ask"), form, result);
  loadCollections(choices, ctx.signal);

  question.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      form.requestSubmit();
    }
  });

  let running = null;
  stopButton.addEventListener("click", () => running && running.abort());
  ctx.signal.addEventListener("abort", () => running && running.abort());

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = question.value.trim();
    if (!text) {
      alertError(new Error("Type a question first."));
      question.focus();
      return;
    }
    running = new AbortController();
    const view = { answerText, meta, sourcesList, feedbackSlot };
    resetView(view);
    result.hidden = false;
    askButton.disabled = true;
    stopButton.hidden = false;
    answerText.setAttribute("aria-busy", "true");
    announce("Asking…");
    try {
      await ask({ question: text, collections: chosen.size ? [...chosen] : undefined }, view, running.signal);
    } catch (error) {
      if (error.name === "AbortError") announce("Stopped.");
      else alertError(error);
    } finally {
      answerText.setAttribute("aria-busy", "false");
      askButton.disabled = false;
      stopButton.hidden = true;
      running = null;
    }
  });
}

async function loadCollections(choices, signal) {
  try {
    const { collections } = await get("/v1/collections", { signal });
    clear(choices);
    if (!collections.length) {
      choices.append(h("span", { class: "muted" }, "No collections yet: create one and upload documents first."));
      return;
    }
    for (const name of [...chosen]) if (!collections.some((c) => c.name === name)) chosen.delete(name);
    for (const collection of collections) {
      const box = h("input", { type: "checkbox", id: uid("collection"), value: collection.name, checked: chosen.has(collection.name) });
      box.addEventListener("change", () => (box.checked ? chosen.add(collection.name) : chosen.delete(collection.name)));
      choices.append(h("label", { class: "inline", for: box.id }, box, collection.name));
    }
  } catch (error) {
    clear(choices);
    alertError(error);
  }
}

function resetView({ answerText, meta, sourcesList, feedbackSlot }) {
  clear(answerText);
  clear(meta);
  clear(sourcesList);
  clear(feedbackSlot);
}

async function ask(body, view, signal) {
  let sources = [];
  let cited = new Set();
  let streamed = "";
  await streamQuery(body, {
    token(text) {
      streamed += text;
      view.answerText.append(text);
    },
    citations(data) {
      sources = data.sources || [];
      cited = new Set((data.citations || []).map((c) => c.number));
      renderSources(view.sourcesList, sources, cited);
    },
    done(rest) {
      renderAnswer(view.answerText, rest.answer ?? streamed, sources, view.sourcesList);
      renderMeta(view.meta, rest);
      view.feedbackSlot.append(feedbackForm(rest.query_id, view.sourcesList));
      announce(rest.cache && rest.cache.hit ? "Answered from the cache." : "Answer complete.");
    },
  }, { signal });
}

/** The answer's text with each [n] (or [n, m]) marker a button that opens source n. */
function renderAnswer(el, text, sources, sourcesList) {
  clear(el);
  const known = new Map(sources.map((source) => [source.number, source]));
  const marker = /\[(\d+(?:\s*,\s*\d+)*)\]/g;
  let last = 0;
  for (const match of text.matchAll(marker)) {
    const numbers = match[1].split(",").map((n) => Number(n.trim()));
    if (!numbers.every((n) => known.has(n))) continue;
    el.append(text.slice(last, match.index));
    for (const number of numbers) {
      const source = known.get(number);
      el.append(h("button", {
        type: "button",
        class: "cite",
        "aria-label": `Source ${number}: ${source.cited_as}`,
        "aria-controls": `source-${number}`,
        onclick: () => openSource(sourcesList, number),
      }, `[${number}]`));
    }
    last = match.index + match[0].length;
  }
  el.append(text.slice(last));
}

function openSource(sourcesList, number) {
  const item = sourcesList.querySelector(`#source-${number}`);
  if (!item) return;
  const details = item.querySelector("details");
  details.open = true;
  item.scrollIntoView({ block: "nearest" });
  details.querySelector("summary").focus();
}

function renderSources(list, sources, cited) {
  clear(list);
  if (!sources.length) {
    list.append(h("li", { class: "muted" }, "No passages were found for this question."));
    return;
  }
  for (const source of sources) {
    const title = source.document.title || source.document.external_id;
    const pages = fmtPages(source.pages);
    const judgement = h("fieldset", { class: "choice" },
      h("legend", {}, `Was passage ${source.number} relevant?`),
      ...[["", "Not judged"], ["relevant", "Relevant"], ["irrelevant", "Not relevant"]].map(([value, label]) => {
        const radio = h("input", { type: "radio", name: `judge-${source.number}`, value, id: uid("judge"), checked: value === "" });
        return h("label", { class: "inline", for: radio.id }, radio, label);
      }));
    judgement.dataset.chunkIds = JSON.stringify(source.chunk_ids);
    list.append(h("li", { id: `source-${source.number}` },
      h("details", { class: "source" },
        h("summary", {}, `[${source.number}] ${source.cited_as}`,
          cited.has(source.number) ? h("span", { class: "cited" }, " · cited") : null),
        h("p", { class: "hint" },
          [`Document: ${title}`, pages ? `Pages: ${pages}` : null, `Score: ${source.score.toFixed(3)}`]
            .filter(Boolean).join(" · ")),
        source.flagged ? h("p", { class: "flag" }, "⚠ Flagged: reads like instructions to a model.") : null,
        h("blockquote", { class: "passage" }, source.text),
        judgement)));
  }
}

function renderMeta(el, rest) {
  clear(el);
  const cache = rest.cache;
  let cacheText = "not used";
  if (cache && cache.hit) {
    cacheText = `hit (${cache.kind}${cache.similarity != null && cache.kind === "semantic" ? `, similarity ${cache.similarity.toFixed(3)}` : ""})`;
  } else if (cache) cacheText = cache.refused ? `miss (near match refused: ${cache.refused})` : "miss";
  const timings = Object.entries(rest.timings_ms || {});
  el.append(
    h("span", { id: "cache-outcome" }, h("strong", {}, "Cache: "), cacheText),
    h("span", {}, h("strong", {}, "Model: "), rest.model),
    h("span", {}, h("strong", {}, "Status: "), rest.status),
    h("div", {}, h("strong", { id: "timings-label" }, "Stage timings"),
      h("ul", { class: "timings", "aria-labelledby": "timings-label" },
        timings.map(([stage, ms]) => h("li", {}, `${stage} ${fmtMs(ms)}`)))));
}

function feedbackForm(queryId, sourcesList) {
  const ratings = [
    ["thumbs:1", "Thumbs up"], ["thumbs:-1", "Thumbs down"],
    ["stars:1", "1 star"], ["stars:2", "2 stars"], ["stars:3", "3 stars"], ["stars:4", "4 stars"], ["stars:5", "5 stars"],
  ];
  const radios = ratings.map(([value, label]) => {
    const radio = h("input", { type: "radio", name: "rating", value, id: uid("rating") });
    return h("label", { class: "inline", for: radio.id }, radio, label);
  });
  const comment = h("textarea", { name: "comment", rows: "2", maxlength: "20000" });
  const corrected = h("textarea", { name: "corrected", rows: "3", maxlength: "20000" });
  const send = h("button", { type: "submit", class: "primary" }, "Send feedback");
  const heading = h("h2", { id: uid("feedback-heading") }, "Feedback");
  const form = h("form", { class: "panel", "aria-labelledby": heading.id },
    h("fieldset", {}, h("legend", {}, "Rating"),
      h("div", { class: "choice" }, radios.slice(0, 2)),
      h("div", { class: "choice" }, radios.slice(2))),
    h("p", { class: "hint" }, "Mark passages relevant or not under Sources above."),
    field("Comment", comment),
    field("Corrected answer", corrected, "What the answer should have said."),
    h("div", { class: "actions" }, send));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = { query_id: queryId, ...judgements(sourcesList) };
    const rating = form.querySelector('input[name="rating"]:checked');
    if (rating) {
      const [scale, value] = rating.value.split(":");
      body.rating = Number(value);
      body.scale = scale;
    }
    if (comment.value.trim()) body.comment = comment.value;
    if (corrected.value.trim()) body.corrected_answer = corrected.value;
    send.disabled = true;
    try {
      await api("POST", "/v1/feedback", body);
      announce("Feedback saved. Thank you.");
    } catch (error) {
      alertError(error);
    } finally {
      send.disabled = false;
    }
  });
  return h("section", { "aria-labelledby": heading.id }, heading, form);
}

function judgements(sourcesList) {
  const relevant = [];
  const irrelevant = [];
  for (const fieldset of sourcesList.querySelectorAll("fieldset[data-chunk-ids]")) {
    const picked = fieldset.querySelector("input:checked");
    const ids = JSON.parse(fieldset.dataset.chunkIds);
    if (picked && picked.value === "relevant") relevant.push(...ids);
    if (picked && picked.value === "irrelevant") irrelevant.push(...ids);
  }
  return { relevant_chunk_ids: relevant, irrelevant_chunk_ids: irrelevant };
}
