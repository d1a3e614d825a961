// @ts-check
// The fleet: sites, pools with their capacity, and nodes with every state axis and condition. Redrawn on each
// event, so a cordon or a new node shows without a reload.

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
  const body = h("div", { id: "fleet" });
  replace(context.main, h("h1", {}, "Fleet"), body);
  const refresh = async () => replace(body, ...(await draw()));
  await refresh();
  return { refresh };
}

/**
 * A list, or the reason the caller cannot read it.
 * @template T
 * @param {() => Promise<T[]>} read
 * @returns {Promise<T[] | Error>}
 */
async function orError(read) {
  try {
    return await read();
  } catch (err) {
    return err instanceof Error ? err : new Error(String(err));
  }
}

async function draw() {
  const [sites, pools, nodes] = await Promise.all([
    orError(() => api.all("/v1/sites")),
    orError(() => api.all("/v1/pools")),
    orError(() => api.all("/v1/nodes")),
  ]);
  /** @type {Map<string, Schemas['PoolCapacityDto']>} */
  const capacity = new Map();
  if (!(pools instanceof Error)) {
    const answers = await Promise.all(
      pools.map((pool) =>
        api.get("/v1/pools/{pool_id}/capacity", { path: { pool_id: pool.id } }).catch(() => null),
      ),
    );
    for (const answer of answers) {
      if (answer) capacity.set(answer.poolId, answer);
    }
  }
  const poolNames = new Map(pools instanceof Error ? [] : pools.map((p) => [p.id, p.name]));
  const siteNames = new Map(sites instanceof Error ? [] : sites.map((s) => [s.id, s.name]));
  return [
    summary(pools, nodes),
    section("Sites", sites instanceof Error ? failure(sites) : siteTable(sites)),
    section("Pools", pools instanceof Error ? failure(pools) : poolTable(pools, capacity, siteNames)),
    section("Nodes", nodes instanceof Error ? failure(nodes) : nodeTable(nodes, poolNames)),
  ];
}

/**
 * @param {Schemas['PoolDto'][] | Error} pools
 * @param {Schemas['NodeDto'][] | Error} nodes
 */
function summary(pools, nodes) {
  const n = nodes instanceof Error ? [] : nodes;
  const count = (/** @type {(node: Schemas['NodeDto']) => boolean} */ test) => n.filter(test).length;
  return h(
    "div",
    { class: "tiles" },
    tile("Pools", pools instanceof Error ? "—" : pools.length),
    tile("Nodes", n.length),
    tile("Schedulable", count((x) => x.schedulable)),
    tile("Connected", count((x) => x.connectivity === "connected")),
    tile("Cordoned", count((x) => x.cordoned)),
    tile("With conditions", count((x) => x.conditions.length > 0)),
    tile(
      "GPUs",
      n.reduce((sum, x) => sum + x.gpuCount, 0),
    ),
  );
}

/**
 * @param {string} label
 * @param {string | number} value
 */
function tile(label, value) {
  return h("div", { class: "tile" }, h("div", { class: "value" }, value), h("div", { class: "label" }, label));
}

/** @param {Schemas['SiteDto'][]} sites */
function siteTable(sites) {
  return table(
    ["Name", "Id", "IAM region", "Kind", "Owner", "Created"],
    sites.map((site) =>
      h(
        "tr",
        {},
        h("td", {}, h("b", {}, site.name)),
        h("td", { class: "id" }, site.id),
        h("td", {}, site.iamRegion),
        h("td", {}, site.kind),
        h("td", {}, site.ownerTenantId),
        h("td", {}, time(site.createdAt)),
      ),
    ),
    "No sites you may see.",
  );
}

/**
 * @param {Schemas['PoolDto'][]} pools
 * @param {Map<string, Schemas['PoolCapacityDto']>} capacity
 * @param {Map<string, string>} siteNames
 */
function poolTable(pools, capacity, siteNames) {
  return table(
    ["Name", "Site", "GPU model", "Sharing", "Nodes", "Capacity (available / allocatable, reserved)", "Offered to", ""],
    pools.map((pool) => {
      const items = capacity.get(pool.id)?.items ?? [];
      return h(
        "tr",
        { "data-pool": pool.id },
        h("td", {}, h("b", {}, pool.name), h("div", { class: "id" }, pool.id)),
        h("td", {}, siteNames.get(pool.siteId) ?? short(pool.siteId)),
        h("td", {}, pool.gpuModel),
        h("td", {}, pool.sharing),
        h("td", { class: "num" }, pool.nodeCount),
        h(
          "td",
          {},
          items.length === 0
            ? "—"
            : items.map((c) =>
                h(
                  "div",
                  {},
                  `${c.resource}: ${c.available} / ${c.allocatable}`,
                  h("span", { class: "muted" }, ` · ${c.reserved} reserved, ${c.allocated} allocated`),
                ),
              ),
        ),
        h("td", {}, pool.offers.map((o) => o.tenantId).join(", ") || "—"),
        h("td", {}, h("a", { class: "button", href: `#/pools/${pool.id}/calendar` }, "Calendar")),
      );
    }),
    "No pools you may see.",
  );
}

/**
 * @param {Schemas['NodeDto'][]} nodes
 * @param {Map<string, string>} poolNames
 */
function nodeTable(nodes, poolNames) {
  return table(
    ["Node", "Pool", "Connectivity", "Schedulable", "Provision", "Power", "Cordoned", "Maint.", "Draining", "GPUs", "Gen.", "Conditions"],
    nodes.map((node) =>
      h(
        "tr",
        { "data-node": node.id, "data-name": node.name },
        h("td", {}, h("a", { href: `#/nodes/${node.id}` }, h("b", {}, node.name)), h("div", { class: "id" }, node.id)),
        h("td", {}, poolNames.get(node.poolId) ?? short(node.poolId)),
        h("td", {}, badge(node.connectivity)),
        h(
          "td",
          {},
          node.schedulable ? badge("yes", "ok") : badge("no", "bad"),
          node.noScheduleReasons.length > 0 ? h("div", { class: "muted small" }, node.noScheduleReasons.join(", ")) : null,
        ),
        h("td", {}, badge(node.provisionState)),
        h("td", {}, node.power),
        h("td", { class: "cordoned" }, node.cordoned ? badge("cordoned", "warn") : "no"),
        h("td", {}, node.maintenance ? badge("maintenance", "warn") : "no"),
        h("td", {}, node.draining ? badge("draining", "warn") : "no"),
        h("td", { class: "num" }, `${node.gpuCount}`, h("span", { class: "muted" }, ` (${node.atomCount} ${node.atomClass ?? "atoms"})`)),
        h("td", { class: "num" }, node.observedGeneration === node.generation ? `${node.generation}` : `${node.observedGeneration}/${node.generation}`),
        h(
          "td",
          {},
          node.conditions.length === 0
            ? h("span", { class: "muted" }, "none")
            : node.conditions.map((c) => h("div", { title: `since ${time(c.since)}` }, badge(c.type, "warn"), " ", c.message)),
        ),
      ),
    ),
    "No nodes you may see.",
  );
}

