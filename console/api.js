// @ts-check
// The console's calls of the API, same origin, with the signed-in caller's bearer token. The paths and the
// answers are typed by the OpenAPI document (clients/typescript/src/schema.d.ts, generated from it), so a change
// of the API that breaks the console fails `npm run check`.

/** @typedef {import('../clients/typescript/src/schema').paths} Paths */
/** @typedef {import('../clients/typescript/src/schema').components['schemas']} Schemas */

/**
 * The paths that answer a GET with JSON.
 * @typedef {{ [P in keyof Paths]: Paths[P] extends { get: { responses: { 200: { content: { "application/json": unknown } } } } } ? P : never }[keyof Paths]} GetPath
 */
/**
 * The paths that answer a POST.
 * @typedef {{ [P in keyof Paths]: Paths[P] extends { post: { responses: unknown } } ? P : never }[keyof Paths]} PostPath
 */
/**
 * What a GET of `P` answers.
 * @template {GetPath} P
 * @typedef {Paths[P] extends { get: { responses: { 200: { content: { "application/json": infer T } } } } } ? T : never} GetAnswer
 */
/**
 * What a POST of `P` answers on success.
 * @template {PostPath} P
 * @typedef {Paths[P] extends { post: { responses: { 200: { content: { "application/json": infer T } } } } } ? T : Paths[P] extends { post: { responses: { 201: { content: { "application/json": infer T } } } } } ? T : never} PostAnswer
 */
/**
 * The JSON body a POST of `P` takes.
 * @template {PostPath} P
 * @typedef {Paths[P] extends { post: { requestBody: { content: { "application/json": infer B } } } } ? B : Paths[P] extends { post: { requestBody?: { content: { "application/json": infer B } } } } ? B | undefined : undefined} PostBody
 */
/** @typedef {{ path?: Record<string, string>, query?: Record<string, string | number | boolean | undefined | null>, headers?: Record<string, string> }} Params */

const TOKEN_KEY = "better-compute.token";

/** An answer that is not a success: the API's error code and message, and the HTTP status. */
export class ApiError extends Error {
  /**
   * @param {number} status
   * @param {string} code
   * @param {string} message
   * @param {Record<string, any>} [details] what names the problem (a field, or a refused reserve's explanation)
   */
  constructor(status, code, message, details) {
    super(`${code}: ${message}`);
    this.status = status;
    this.code = code;
    this.details = details ?? {};
  }
}

/** The signed-in caller's token, kept for the browser tab's session only. */
export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

/** @param {string} value */
export function signIn(value) {
  sessionStorage.setItem(TOKEN_KEY, value);
}

export function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
}

/**
 * The URL of `path` with its path parameters and query filled in.
 * @param {string} path
 * @param {Params} [params]
 */
function url(path, params = {}) {
  const filled = path.replace(/\{([a-z_]+)\}/g, (_, name) => {
    const value = params.path?.[name];
    if (value === undefined) {
      throw new Error(`no value for {${name}} of ${path}`);
    }
    return encodeURIComponent(value);
  });
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params.query ?? {})) {
    if (value !== undefined && value !== null && value !== "") {
      query.set(name, String(value));
    }
  }
  const text = query.toString();
  return text ? `${filled}?${text}` : filled;
}

/** How many times a call refused as one too many in flight for the token is sent again. */
const BUSY_RETRIES = 5;

/** The longest `Retry-After`, in seconds, a call waits out; a longer one is shown as the error it is. */
const BUSY_WAIT_MAX_SECONDS = 10;

/**
 * The seconds to wait before sending a call again that `answer` refused as one too many in flight for the token
 * (`429` with the code `TOO_MANY_REQUESTS`: refused before anything ran, so safe to send again whatever the
 * method); `undefined` for any other answer, or a `Retry-After` that is not whole seconds up to
 * `BUSY_WAIT_MAX_SECONDS`. A fleet view draws many calls at once, and a page should not fail on that.
 * @param {Response} answer
 * @returns {Promise<number | undefined>}
 */
async function busyWait(answer) {
  if (answer.status !== 429) {
    return undefined;
  }
  const header = answer.headers.get("Retry-After")?.trim() ?? "";
  if (!/^[0-9]+$/.test(header) || Number(header) > BUSY_WAIT_MAX_SECONDS) {
    return undefined;
  }
  /** @type {any} */
  const json = await answer
    .clone()
    .json()
    .catch(() => undefined);
  return json?.error?.code === "TOO_MANY_REQUESTS" ? Number(header) : undefined;
}

/**
 * One call; the JSON body of a success, or an [`ApiError`]. A call refused as one too many in flight is sent
 * again after the server's `Retry-After`, up to `BUSY_RETRIES` times.
 * @param {string} method
 * @param {string} path
 * @param {Params} [params]
 * @param {unknown} [body]
 * @returns {Promise<unknown>}
 */
