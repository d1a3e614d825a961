// @ts-check
// One reservation: what it asked for and holds, cancel and release, and every event of its stream with the
// admission context it was decided in (who, in which tenant, through which session and request). The events come
// from the event stream filtered to the reservation, from its beginning, so new ones appear as they happen.

import * as api from "../api.js";
import { badge, facts, h, replace, section, short, table, time } from "../dom.js";
import { actions, explain } from "./reservations.js";

/** @typedef {import('../../clients/typescript/src/schema').components['schemas']} Schemas */
/** @typedef {import('../app.js').Context} Context */
/** @typedef {import('../app.js').View} View */
/** @typedef {import('../app.js').StreamEvent} StreamEvent */

/**
 * @param {Context} context
 * @param {string} id
 * @returns {Promise<View>}
 */
export async function mount(context, id) {
  const summary = h("div", { id: "reservation-summary" });
  const why = h("div", { id: "reservation-why" });
  const rows = h("tbody", {});
  const events = h(
    "table",
    { id: "reservation-events" },
    h("thead", {}, h("tr", {}, ["#", "Event", "Recorded", "Admission", "Request", "Payload"].map((t) => h("th", {}, t)))),
    rows,
  );
  const refresh = async () => {
    const r = await api.get("/v1/reservations/{reservation_id}", { path: { reservation_id: id } });
    replace(summary, ...draw(r, refresh));
    try {
      const explained = await api.get("/v1/reservations/{reservation_id}/explanation", { path: { reservation_id: id } });
      replace(why, explain(explained.explanation));
    } catch (err) {
      if (!(err instanceof api.ApiError && err.status === 404)) throw err;
      replace(why, h("p", { class: "muted" }, "No decision explained (recorded before explanations were)."));
    }
  };
  replace(
    context.main,
    h("h1", {}, "Reservation ", h("span", { class: "id" }, id)),
    summary,
    section("Why", why),
    section("Events", events),
  );
  await refresh();
  // Its history and what follows, from the event stream filtered to its stream.
  const stream = new EventSource(await api.eventStreamUrl({ stream: id, after: "0-0-0" }));
  /** @type {Set<string>} */
  const seen = new Set();
  stream.onmessage = (message) => {
    /** @type {StreamEvent} */
    const event = JSON.parse(message.data);
    if (seen.has(event.position)) return;
    seen.add(event.position);
    rows.append(eventRow(event));
    refresh().catch(() => {});
  };
  return { refresh, close: () => stream.close() };
}

/**
 * @param {Schemas['ReservationDto']} r
 * @param {() => Promise<void>} refresh
 */
function draw(r, refresh) {
  return [
    h(
      "div",
      { class: "columns" },
      section(
        "Summary",
        facts([
          ["State", [badge(r.state), " ", actions(r, refresh)]],
          ["Tenant", r.tenantId],
          ["Identity", r.identity],
          ["Pool", h("a", { href: `#/pools/${r.poolId}/calendar` }, r.poolId)],
          ["Project", r.projectId ?? "—"],
          ["Devices", `${r.count} × ${r.request.devices.class}`],
          ["Window", `${time(r.start)} → ${time(r.end)}`],
          ["Requested", time(r.requestedAt)],
          ["Pending deadline", time(r.pendingDeadline)],
          ["Lease deadline", time(r.leaseDeadline)],
          ["Ended", time(r.endedAt)],
          ["Outcome", r.outcome ?? "—"],
          ["Priority", String(r.priority)],
          ["Version", String(r.version)],
        ]),
      ),
      section(
        "Allocations",
        table(
          ["Allocation", "Node", "Devices", "Resources"],
          r.allocations.map((a) =>
            h(
              "tr",
              {},
              h("td", { class: "id" }, a.allocationId),
              h("td", {}, h("a", { href: `#/nodes/${a.nodeId}`, title: a.nodeId }, short(a.nodeId))),
              h("td", { class: "id" }, a.devices.map((d) => h("div", {}, d))),
              h("td", {}, Object.entries(a.resources ?? {}).map(([k, v]) => `${k}: ${v}`).join(", ") || "—"),
            ),
          ),
          "Not placed.",
        ),
        h("h3", {}, "Request"),
        h("pre", { class: "json" }, JSON.stringify(r.request, null, 2)),
      ),
    ),
  ];
}

/** @param {StreamEvent} event */
function eventRow(event) {
  const admission = event.metadata.admission ?? {};
  const who = ["identity", "tenantId", "sessionKind", "delegation", "agent"]
    .filter((k) => admission[k] !== undefined && admission[k] !== null)
    .map((k) => h("div", {}, h("span", { class: "muted" }, `${k}: `), String(admission[k])));
  return h(
    "tr",
    { "data-type": event.eventType },
    h("td", { class: "num" }, event.streamVersion),
    h("td", {}, h("b", {}, event.eventType), h("div", { class: "id" }, event.position)),
    h("td", {}, time(event.recordedAt)),
    h("td", {}, who.length ? who : h("span", { class: "muted" }, "—")),
    h("td", { class: "id" }, event.metadata.requestId ?? event.metadata.correlationId ?? "—"),
    h("td", { class: "payload" }, h("pre", { class: "json compact" }, JSON.stringify(event.payload))),
  );
}
