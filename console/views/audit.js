// @ts-check
// The audit trail: allowed changes with their admission context, and denials; the caller's tenant's (every
// tenant's for the platform's administrators), newest first, filterable by tenant, event type, stream,
// identity and decision.

import * as api from "../api.js";
import { badge, failure, h, replace, section, short, table, time } from "../dom.js";

/** @typedef {import('../../clients/typescript/src/schema').components['schemas']} Schemas */
/** @typedef {import('../app.js').Context} Context */
/** @typedef {import('../app.js').View} View */

/**
 * @param {Context} context
 * @returns {Promise<View>}
 */
export async function mount(context) {
  const tenant = context.admin ? h("input", { id: "audit-tenant", placeholder: "every tenant" }) : null;
  const type = h("input", { id: "audit-type", placeholder: "reservation." });
  const stream = h("input", { id: "audit-stream", placeholder: "rsv_…, node_…" });
  const identity = h("input", { id: "audit-identity", placeholder: "alice@acme" });
  const decision = h("select", { id: "audit-decision" }, ["", "allowed", "denied"].map((d) => h("option", { value: d }, d || "any decision")));
  const listing = h("div", { id: "audit-list" });
  /** @type {Schemas['AuditDto'][]} */
  let entries = [];
  const show = () => {
    const wanted = entries.filter(
      (e) =>
        e.eventType.includes(type.value.trim()) &&
        e.streamId.includes(stream.value.trim()) &&
        (e.identity ?? "").includes(identity.value.trim()) &&
        (!decision.value || e.decision === decision.value),
    );
    replace(listing, h("p", { class: "muted small" }, `${wanted.length} of ${entries.length} entries`), auditTable(wanted.slice(0, 1000)));
  };
  const refresh = async () => {
    try {
      const items = context.admin
        ? await api.all("/v1/fleet/audit", { query: { tenant: tenant?.value.trim() || undefined } })
        : await api.all("/v1/audit");
      entries = items.reverse();
      show();
    } catch (err) {
      replace(listing, failure(err));
    }
  };
  for (const input of [type, stream, identity]) input.addEventListener("input", show);
  decision.addEventListener("change", show);
  tenant?.addEventListener("change", refresh);
  replace(
    context.main,
    h("h1", {}, "Audit trail"),
    section(
      "Entries",
      h(
        "div",
        { class: "filters" },
        tenant ? h("label", {}, "Tenant ", tenant) : null,
        h("label", {}, "Event type ", type),
        h("label", {}, "Stream ", stream),
        h("label", {}, "Identity ", identity),
        h("label", {}, "Decision ", decision),
      ),
      listing,
    ),
  );
  await refresh();
  return { refresh };
}

/**
 * A link to the view of what a stream id names.
 * @param {string} id
 */
function streamLink(id) {
  if (id.startsWith("rsv_")) return h("a", { href: `#/reservations/${id}`, title: id }, short(id));
  if (id.startsWith("node_")) return h("a", { href: `#/nodes/${id}`, title: id }, short(id));
  if (id.startsWith("pool_")) return h("a", { href: `#/pools/${id}/calendar`, title: id }, short(id));
  return h("span", { title: id }, short(id));
}

/** @param {Schemas['AuditDto'][]} entries */
function auditTable(entries) {
  return table(
    ["Recorded", "Event", "Stream", "Tenant", "Decision", "Identity", "Session", "Request", "Reason"],
    entries.map((e) =>
      h(
        "tr",
        { "data-type": e.eventType },
        h("td", {}, time(e.recordedAt)),
        h("td", {}, h("b", {}, e.eventType), h("div", { class: "id" }, e.position)),
        h("td", { class: "id" }, streamLink(e.streamId), ` v${e.streamVersion}`),
        h("td", {}, e.tenantId ?? "—", e.admissionTenantId && e.admissionTenantId !== e.tenantId ? h("div", { class: "muted small" }, `as ${e.admissionTenantId}`) : null),
        h("td", {}, badge(e.decision, e.decision === "denied" ? "bad" : "ok")),
        h("td", {}, e.identity ?? "—", e.delegation ? h("div", { class: "muted small" }, `via ${e.delegation}`) : null),
        h("td", {}, e.sessionKind ?? "—", e.agent ? h("div", { class: "muted small" }, e.agent) : null),
        h("td", { class: "id" }, e.requestId ?? "—"),
        h("td", { class: "muted" }, e.reason ?? ""),
      ),
    ),
    "No entries.",
    { id: "audit-table" },
  );
}
