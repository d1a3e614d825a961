// @ts-check
// Building the page: elements are made with their text set through `textContent` and their attributes through
// `setAttribute`, never from HTML strings, so nothing the API answers can become markup or script.

const SVG = "http://www.w3.org/2000/svg";

/** @typedef {Node | string | number | null | undefined | false} Child */
/** @typedef {Record<string, string | number | boolean | null | undefined | ((event: Event) => void)>} Attrs */

/**
 * An HTML element: `h("a", { href: "#/fleet", class: "nav" }, "Fleet")`. Attributes starting with `on` are
 * listeners; `false`, `null` and `undefined` leave an attribute or a child out.
 * @template {keyof HTMLElementTagNameMap} K
 * @param {K} tag
 * @param {Attrs} [attrs]
 * @param {...(Child | Child[])} children
 * @returns {HTMLElementTagNameMap[K]}
 */
export function h(tag, attrs = {}, ...children) {
  const element = document.createElement(tag);
  fill(element, attrs, children);
  return element;
}

/**
 * An SVG element, as [`h`] makes HTML ones.
 * @param {string} tag
 * @param {Attrs} [attrs]
 * @param {...(Child | Child[])} children
 * @returns {SVGElement}
 */
export function s(tag, attrs = {}, ...children) {
  const element = /** @type {SVGElement} */ (document.createElementNS(SVG, tag));
  fill(element, attrs, children);
  return element;
}

/**
 * @param {Element} element
 * @param {Attrs} attrs
 * @param {(Child | Child[])[]} children
 */
function fill(element, attrs, children) {
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) {
      continue;
    }
    if (typeof value === "function") {
      element.addEventListener(name.slice(2), value);
    } else {
      element.setAttribute(name, value === true ? "" : String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) {
      continue;
    }
    element.append(typeof child === "object" ? child : document.createTextNode(String(child)));
  }
}

/**
 * Replaces what `parent` holds with `children`.
 * @param {Element} parent
 * @param {...(Child | Child[])} children
 */
export function replace(parent, ...children) {
  const fragment = document.createDocumentFragment();
  for (const child of children.flat()) {
    if (child !== undefined && child !== null && child !== false) {
      fragment.append(typeof child === "object" ? child : document.createTextNode(String(child)));
    }
  }
  parent.replaceChildren(fragment);
}

/** @param {number | null | undefined} ms */
export function time(ms) {
  if (ms === null || ms === undefined) {
    return "—";
  }
  const at = new Date(ms);
  const pad = (/** @type {number} */ n) => String(n).padStart(2, "0");
  return `${at.getFullYear()}-${pad(at.getMonth() + 1)}-${pad(at.getDate())} ${pad(at.getHours())}:${pad(at.getMinutes())}:${pad(at.getSeconds())}`;
}

/** @param {number} seconds */
export function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  const d = Math.floor(s / 86400);
  const hh = Math.floor((s % 86400) / 3600);
  const mm = Math.floor((s % 3600) / 60);
  if (d > 0) return `${d}d ${hh}h`;
  if (hh > 0) return `${hh}h ${mm}m`;
  if (mm > 0) return `${mm}m`;
  return `${s}s`;
}

/**
 * A short form of a long id: `rsv_7trkpw2p…`.
 * @param {string} id
 */
export function short(id) {
  return id.length > 16 ? `${id.slice(0, 12)}…` : id;
}

/**
 * A coloured label of a state: its class names the state, so the style sheet colours it.
 * @param {string} text
 * @param {string} [kind]
 */
export function badge(text, kind) {
  return h("span", { class: `badge ${kind ?? ""} s-${text.replace(/[^a-z0-9-]/gi, "")}` }, text);
}

/**
 * A table with a header row.
 * @param {string[]} heads
 * @param {HTMLTableRowElement[]} rows
 * @param {string} [empty] what to say when there are no rows
 * @param {Attrs} [attrs]
 */
export function table(heads, rows, empty = "None.", attrs = {}) {
  if (rows.length === 0) {
    return h("p", { class: "empty" }, empty);
  }
  return h(
    "table",
    attrs,
    h("thead", {}, h("tr", {}, heads.map((head) => h("th", {}, head)))),
    h("tbody", {}, rows),
  );
}

/**
 * A definition list of labels and values.
 * @param {[string, Child | Child[]][]} pairs
 */
export function facts(pairs) {
  return h(
    "dl",
    { class: "facts" },
    pairs.flatMap(([label, value]) => [h("dt", {}, label), h("dd", {}, value ?? "—")]),
  );
}

/**
 * A section with a heading.
 * @param {string} title
 * @param {...(Child | Child[])} children
 */
export function section(title, ...children) {
  return h("section", { class: "panel" }, h("h2", {}, title), ...children);
}

/**
 * The message of an error, for the page.
 * @param {unknown} err
 */
export function message(err) {
  return err instanceof Error ? err.message : String(err);
}

/**
 * A notice of a failure.
 * @param {unknown} err
 */
export function failure(err) {
  return h("p", { class: "error", role: "alert" }, message(err));
}
