// Insights (admins): charts from GET /v1/insights: questions per day, the cache's hit rate,
// latency by pipeline stage, the weakest retrievals and the negative feedback.

import { get, withQuery } from "../api.js";
import { columnChart, pairedBars } from "../charts.js";
import { alertError, clear, field, fmtMs, fmtPct, h, table, timeEl } from "../dom.js";

export function render(main, ctx) {
  const days = h("select", { name: "days" }, [7, 30, 90].map((n) => h("option", { value: String(n), selected: n === 30 }, `${n} days`)));
  const collection = h("select", { name: "collection" }, h("option", { value: "" }, "All collections"));
  const slot = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  main.append(h("h1", {}, "Insights"),
    h("form", { class: "panel row", onsubmit: (event) => event.preventDefault() },
      field("Period", days), field("Collection", collection)),
    slot);
  const refresh = () => show(ctx, { days: days.value, collection: collection.value }, slot);
  days.addEventListener("change", refresh);
  collection.addEventListener("change", refresh);
  (async () => {
    try {
      const { collections } = await get("/v1/collections", { signal: ctx.signal });
      for (const c of collections) collection.append(h("option", { value: c.name }, c.name));
    } catch (error) {
      alertError(error);
    }
    refresh();
  })();
}

function rating(feedback) {
  if (feedback.rating == null) return "—";
  if (feedback.scale === "stars") return `${feedback.rating} of 5 stars`;
  return feedback.rating > 0 ? "thumbs up" : "thumbs down";
}

/** The period's UTC days as YYYY-MM-DD, from `since` on: the API leaves out days without data. */
function everyDay(since, count) {
  const first = Date.parse(since);
  if (Number.isNaN(first)) return [];
  return Array.from({ length: count }, (_, i) => new Date(first + i * 86400000).toISOString().slice(0, 10));
}

function dayLabel(day) {
  return String(day).slice(5); // 2026-12-04 → 12-04
}

async function show(ctx, params, slot) {
  try {
    const data = await get(withQuery("/v1/insights", params), { signal: ctx.signal });
    const days = everyDay(data.since, data.days);
    const queriesOn = new Map(data.queries_per_day.map((d) => [d.day, d.queries]));
    const cacheOn = new Map(data.cache_per_day.map((d) => [d.day, d]));
    const queries = days.map((day) => ({ label: dayLabel(day), value: queriesOn.get(day) ?? 0 }));
    const total = queries.reduce((sum, d) => sum + d.value, 0);
    const hits = days.map((day) => {
      const found = cacheOn.get(day);
      return { label: dayLabel(day), value: found && found.lookups ? found.hit_rate : null };
    });
    const lookups = data.cache_per_day.reduce((sum, d) => sum + d.lookups, 0);
    const cacheHits = data.cache_per_day.reduce((sum, d) => sum + d.hits, 0);
    const stages = data.stage_latency.map((st) => ({ label: st.stage, values: [st.p50_ms ?? 0, st.p95_ms ?? 0], count: st.count }));
    clear(slot).append(
      h("div", { class: "grid-2" },
        h("section", { class: "panel" }, columnChart({
          caption: "Questions per day",
          points: queries,
          summary: `${total} questions in ${data.days} days.`,
        })),
        h("section", { class: "panel" }, columnChart({
          caption: "Cache hit rate per day",
          points: hits,
          max: 1,
          format: fmtPct,
          summary: `${cacheHits} hits in ${lookups} cache lookups (${fmtPct(lookups ? cacheHits / lookups : 0)}).`,
        }))),
      h("section", { class: "panel" }, pairedBars({
        caption: "Latency by stage",
        rows: stages,
        series: ["p50", "p95"],
        format: fmtMs,
        summary: stages.map((st) => `${st.label}: p50 ${fmtMs(st.values[0])}, p95 ${fmtMs(st.values[1])}`).join("; ") || "No answers yet.",
      })),
      h("h2", {}, "Weakest retrievals"),
      table([
        { label: "Question", value: (w) => w.question },
        { label: "Top score", num: true, value: (w) => (w.top_score == null ? "—" : w.top_score.toFixed(3)) },
        { label: "Why", value: (w) => (w.reason ? w.reason.replaceAll("_", " ") : "low score") },
        { label: "Asked", value: (w) => timeEl(w.created_at) },
      ], data.weakest, { caption: "Questions whose best passage scored lowest", empty: "No questions yet." }),
      h("h2", {}, "Negative feedback"),
      table([
        { label: "Question", value: (f) => f.question },
        { label: "Answer", value: (f) => f.answer || "—" },
        { label: "Rating", value: (f) => rating(f) },
        { label: "Comment", value: (f) => f.comment || "—" },
        { label: "Corrected answer", value: (f) => f.corrected_answer || "—" },
        { label: "When", value: (f) => timeEl(f.created_at) },
      ], data.negative_feedback, { caption: "Answers rated down", empty: "No negative feedback." }));
  } catch (error) {
    clear(slot);
    alertError(error);
  }
}
