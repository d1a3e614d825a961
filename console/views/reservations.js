// @ts-check
// Reservations: the caller's (every tenant's, for the platform's administrators), filterable by pool and state,
// with cancel and release; and the form that creates one.

import * as api from "../api.js";
import { badge, failure, h, replace, section, short, table, time } from "../dom.js";

/** @typedef {import('../../clients/typescript/src/schema').components['schemas']} Schemas */
/** @typedef {import('../app.js').Context} Context */
/** @typedef {import('../app.js').View} View */

/** The states a reservation can be cancelled in, and released in. */
export const CANCELLABLE = ["draft", "awaiting-confirmation", "pending", "placed"];
export const RELEASABLE = ["binding", "active"];
const STATES = ["", "pending", "placed", "binding", "active", "releasing", "released", "cancelled", "failed", "expired", "denied"];

/**
 * The atoms a pool's sharing mode books.
 * @param {Schemas['PoolDto']} pool
 */
export function atomClass(pool) {
  return pool.sharing === "mig" ? "gpu.mig" : pool.sharing === "exclusive" ? "gpu" : "gpu.slot";
}

/**
 * @param {Context} context
 * @returns {Promise<View>}
 */
export async function mount(context) {
  const pools = await api.all("/v1/pools");
  const poolNames = new Map(pools.map((p) => [p.id, p.name]));
  const query = new URLSearchParams(location.hash.split("?")[1] ?? "");
  const poolFilter = h(
    "select",
    { name: "poolId", id: "filter-pool" },
    h("option", { value: "" }, "every pool"),
    pools.map((p) => h("option", { value: p.id, selected: p.id === query.get("poolId") }, p.name)),
  );
  const stateFilter = h(
    "select",
    { name: "state", id: "filter-state" },
    STATES.map((s) => h("option", { value: s, selected: s === (query.get("state") ?? "") }, s || "every state")),
  );
  const tenantFilter = context.admin
    ? h("input", { name: "tenant", id: "filter-tenant", placeholder: "every tenant", value: query.get("tenant") ?? "" })
    : null;
  const listing = h("div", { id: "reservation-list" });
  const refresh = async () => {
    const filter = {
      poolId: poolFilter.value || undefined,
      state: stateFilter.value || undefined,
      tenant: tenantFilter?.value || undefined,
    };
    try {
      const items = context.admin
        ? await api.all("/v1/fleet/reservations", { query: filter })
        : await api.all("/v1/reservations", { query: { poolId: filter.poolId, state: filter.state } });
      items.sort((a, b) => b.requestedAt - a.requestedAt);
      replace(listing, reservationTable(items, poolNames, refresh));
    } catch (err) {
      replace(listing, failure(err));
    }
  };
  for (const control of [poolFilter, stateFilter, tenantFilter]) {
    control?.addEventListener("change", refresh);
  }
  replace(
    context.main,
    h("h1", {}, "Reservations"),
    createForm(pools, context),
    section(
      "Reservations",
      h(
        "div",
        { class: "filters" },
        h("label", {}, "Pool ", poolFilter),
        h("label", {}, "State ", stateFilter),
        tenantFilter ? h("label", {}, "Tenant ", tenantFilter) : null,
      ),
      listing,
    ),
  );
  await refresh();
  return { refresh };
}

/**
 * @param {Schemas['ReservationDto'][]} items
 * @param {Map<string, string>} poolNames
 * @param {() => Promise<void>} refresh
 */
function reservationTable(items, poolNames, refresh) {
  return table(
    ["Reservation", "Tenant", "Identity", "Pool", "State", "Devices", "Start", "End", "Outcome", ""],
    items.map((r) =>
      h(
        "tr",
        { "data-reservation": r.id },
        h("td", { class: "id" }, h("a", { href: `#/reservations/${r.id}`, title: r.id }, short(r.id))),
        h("td", {}, r.tenantId),
        h("td", {}, r.identity),
        h("td", {}, poolNames.get(r.poolId) ?? short(r.poolId)),
        h("td", {}, badge(r.state)),
        h("td", { class: "num" }, `${r.count} × ${r.request.devices.class}`),
        h("td", {}, time(r.start)),
        h("td", {}, time(r.end)),
        h("td", { class: "muted" }, r.outcome ?? ""),
        h("td", {}, actions(r, refresh)),
      ),
    ),
    "No reservations.",
  );
}

/**
 * The cancel and release buttons a reservation's state allows.
 * @param {Schemas['ReservationDto']} r
 * @param {() => Promise<void>} done
 */
