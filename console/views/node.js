// @ts-check
// One node: every state axis, its conditions, cordon and uncordon, its devices, the inventory its agent last
// reported (section by section), and the commands sent to it.

import * as api from "../api.js";
import { badge, facts, failure, h, replace, section, table, time } from "../dom.js";

/** @typedef {import('../../clients/typescript/src/schema').components['schemas']} Schemas */
/** @typedef {import('../app.js').Context} Context */
/** @typedef {import('../app.js').View} View */

/**
 * @param {Context} context
 * @param {string} id
 * @returns {Promise<View>}
 */
export async function mount(context, id) {
  const body = h("div", { id: "node" });
  const refresh = async () => replace(body, ...(await draw(id, refresh)));
  replace(context.main, body);
  await refresh();
  return { refresh };
}

/**
 * @template T
 * @param {Promise<T>} read
 * @returns {Promise<T | Error>}
 */
async function settle(read) {
  try {
    return await read;
  } catch (err) {
    return err instanceof Error ? err : new Error(String(err));
  }
}

/**
 * @param {string} id
 * @param {() => Promise<void>} refresh
 */
async function draw(id, refresh) {
  const path = { node_id: id };
  const node = await api.get("/v1/nodes/{node_id}", { path });
  const [devices, inventory, commands] = await Promise.all([
    settle(api.get("/v1/nodes/{node_id}/devices", { path })),
    settle(api.get("/v1/nodes/{node_id}/inventory", { path })),
    settle(api.get("/v1/nodes/{node_id}/commands", { path })),
  ]);
  const problem = h("span", { class: "error small" });
  /** @param {"cordon" | "uncordon"} verb */
  const act = async (verb) => {
    try {
      if (verb === "cordon") {
        await api.post("/v1/nodes/{node_id}/cordon", { path }, { reason: "cordoned in the console" });
      } else {
        await api.post("/v1/nodes/{node_id}/uncordon", { path }, { reason: "uncordoned in the console" });
      }
      await refresh();
    } catch (err) {
      replace(problem, err instanceof Error ? err.message : String(err));
    }
  };
  return [
    h("h1", {}, "Node ", node.name, " ", h("span", { class: "id" }, node.id)),
    h(
      "div",
      { class: "columns" },
      section(
        "State",
        facts([
          ["Connectivity", badge(node.connectivity)],
          ["Schedulable", [node.schedulable ? badge("yes", "ok") : badge("no", "bad"), " ", node.noScheduleReasons.join(", ")]],
          ["Provision state", [badge(node.provisionState), node.provisionSince ? ` since ${time(node.provisionSince)}` : ""]],
          ["Power", node.power],
          ["Cordoned", [node.cordoned ? badge("cordoned", "warn") : "no", " ",
            h("button", { type: "button", class: "small", id: node.cordoned ? "uncordon" : "cordon", onclick: () => act(node.cordoned ? "uncordon" : "cordon") }, node.cordoned ? "Uncordon" : "Cordon"), problem]],
          ["Maintenance", node.maintenance ? badge("maintenance", "warn") : "no"],
          ["Draining", node.draining ? badge("draining", "warn") : "no"],
          ["Generation", `${node.observedGeneration} applied of ${node.generation}`],
        ]),
      ),
      section(
        "Machine",
        facts([
          ["Pool", h("a", { href: `#/pools/${node.poolId}/calendar` }, node.poolId)],
          ["Site", node.siteId],
          ["Owner", node.ownerTenantId ?? "—"],
          ["Role / trust", `${node.role} / ${node.trust}`],
          ["Adapter", node.adapter],
          ["GPUs / atoms", `${node.gpuCount} / ${node.atomCount} ${node.atomClass ?? ""}`],
          ["Resources", Object.entries(node.resources).map(([k, v]) => `${k}: ${v}`).join(", ") || "—"],
          ["Registered", time(node.registeredAt)],
          ["Hardware key", [node.hardwareKey ?? "—", node.hardwareTrusted ? "" : " (not trusted)"]],
        ]),
      ),
    ),
    section(
      "Conditions",
      table(
        ["Type", "Message", "Since"],
        node.conditions.map((c) => h("tr", {}, h("td", {}, badge(c.type, "warn")), h("td", {}, c.message), h("td", {}, time(c.since)))),
        "No conditions.",
      ),
    ),
    section("Devices", devices instanceof Error ? failure(devices) : deviceTable(devices)),
    section("Inventory", inventory instanceof Error ? failure(inventory) : inventoryView(inventory)),
    section("Commands", commands instanceof Error ? failure(commands) : commandTable(commands)),
  ];
}

/** @param {Schemas['NodeDevicesDto']} devices */
function deviceTable(devices) {
  return table(
    ["Device", "Class", "Parent", "Bookable", "Model", "Product", "Attributes"],
    devices.items.map((d) =>
      h(
        "tr",
        {},
        h("td", { class: "id" }, d.id),
        h("td", {}, d.class),
        h("td", { class: "id" }, d.parent ?? "—"),
        h("td", {}, d.bookable ? "yes" : "no"),
        h("td", {}, d.gpuModel),
        h("td", {}, d.gpuProduct),
        h("td", { class: "muted" }, Object.entries(d.attributes).map(([k, v]) => `${k}: ${v}`).join(", ")),
      ),
    ),
    "No devices.",
  );
}

/**
 * A value of the inventory document, as text.
 * @param {unknown} value
 */
function text(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

/** @param {Schemas['InventoryDto']} inventory */
function inventoryView(inventory) {
  /** @type {Record<string, unknown>} */
  const document = /** @type {any} */ (inventory.document);
  const parts = [h("p", { class: "muted small" }, `Snapshot ${inventory.snapshot}, received ${time(inventory.receivedAt)}`)];
  for (const [name, value] of Object.entries(document)) {
    if (Array.isArray(value) && value.length > 0 && typeof value[0] === "object") {
      const keys = [...new Set(value.flatMap((item) => Object.keys(item ?? {})))].slice(0, 10);
      parts.push(
        h("h3", {}, name),
        table(keys, value.map((item) => h("tr", {}, keys.map((k) => h("td", {}, text(item?.[k]))))), "None.", { class: "inventory", "data-section": name }),
      );
    } else if (value && typeof value === "object" && !Array.isArray(value)) {
      parts.push(h("h3", {}, name), h("div", { class: "inventory", "data-section": name }, facts(Object.entries(value).map(([k, v]) => [k, text(v)]))));
    } else {
      parts.push(h("div", { class: "muted small" }, `${name}: ${text(value)}`));
    }
  }
  return h("div", { id: "inventory" }, parts);
}

/** @param {Schemas['CommandListDto']} commands */
function commandTable(commands) {
  return table(
    ["Seq", "Kind", "State", "Created", "Finished", "Deliveries", "Message"],
    commands.items.map((c) =>
      h(
        "tr",
        {},
        h("td", { class: "num" }, c.seq),
        h("td", {}, c.kind),
        h("td", {}, badge(c.state)),
        h("td", {}, time(c.createdAt)),
        h("td", {}, time(c.finishedAt)),
        h("td", { class: "num" }, c.deliveries),
        h("td", { class: "muted" }, c.message ?? ""),
      ),
    ),
    "No commands.",
    { id: "commands" },
  );
}
