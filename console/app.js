// @ts-check
// The console's shell: sign-in with a bearer token (kept in sessionStorage), hash routing between the views, and
// the event stream (a stream ticket, then `EventSource`), which lists events as they happen and refreshes the
// open view without a reload.

import * as api from "./api.js";
import { failure, h, replace, short, time } from "./dom.js";
import * as audit from "./views/audit.js";
import * as calendar from "./views/calendar.js";
import * as fleet from "./views/fleet.js";
import * as node from "./views/node.js";
import * as reservation from "./views/reservation.js";
import * as reservations from "./views/reservations.js";

/**
 * An event of the stream, as `GET /v1/events` sends it in `data:`.
 * @typedef {{ position: string, streamId: string, streamVersion: number, eventType: string, schemaVersion: number,
 *   tenantId?: string | null, recordedAt: number, payload: Record<string, unknown>,
 *   metadata: { admission?: Record<string, unknown>, requestId?: string, correlationId?: string, causationId?: string } }} StreamEvent
 */
/**
 * What a view gets: where to draw, who is calling, and how to go elsewhere.
 * @typedef {{ main: HTMLElement, admin: boolean, go: (hash: string) => void }} Context
 */
/**
 * An open view: `refresh` redraws what the API holds now (called on events), `event` sees each event, `close`
 * ends what it opened.
 * @typedef {{ refresh?: () => Promise<void>, event?: (event: StreamEvent) => void, close?: () => void }} View
 */

const main = /** @type {HTMLElement} */ (document.getElementById("main"));
const nav = /** @type {HTMLElement} */ (document.getElementById("nav"));
const feed = /** @type {HTMLElement} */ (document.getElementById("feed"));
const list = /** @type {HTMLOListElement} */ (document.getElementById("events"));
const live = /** @type {HTMLElement} */ (document.getElementById("live"));
const signOutButton = /** @type {HTMLButtonElement} */ (document.getElementById("sign-out"));

/** @type {View | null} */
let open = null;
/** @type {EventSource | null} */
let source = null;
/** The last position the stream delivered, to resume from with a new ticket. */
let lastPosition = "";
/** @type {ReturnType<typeof setTimeout> | null} */
let pending = null;
let caller = { admin: false };

/** @param {string} hash */
function go(hash) {
  if (location.hash === hash) {
    route();
  } else {
    location.hash = hash;
  }
}

function signInForm() {
  nav.hidden = true;
  feed.hidden = true;
  signOutButton.hidden = true;
  const input = h("input", {
    id: "token",
    type: "password",
    name: "token",
    autocomplete: "off",
    placeholder: "bearer token",
    required: true,
  });
  const problem = h("p", { class: "error", role: "alert" });
  const form = h(
    "form",
    { id: "sign-in", class: "sign-in panel" },
    h("h1", {}, "Sign in"),
    h("p", { class: "hint" }, "Paste a bearer token (`better-compute dev` prints two). It stays in this tab only."),
    h("label", { for: "token" }, "Token"),
    input,
    h("button", { type: "submit" }, "Sign in"),
    problem,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    api.signIn(input.value.trim());
    try {
      await api.get("/v1/pools", { query: { limit: 1 } });
    } catch (err) {
      api.signOut();
      replace(problem, err instanceof api.ApiError && err.status === 401 ? "That token is not valid." : String(err));
      return;
    }
    await start();
  });
  replace(main, form);
  input.focus();
}

async function start() {
  try {
    caller = await api.whoAmI();
  } catch (err) {
    replace(main, failure(err));
    return;
  }
  nav.hidden = false;
  feed.hidden = false;
  signOutButton.hidden = false;
  document.body.dataset.admin = String(caller.admin);
  follow();
  if (!location.hash || location.hash === "#" || location.hash === "#/") {
    location.hash = "#/fleet";
  } else {
    route();
  }
}

/** Follows the event stream: each event is listed, given to the open view, and refreshes it (at most every
 * half second). A closed stream (an expired ticket) is opened again with a new ticket where it stopped. */
