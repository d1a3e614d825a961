// @ts-check
// A pool's booking calendar: a timeline with a row per node and per GPU (each atom the pool books), the bookings
// the caller may see as bars labelled by tenant and reservation, the free windows between them, and a line at
// now; and the earliest-start query. Redrawn on each event.

import * as api from "../api.js";
import { duration, failure, h, replace, s, section, short, time } from "../dom.js";
import { atomClass } from "./reservations.js";

/** @typedef {import('../../clients/typescript/src/schema').components['schemas']} Schemas */
/** @typedef {import('../app.js').Context} Context */
/** @typedef {import('../app.js').View} View */
/** @typedef {{ nodeId: string, name: string, atoms: { id: string, label: string }[] }} NodeRows */
/** @typedef {{ reservation: Schemas['ReservationDto'], from: number, to: number, live: boolean }} Booking */

const HOUR = 3600 * 1000;
const SPANS = [
  ["6 hours", 6 * HOUR],
  ["24 hours", 24 * HOUR],
  ["3 days", 72 * HOUR],
  ["7 days", 168 * HOUR],
];
/** States whose devices are booked now or later. */
const LIVE = ["placed", "binding", "active", "releasing"];
const WIDTH = 1200;
const LABELS = 250;
const ROW = 22;
const HEAD = 26;
const AXIS = 28;

/**
 * @param {Context} context
 * @param {string} poolId
 * @returns {Promise<View>}
 */
export async function mount(context, poolId) {
  const pool = await api.get("/v1/pools/{pool_id}", { path: { pool_id: poolId } });
  const span = h("select", { id: "span" }, SPANS.map(([label, ms]) => h("option", { value: ms, selected: ms === 24 * HOUR }, label)));
  const chart = h("div", { id: "calendar", class: "chart" });
  /** @type {{ start: number, seconds: number } | null} */
  let proposal = null;
  const refresh = async () => {
    try {
      replace(chart, await draw(pool, context, Number(span.value), proposal));
    } catch (err) {
      replace(chart, failure(err));
    }
  };
  span.addEventListener("change", refresh);
  replace(
    context.main,
    h(
      "h1",
      {},
      "Calendar of ",
      pool.name,
      " ",
      h("span", { class: "muted" }, `${pool.gpuModel} · ${pool.sharing} · ${pool.nodeCount} nodes`),
    ),
    section(
      "Bookings",
      h(
        "div",
        { class: "filters" },
        h("label", {}, "Show ", span),
        h("span", { class: "legend" }, h("i", { class: "sw booked" }), "booked ", h("i", { class: "sw mine" }), "ended ", h("i", { class: "sw free" }), "free ", h("i", { class: "sw now" }), "now ", h("i", { class: "sw proposal" }), "earliest start"),
      ),
      chart,
    ),
    earliestForm(pool, context, (found) => {
      proposal = found;
      refresh();
    }),
  );
  await refresh();
  return { refresh };
}

/**
 * The rows of the timeline: every node and its bookable atoms when the caller may read the pool's devices,
 * otherwise the nodes and devices its own bookings name.
 * @param {Schemas['PoolDto']} pool
 * @param {Schemas['ReservationDto'][]} reservations
 * @returns {Promise<NodeRows[]>}
 */
async function rows(pool, reservations) {
  /** @type {Map<string, string>} */
  const names = new Map();
  try {
    for (const node of await api.all("/v1/nodes", { query: { poolId: pool.id } })) names.set(node.id, node.name);
  } catch {
    // Not an operator of the pool: nodes are named by id.
  }
  try {
    const pages = await api.all("/v1/pools/{pool_id}/devices", { path: { pool_id: pool.id } });
    return pages.map((node) => ({
      nodeId: node.nodeId,
      name: names.get(node.nodeId) ?? short(node.nodeId),
      atoms: node.items.filter((d) => d.bookable).map((d) => ({ id: d.id, label: `${d.class} ${short(d.id)}` })),
    }));
  } catch {
    /** @type {Map<string, Set<string>>} */
    const seen = new Map();
    for (const r of reservations) {
      for (const a of r.allocations) {
        const set = seen.get(a.nodeId) ?? new Set();
        a.devices.forEach((d) => set.add(d));
        seen.set(a.nodeId, set);
      }
    }
    return [...seen].map(([nodeId, atoms]) => ({
      nodeId,
      name: names.get(nodeId) ?? short(nodeId),
      atoms: [...atoms].sort().map((id) => ({ id, label: short(id) })),
    }));
  }
}