async function call(method, path, params = {}, body = undefined) {
  /** @type {Record<string, string>} */
  const headers = { Accept: "application/json", ...(params.headers ?? {}) };
  const bearer = token();
  if (bearer) {
    headers.Authorization = `Bearer ${bearer}`;
  }
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
  }
  const request = { method, headers, body: body === undefined ? undefined : JSON.stringify(body) };
  let answer = await fetch(url(path, params), request);
  for (let retry = 0; retry < BUSY_RETRIES; retry += 1) {
    const wait = await busyWait(answer);
    if (wait === undefined) {
      break;
    }
    await new Promise((resolve) => setTimeout(resolve, wait * 1000));
    answer = await fetch(url(path, params), request);
  }
  const text = await answer.text();
  /** @type {any} */
  const json = text ? JSON.parse(text) : null;
  if (!answer.ok) {
    /** @type {Schemas['ErrorBody'] | null} */
    const error = json;
    throw new ApiError(
      answer.status,
      error?.error?.code ?? `HTTP_${answer.status}`,
      error?.error?.message ?? answer.statusText,
      error?.error?.details,
    );
  }
  return json;
}

/** The position of the newest event the console has shown ("" before the first). */
let seen = "";

/**
 * Records that the console has shown the event at `position` ("" to forget, at sign-out): the reads that follow
 * ask the API to answer from read models that have passed it (`X-Min-Position`), so a view redrawn because of an
 * event never shows what came before that event.
 * @param {string} position
 */
export function saw(position) {
  seen = position;
}

/** How many times a read asks again while the read models have not reached the event it waits for. */
const NOT_YET_CONSISTENT_TRIES = 3;

/**
 * `GET path`, typed by the document, from read models that have passed the newest event shown. The API waits
 * up to two seconds for them and then answers 503 NOT_YET_CONSISTENT: the read is asked again a few times, and
 * at last without the position, so that a lagging read model shows late data rather than an error.
 * @template {GetPath} P
 * @param {P} path
 * @param {Params} [params]
 * @returns {Promise<GetAnswer<P>>}
 */
export async function get(path, params = {}) {
  const position = seen;
  if (position) {
    for (let attempt = 0; attempt < NOT_YET_CONSISTENT_TRIES; attempt += 1) {
      try {
        const headers = { ...(params.headers ?? {}), "X-Min-Position": position };
        return /** @type {GetAnswer<P>} */ (await call("GET", path, { ...params, headers }));
      } catch (err) {
        if (!(err instanceof ApiError && err.code === "NOT_YET_CONSISTENT")) {
          throw err;
        }
      }
    }
  }
  return /** @type {GetAnswer<P>} */ (await call("GET", path, params));
}

/**
 * `POST path` with a JSON body, typed by the document.
 * @template {PostPath} P
 * @param {P} path
 * @param {Params} params
 * @param {PostBody<P>} [body]
 * @returns {Promise<PostAnswer<P>>}
 */
export async function post(path, params, body) {
  return /** @type {PostAnswer<P>} */ (await call("POST", path, params, body));
}

/**
 * Every item of a paged list, following `nextCursor` up to `pages` pages.
 * @template {GetPath} P
 * @param {P} path
 * @param {Params} [params]
 * @param {number} [pages]
 * @returns {Promise<GetAnswer<P> extends { items: (infer I)[] } ? I[] : never>}
 */
export async function all(path, params = {}, pages = 20) {
  /** @type {any[]} */
  const items = [];
  /** @type {string | undefined} */
  let cursor;
  for (let page = 0; page < pages; page += 1) {
    /** @type {any} */
    const answer = await get(path, { ...params, query: { ...(params.query ?? {}), limit: 500, cursor } });
    items.push(...answer.items);
    cursor = answer.nextCursor ?? undefined;
    if (!cursor) {
      break;
    }
  }
  return /** @type {any} */ (items);
}

/**
 * The caller's view: whether it is one of the platform's administrators (who read every tenant's reservations
 * and audit trail at `/v1/fleet/...`). Asked once per sign-in.
 * @returns {Promise<{ admin: boolean }>}
 */
export async function whoAmI() {
  try {
    await get("/v1/fleet/audit", { query: { limit: 1 } });
    return { admin: true };
  } catch (err) {
    if (err instanceof ApiError && (err.status === 403 || err.status === 404)) {
      return { admin: false };
    }
    throw err;
  }
}

/**
 * A URL of the event stream for `EventSource` (which cannot send a header): a stream ticket in the query.
 * @param {{ stream?: string, after?: string, types?: string }} [filter]
 */
export async function eventStreamUrl(filter = {}) {
  const issued = await post("/v1/events/tickets", {});
  return url("/v1/events", { query: { ticket: issued.ticket, eventName: "message", ...filter } });
}

/**
 * A new idempotency key for a create.
 */
export function idempotencyKey() {
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  return `console-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}