async function follow() {
  source?.close();
  let url;
  try {
    url = await api.eventStreamUrl(lastPosition ? { after: lastPosition } : {});
  } catch (err) {
    live.textContent = "offline";
    setTimeout(follow, 5000);
    return;
  }
  const events = new EventSource(url);
  source = events;
  events.onopen = () => {
    live.textContent = "live";
    live.className = "live on";
    document.body.dataset.streamOpen = String(Number(document.body.dataset.streamOpen ?? "0") + 1);
  };
  events.onerror = () => {
    live.textContent = "reconnecting";
    live.className = "live";
    if (events.readyState === EventSource.CLOSED && source === events) {
      setTimeout(follow, 2000);
    }
  };
  events.onmessage = (message) => {
    /** @type {StreamEvent} */
    const event = JSON.parse(message.data);
    lastPosition = event.position;
    api.saw(event.position);
    const item = h(
      "li",
      { "data-type": event.eventType, "data-stream": event.streamId },
      h("span", { class: "when" }, time(event.recordedAt).slice(11)),
      " ",
      h("b", {}, event.eventType),
      " ",
      link(event.streamId),
    );
    list.prepend(item);
    while (list.children.length > 60) {
      list.lastElementChild?.remove();
    }
    open?.event?.(event);
    if (open?.refresh && !pending) {
      pending = setTimeout(() => {
        pending = null;
        open?.refresh?.().catch(() => {});
      }, 500);
    }
  };
}

/**
 * A link to what a stream id names, when the console has a view of it.
 * @param {string} id
 */
function link(id) {
  if (id.startsWith("rsv_")) return h("a", { href: `#/reservations/${id}`, title: id }, short(id));
  if (id.startsWith("node_")) return h("a", { href: `#/nodes/${id}`, title: id }, short(id));
  if (id.startsWith("pool_")) return h("a", { href: `#/pools/${id}/calendar`, title: id }, short(id));
  return h("span", { title: id }, short(id));
}

/** Opens the view the hash names. */
async function route() {
  if (!api.token()) {
    signInForm();
    return;
  }
  open?.close?.();
  open = null;
  const hash = location.hash.replace(/^#/, "");
  const parts = hash.split("?")[0].split("/").filter(Boolean).map(decodeURIComponent);
  for (const a of nav.querySelectorAll("a")) {
    a.classList.toggle("active", a.dataset.view === parts[0]);
  }
  /** @type {Context} */
  const context = { main, admin: caller.admin, go };
  replace(main, h("p", { class: "loading" }, "Loading…"));
  try {
    if (parts[0] === "fleet" || parts.length === 0) {
      open = await fleet.mount(context);
    } else if (parts[0] === "pools" && parts[2] === "calendar") {
      open = await calendar.mount(context, parts[1]);
    } else if (parts[0] === "reservations" && parts[1]) {
      open = await reservation.mount(context, parts[1]);
    } else if (parts[0] === "reservations") {
      open = await reservations.mount(context);
    } else if (parts[0] === "nodes" && parts[1]) {
      open = await node.mount(context, parts[1]);
    } else if (parts[0] === "audit") {
      open = await audit.mount(context);
    } else {
      replace(main, h("p", { class: "error" }, `No view ${hash}.`));
    }
  } catch (err) {
    if (err instanceof api.ApiError && err.status === 401) {
      api.signOut();
      signInForm();
      return;
    }
    replace(main, failure(err));
  }
  document.body.dataset.view = parts[0] ?? "fleet";
}

signOutButton.addEventListener("click", () => {
  api.signOut();
  source?.close();
  source = null;
  // What the last caller's stream showed is theirs: the next caller starts from an empty feed, at the stream's
  // present.
  lastPosition = "";
  api.saw("");
  list.replaceChildren();
  location.hash = "";
  signInForm();
});
window.addEventListener("hashchange", route);
if (api.token()) {
  start();
} else {
  signInForm();
}