/**
 * @param {Schemas['PoolDto']} pool
 * @param {Context} context
 * @param {number} spanMs
 * @param {{ start: number, seconds: number } | null} proposal
 */
async function draw(pool, context, spanMs, proposal) {
  const reservations = context.admin
    ? await api.all("/v1/fleet/reservations", { query: { poolId: pool.id } })
    : await api.all("/v1/reservations", { query: { poolId: pool.id } });
  const nodes = await rows(pool, reservations);
  const now = Date.now();
  const from = now - spanMs / 8;
  const to = from + spanMs;
  /** @type {Map<string, Booking[]>} by atom id */
  const byAtom = new Map();
  for (const r of reservations) {
    if (r.start === null || r.start === undefined || r.end === null || r.end === undefined) continue;
    const live = LIVE.includes(r.state);
    const end = live ? r.end : Math.min(r.end, r.endedAt ?? r.end);
    if (end <= from || r.start >= to || end <= r.start) continue;
    for (const a of r.allocations) {
      for (const d of a.devices) {
        const list = byAtom.get(d) ?? [];
        list.push({ reservation: r, from: r.start, to: end, live });
        byAtom.set(d, list);
      }
    }
  }
  const x = (/** @type {number} */ t) => LABELS + ((Math.min(Math.max(t, from), to) - from) / (to - from)) * (WIDTH - LABELS - 8);
  const lineCount = nodes.reduce((n, node) => n + 1 + node.atoms.length, 0);
  const height = AXIS + (proposal ? ROW : 0) + nodes.length * HEAD + (lineCount - nodes.length) * ROW + 8;
  const svg = s("svg", { viewBox: `0 0 ${WIDTH} ${height}`, width: "100%", role: "img", "aria-label": `Bookings of ${pool.name}` });
  // The time axis and its grid.
  const step = [0.25, 0.5, 1, 2, 3, 6, 12, 24].map((hours) => hours * HOUR).find((ms) => spanMs / ms <= 12) ?? 24 * HOUR;
  const offset = new Date().getTimezoneOffset() * 60000;
  for (let t = Math.ceil((from - offset) / step) * step + offset; t < to; t += step) {
    const at = new Date(t);
    const label = at.getHours() === 0 && at.getMinutes() === 0 ? time(t).slice(5, 10) : time(t).slice(11, 16);
    svg.append(s("line", { x1: x(t), x2: x(t), y1: AXIS - 6, y2: height, class: "grid" }));
    svg.append(s("text", { x: x(t) + 3, y: AXIS - 10, class: "tick" }, label));
  }
  let y = AXIS;
  if (proposal) {
    const start = proposal.start;
    svg.append(s("text", { x: 8, y: y + 15, class: "row-label" }, "earliest start"));
    svg.append(
      s(
        "rect",
        { x: x(start), y: y + 3, width: Math.max(2, x(start + proposal.seconds * 1000) - x(start)), height: ROW - 6, class: "proposal", rx: 3 },
        s("title", {}, `earliest start ${time(start)} for ${duration(proposal.seconds)}`),
      ),
    );
    y += ROW;
  }
  for (const node of nodes) {
    svg.append(s("rect", { x: 0, y, width: WIDTH, height: HEAD, class: "node-row" }));
    svg.append(
      s(
        "a",
        { href: `#/nodes/${node.nodeId}` },
        s("text", { x: 8, y: y + 17, class: "node-label", "data-node": node.nodeId }, `${node.name}`),
      ),
    );
    svg.append(s("text", { x: 8 + Math.min(140, node.name.length * 8 + 10), y: y + 17, class: "muted-label" }, `${node.atoms.length} atoms`));
    y += HEAD;
    for (const atom of node.atoms) {
      svg.append(s("text", { x: 20, y: y + 15, class: "row-label" }, atom.label, s("title", {}, atom.id)));
      const bookings = (byAtom.get(atom.id) ?? []).sort((a, b) => a.from - b.from);
      // The free windows: the gaps between live bookings from now on.
      let free = Math.max(from, now);
      for (const b of [...bookings.filter((b) => b.live), { from: to, to }]) {
        if (b.from > free && x(b.from) - x(free) >= 2) {
          svg.append(
            s(
              "rect",
              { x: x(free), y: y + 4, width: x(b.from) - x(free), height: ROW - 8, class: "free", rx: 2 },
              s("title", {}, `free ${time(free)} → ${b.from >= to ? "…" : time(b.from)}`),
            ),
          );
        }
        free = Math.max(free, b.to);
      }
      for (const b of bookings) {
        const r = b.reservation;
        const left = x(b.from);
        const width = Math.max(2, x(b.to) - left);
        const label = `${r.tenantId} · ${short(r.id)}`;
        svg.append(
          s(
            "a",
            { href: `#/reservations/${r.id}` },
            s(
              "rect",
              { x: left, y: y + 2, width, height: ROW - 4, rx: 3, class: b.live ? `booking s-${r.state}` : "booking ended", "data-reservation": r.id },
              s("title", {}, `${r.tenantId} · ${r.id} · ${r.state}\n${time(b.from)} → ${time(b.to)}`),
            ),
            width > 60 ? s("text", { x: left + 5, y: y + 15, class: "bar-label" }, label.slice(0, Math.floor(width / 6.5))) : null,
          ),
        );
      }
      svg.append(s("line", { x1: 0, x2: WIDTH, y1: y + ROW, y2: y + ROW, class: "row-line" }));
      y += ROW;
    }
  }
  svg.append(s("line", { x1: x(now), x2: x(now), y1: AXIS - 8, y2: height, class: "now" }));
  svg.append(s("text", { x: x(now) + 3, y: height - 4, class: "now-label" }, "now"));
  if (nodes.length === 0) {
    return h("p", { class: "empty" }, "No nodes or bookings you may see in this pool.");
  }
  return h(
    "div",
    {},
    svg,
    h("p", { class: "muted small" }, `${reservations.filter((r) => LIVE.includes(r.state)).length} live reservations you may see · ${time(from)} → ${time(to)}`),
  );
}

