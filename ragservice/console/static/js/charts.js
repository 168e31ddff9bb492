// Charts as inline SVG, drawn here (no library): columns over days, and horizontal bar pairs.
// Colours come from app.css classes; each chart has a text summary for screen readers and its
// numbers in a table under "Data".

import { h, s, table, uid } from "./dom.js";

const WIDTH = 640;
const HEIGHT = 200;
const PAD = { top: 12, right: 8, bottom: 28, left: 44 };

function figure(caption, summary, svg, dataTable) {
  const titleId = uid("chart-title");
  const descId = uid("chart-desc");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-labelledby", `${titleId} ${descId}`);
  svg.prepend(s("title", { id: titleId }, caption), s("desc", { id: descId }, summary));
  return h("figure", { class: "chart" },
    h("figcaption", {}, caption), svg,
    h("details", {}, h("summary", {}, "Data"), dataTable));
}

/** Columns for `points` ({label, value}), y from 0 to `max` (default: the largest value). */
export function columnChart({ caption, points, format = String, max = null, summary }) {
  const top = max ?? Math.max(1, ...points.map((p) => p.value ?? 0));
  const innerW = WIDTH - PAD.left - PAD.right;
  const innerH = HEIGHT - PAD.top - PAD.bottom;
  const step = innerW / Math.max(points.length, 1);
  const barW = Math.max(1, step * 0.7);
  const svg = s("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, preserveAspectRatio: "xMidYMid meet" },
    s("line", { class: "axis", x1: PAD.left, y1: PAD.top + innerH, x2: WIDTH - PAD.right, y2: PAD.top + innerH }),
    s("line", { class: "axis", x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: PAD.top + innerH }),
    s("text", { x: PAD.left - 4, y: PAD.top + 4, "text-anchor": "end" }, format(top)),
    s("text", { x: PAD.left - 4, y: PAD.top + innerH, "text-anchor": "end" }, format(0)));
  const labelEvery = Math.max(1, Math.ceil(points.length / 8));
  points.forEach((point, i) => {
    const value = point.value ?? 0;
    const height = top ? (value / top) * innerH : 0;
    const x = PAD.left + i * step + (step - barW) / 2;
    svg.append(s("rect", { class: "bar", x: x.toFixed(1), y: (PAD.top + innerH - height).toFixed(1), width: barW.toFixed(1), height: height.toFixed(1) },
      s("title", {}, `${point.label}: ${point.value == null ? "no data" : format(value)}`)));
    if ((points.length - 1 - i) % labelEvery === 0) { // counted back from the latest day
      svg.append(s("text", { x: (x + barW / 2).toFixed(1), y: HEIGHT - 8, "text-anchor": "middle" }, point.label));
    }
  });
  const data = table([
    { label: "Day", value: (p) => p.label },
    { label: "Value", num: true, value: (p) => (p.value == null ? "—" : format(p.value)) },
  ], points, { empty: "No data." });
  return figure(caption, summary, svg, data);
}

/** Horizontal bars, two per row (`series` names them): e.g. p50 and p95 latency by stage. */
export function pairedBars({ caption, rows, series, format = String, summary }) {
  const rowH = 34;
  const left = 90;
  const height = PAD.top + rows.length * rowH + 8;
  const top = Math.max(1, ...rows.flatMap((r) => r.values));
  const innerW = WIDTH - left - 70;
  const svg = s("svg", { viewBox: `0 0 ${WIDTH} ${height}`, preserveAspectRatio: "xMidYMid meet" });
  rows.forEach((row, i) => {
    const y = PAD.top + i * rowH;
    svg.append(s("text", { x: left - 6, y: y + 17, "text-anchor": "end" }, row.label));
    row.values.forEach((value, j) => {
      const width = (value / top) * innerW;
      const barY = y + j * 13;
      svg.append(
        s("rect", { class: j ? "bar-2" : "bar", x: left, y: barY, width: Math.max(width, 1).toFixed(1), height: 11 },
          s("title", {}, `${row.label} ${series[j]}: ${format(value)}`)),
        s("text", { x: (left + width + 4).toFixed(1), y: barY + 10 }, format(value)));
    });
  });
  const legend = h("ul", { class: "legend", "aria-hidden": "true" },
    series.map((name, j) => h("li", {}, h("span", { class: `swatch ${j ? "bar-2" : "bar"}` }), name)));
  const data = table([
    { label: "Stage", value: (r) => r.label },
    ...series.map((name, j) => ({ label: name, num: true, value: (r) => format(r.values[j]) })),
    ...(rows.some((r) => r.count != null) ? [{ label: "Count", num: true, value: (r) => String(r.count ?? "—") }] : []),
  ], rows, { empty: "No data." });
  const fig = figure(caption, summary, svg, data);
  fig.insertBefore(legend, svg);
  return fig;
}
