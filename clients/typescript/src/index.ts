// A typed client of Better Compute's API: `openapi-fetch` over the types `openapi-typescript` generates from the
// OpenAPI document the service serves (`openapi.json`, kept equal to it by the service's tests). A change of the
// API that breaks a caller of this client fails `npm run check`, and so CI.

import createFetchClient, { type Client, type Middleware } from "openapi-fetch";

import type { components, operations, paths } from "./schema";

export type { components, operations, paths };

/** Every schema of the document, by name: `Schemas["ReservationDto"]`. */
export type Schemas = components["schemas"];
export type Reservation = Schemas["ReservationDto"];
export type ReserveBody = Schemas["ReserveBody"];
export type Node = Schemas["NodeDto"];
export type Pool = Schemas["PoolDto"];
export type Site = Schemas["SiteDto"];
export type AuditEntry = Schemas["AuditDto"];
export type ErrorBody = Schemas["ErrorBody"];

/** The typed client: `client.GET("/v1/pools/{pool_id}", { params: { path: { pool_id } } })`. */
export type BetterComputeClient = Client<paths>;

export interface Options {
  /** The service's origin, such as `https://127.0.0.1:8080`; the page's own origin when left out. */
  baseUrl?: string;
  /** A bearer token, sent as `Authorization: Bearer <token>` on every request. */
  token: string;
  /** A `fetch` of your own (tests, other runtimes). */
  fetch?: (input: Request) => Promise<Response>;
  /** How many times a call refused `429 TOO_MANY_REQUESTS` is sent again (5 when left out; 0 never). */
  busyRetries?: number;
}

/** The longest `Retry-After`, in seconds, a call waits out; a server asking for longer is answered as the error. */
export const BUSY_WAIT_MAX_SECONDS = 10;

/** A client that sends `token` on every request. A call the server refused as one too many in flight for its
 * token (`429` with the code `TOO_MANY_REQUESTS`, refused before anything ran, so safe to send again whatever its
 * method) is sent again after the server's `Retry-After`, up to `busyRetries` times. */
export function createClient(options: Options): BetterComputeClient {
  const base = options.fetch ?? ((input: Request) => globalThis.fetch(input));
  const fetch = resendingWhenBusy(base, options.busyRetries ?? 5);
  const client = createFetchClient<paths>({ baseUrl: options.baseUrl ?? "", fetch });
  const bearer: Middleware = {
    onRequest({ request }) {
      request.headers.set("Authorization", `Bearer ${options.token}`);
      return request;
    },
  };
  client.use(bearer);
  return client;
}

/** `fetch`, sending again a request refused `429 TOO_MANY_REQUESTS` after the `Retry-After` it names. Any other
 * answer, another 429 (`TOO_MANY_STREAMS`), a wait longer than [`BUSY_WAIT_MAX_SECONDS`] or a refusal past
 * `retries` is handed back as it came. */
function resendingWhenBusy(
  base: (input: Request) => Promise<Response>,
  retries: number,
): (input: Request) => Promise<Response> {
  return async (request: Request) => {
    for (let attempt = 0; ; attempt++) {
      // The body is read once by `base`; the copy is what a resend sends.
      const again = attempt < retries ? request.clone() : undefined;
      const response = await base(request);
      if (again === undefined) {
        return response;
      }
      const wait = await busyWait(response);
      if (wait === undefined) {
        return response;
      }
      await response.body?.cancel();
      await new Promise((resolve) => setTimeout(resolve, wait * 1000));
      request = again;
    }
  };
}

/** The seconds a `429 TOO_MANY_REQUESTS` asks to wait, when its `Retry-After` is whole seconds no longer than
 * [`BUSY_WAIT_MAX_SECONDS`]. */
async function busyWait(response: Response): Promise<number | undefined> {
  if (response.status !== 429) {
    return undefined;
  }
  const header = response.headers.get("Retry-After")?.trim() ?? "";
  if (!/^[0-9]+$/.test(header) || Number(header) > BUSY_WAIT_MAX_SECONDS) {
    return undefined;
  }
  const body = (await response
    .clone()
    .json()
    .catch(() => undefined)) as Partial<ErrorBody> | undefined;
  return body?.error?.code === "TOO_MANY_REQUESTS" ? Number(header) : undefined;
}

/** An answer that was not a success: the API's error code and message, and the HTTP status. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(`${code}: ${message}`);
    this.name = "ApiError";
  }
}

/** The body of a success, or an [`ApiError`] carrying the error body's code and message. */
export function ok<T>(answer: { data?: T; error?: unknown; response: Response }): T {
  if (answer.data !== undefined && answer.response.ok) {
    return answer.data;
  }
  const body = answer.error as Partial<ErrorBody> | undefined;
  const code = body?.error?.code ?? `HTTP_${answer.response.status}`;
  throw new ApiError(answer.response.status, code, body?.error?.message ?? answer.response.statusText);
}

/** Reserves devices; `idempotencyKey` names the reservation, so a retry with the same key answers the same one. */
export async function reserve(
  client: BetterComputeClient,
  body: ReserveBody,
  idempotencyKey: string,
): Promise<Reservation> {
  return ok(await client.POST("/v1/reservations", { body, params: { header: { "Idempotency-Key": idempotencyKey } } }));
}

/** Every reservation of the caller's tenant, following `nextCursor` to the last page. */
export async function listReservations(
  client: BetterComputeClient,
  query: { poolId?: string; state?: string } = {},
): Promise<Reservation[]> {
  const all: Reservation[] = [];
  let cursor: string | undefined;
  do {
    const page = ok(await client.GET("/v1/reservations", { params: { query: { ...query, limit: 500, cursor } } }));
    all.push(...page.items);
    cursor = page.nextCursor ?? undefined;
  } while (cursor);
  return all;
}

/** The URL of the event stream for a browser's `EventSource`, which cannot send an `Authorization` header: a
 * stream ticket (valid five minutes, reconnections included) in the query instead. */
export async function eventStreamUrl(
  client: BetterComputeClient,
  baseUrl: string,
  filter: { types?: string; stream?: string; after?: string } = {},
): Promise<string> {
  const issued = ok(await client.POST("/v1/events/tickets"));
  const query = new URLSearchParams({ ticket: issued.ticket, eventName: "message" });
  for (const [name, value] of Object.entries(filter)) {
    if (value !== undefined) {
      query.set(name, value);
    }
  }
  return `${baseUrl}/v1/events?${query}`;
}