/**
 * The earliest-start query: when a request of `count` atoms for `hours` could start.
 * @param {Schemas['PoolDto']} pool
 * @param {Context} context
 * @param {(found: { start: number, seconds: number } | null) => void} show
 */
function earliestForm(pool, context, show) {
  const count = h("input", { id: "earliest-count", type: "number", min: 1, max: 4096, value: 1, required: true });
  const hours = h("input", { id: "earliest-hours", type: "number", min: 0.01, step: "any", value: 1, required: true });
  const answer = h("div", { id: "earliest-answer", class: "answer" });
  const form = h(
    "form",
    { id: "earliest", class: "inline-form" },
    h("label", {}, `Atoms (${atomClass(pool)}) `, count),
    h("label", {}, "Hours ", hours),
    h("button", { type: "submit" }, "Find earliest start"),
    answer,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const seconds = Math.round(Number(hours.value) * 3600);
    try {
      const found = await api.get("/v1/pools/{pool_id}/availability", {
        path: { pool_id: pool.id },
        query: { class: atomClass(pool), count: Number(count.value), duration: seconds },
      });
      if (!("earliestStart" in found)) return;
      const start = found.earliestStart;
      if (start === null || start === undefined) {
        replace(answer, "No start: the pool cannot hold that request.");
        show(null);
        return;
      }
      const at = Math.max(start, Date.now());
      const reserve = h("button", { type: "button", id: "reserve-earliest" }, "Reserve then");
      reserve.addEventListener("click", async () => {
        try {
          /** @type {Schemas['ReserveBody']} */
          const body = { poolId: pool.id, devices: { class: atomClass(pool), count: Number(count.value) }, duration: seconds };
          if (start > Date.now() + 1000) body.start = Math.ceil(start / 1000) * 1000;
          const made = await api.post("/v1/reservations", { headers: { "Idempotency-Key": api.idempotencyKey() } }, body);
          context.go(`#/reservations/${made.id}`);
        } catch (err) {
          replace(answer, failure(err));
        }
      });
      replace(answer, h("b", {}, start <= Date.now() + 1000 ? "Now" : time(start)), ` (in ${duration((at - Date.now()) / 1000)}) `, reserve);
      show({ start: at, seconds });
    } catch (err) {
      replace(answer, failure(err));
    }
  });
  return section("Earliest start", form);
}