export function actions(r, done) {
  const problem = h("span", { class: "error small" });
  /** @param {"cancel" | "release"} verb */
  const act = async (verb) => {
    try {
      if (verb === "cancel") {
        await api.post("/v1/reservations/{reservation_id}/cancel", { path: { reservation_id: r.id } }, { reason: "cancelled in the console" });
      } else {
        await api.post("/v1/reservations/{reservation_id}/release", { path: { reservation_id: r.id } });
      }
      await done();
    } catch (err) {
      replace(problem, err instanceof Error ? err.message : String(err));
    }
  };
  return h(
    "span",
    { class: "actions" },
    CANCELLABLE.includes(r.state) ? h("button", { type: "button", class: "small", "data-action": "cancel", onclick: () => act("cancel") }, "Cancel") : null,
    RELEASABLE.includes(r.state) ? h("button", { type: "button", class: "small", "data-action": "release", onclick: () => act("release") }, "Release") : null,
    problem,
  );
}

/**
 * Why a decision went as it did: its summary, the reads it made, the quota arithmetic, the pool rule, and the
 * passed-over nodes with their reasons ("why not").
 * @param {Schemas['ExplanationDto']} e
 */
export function explain(e) {
  const lines = [h("p", { class: "why-summary" }, h("b", {}, e.summary))];
  if (e.tiers.length) {
    const tiers = e.tiers.map((t) => `${t.tier} (${t.candidates} fitting${t.fits ? ", planned" : ""})`);
    lines.push(h("p", {}, h("span", { class: "muted" }, "Searched: "), tiers.join(" → ")));
  }
  if (e.quota) {
    lines.push(h("p", {}, h("span", { class: "muted" }, "Quota: "), e.quota.arithmetic));
  }
  if (e.policy) {
    lines.push(h("p", {}, h("span", { class: "muted" }, "Policy: "), e.policy));
  }
  const counts = Object.entries(e.excludedBy).map(([kind, n]) => `${n} ${kind}`);
  if (counts.length) {
    lines.push(h("p", {}, h("span", { class: "muted" }, "Passed over: "), counts.join(", ")));
    lines.push(
      table(
        ["Node", "Why not"],
        e.excluded.map((n) =>
          h(
            "tr",
            { "data-kind": n.kind },
            h("td", {}, h("a", { href: `#/nodes/${n.nodeId}`, title: n.nodeId }, short(n.nodeId))),
            h("td", {}, n.reason),
          ),
        ),
        "None.",
      ),
    );
  }
  return h("div", { class: "why" }, lines);
}

/**
 * The form that reserves devices in a pool: now (as soon as possible) or from a start, for a duration.
 * @param {Schemas['PoolDto'][]} pools
 * @param {Context} context
 */
function createForm(pools, context) {
  const pool = h("select", { name: "poolId", id: "new-pool", required: true }, pools.map((p) => h("option", { value: p.id }, `${p.name} (${p.gpuModel}, ${p.sharing})`)));
  const count = h("input", { name: "count", id: "new-count", type: "number", min: 1, max: 4096, value: 1, required: true });
  const start = h("input", { name: "start", id: "new-start", type: "datetime-local" });
  const hours = h("input", { name: "hours", id: "new-hours", type: "number", min: 0.01, step: "any", value: 1, required: true });
  const problem = h("p", { class: "error", role: "alert" });
  const form = h(
    "form",
    { id: "reserve", class: "inline-form" },
    h("label", {}, "Pool ", pool),
    h("label", {}, "Devices ", count),
    h("label", {}, "Start (empty: now) ", start),
    h("label", {}, "Hours ", hours),
    h("button", { type: "submit" }, "Reserve"),
    problem,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const chosen = pools.find((p) => p.id === pool.value);
    if (!chosen) return;
    /** @type {Schemas['ReserveBody']} */
    const body = {
      poolId: chosen.id,
      devices: { class: atomClass(chosen), count: Number(count.value) },
      duration: Math.round(Number(hours.value) * 3600),
    };
    if (start.value) {
      body.start = Math.ceil(new Date(start.value).getTime() / 1000) * 1000;
    }
    try {
      const made = await api.post("/v1/reservations", { headers: { "Idempotency-Key": api.idempotencyKey() } }, body);
      context.go(`#/reservations/${made.id}`);
    } catch (err) {
      const explanation = err instanceof api.ApiError ? err.details.explanation : undefined;
      replace(
        problem,
        err instanceof Error ? err.message : String(err),
        ...(explanation ? [explain(explanation)] : []),
      );
    }
  });
  return section("New reservation", form);
}
