// The console's own calls (console/api.js) send again a call refused `429 TOO_MANY_REQUESTS`, as the client does:
// a `fetch` that answers from a script stands in for the browser's. Run with `npm test`.

import assert from "node:assert/strict";
import { test } from "node:test";

const sent = [];
let answers = [];

globalThis.sessionStorage = {
  store: new Map(),
  getItem(key) {
    return this.store.get(key) ?? null;
  },
  setItem(key, value) {
    this.store.set(key, value);
  },
  removeItem(key) {
    this.store.delete(key);
  },
};
globalThis.fetch = async (url, init) => {
  sent.push({ url, method: init.method, body: init.body, authorization: init.headers.Authorization });
  const next = answers.shift();
  assert.ok(next, `an answer was scripted for request ${sent.length}`);
  return next();
};

const api = await import("../../../console/api.js");

function script(...next) {
  sent.length = 0;
  answers = next;
}

function refused(code, retryAfter) {
  return () =>
    new Response(JSON.stringify({ error: { code, message: "too many", details: {} } }), {
      status: 429,
      headers: { "Content-Type": "application/json", "Retry-After": retryAfter },
    });
}

function json(status, body) {
  return () => new Response(JSON.stringify(body), { status, headers: { "Content-Type": "application/json" } });
}

api.signIn("console-token");

test("a console call refused as too many in flight is sent again after Retry-After, body and all", async () => {
  script(refused("TOO_MANY_REQUESTS", "0"), refused("TOO_MANY_REQUESTS", "0"), json(201, { id: "rsv_1" }));
  const body = { poolId: "pool_01", devices: { class: "gpu", count: 2 }, duration: 3600 };
  const answer = await api.post("/v1/reservations", { headers: { "Idempotency-Key": "k" } }, body);
  assert.equal(answer.id, "rsv_1");
  assert.equal(sent.length, 3, "two refusals, then the call that was served");
  for (const request of sent) {
    assert.equal(request.method, "POST");
    assert.equal(request.url, "/v1/reservations");
    assert.equal(request.authorization, "Bearer console-token");
    assert.deepEqual(JSON.parse(request.body), body, "every resend carries the whole body");
  }
});

test("a console read refused as too many in flight is read again", async () => {
  script(refused("TOO_MANY_REQUESTS", "0"), json(200, { items: [], nextCursor: null }));
  const answer = await api.get("/v1/pools");
  assert.deepEqual(answer.items, []);
  assert.equal(sent.length, 2);
});

test("the console gives up after five resends and shows the refusal", async () => {
  script(...Array.from({ length: 6 }, () => refused("TOO_MANY_REQUESTS", "0")));
  await assert.rejects(api.get("/v1/pools"), (err) => err.status === 429 && err.code === "TOO_MANY_REQUESTS");
  assert.equal(sent.length, 6, "the call and five resends");
});

test("a refusal for too many streams, or with a long or odd Retry-After, is not sent again", async () => {
  for (const [code, retryAfter] of [
    ["TOO_MANY_STREAMS", "0"],
    ["TOO_MANY_REQUESTS", "60"],
    ["TOO_MANY_REQUESTS", "Wed, 21 Oct 2015 07:28:00 GMT"],
  ]) {
    script(refused(code, retryAfter));
    await assert.rejects(api.get("/v1/pools"), (err) => err.status === 429 && err.code === code);
    assert.equal(sent.length, 1, `${code} with Retry-After ${retryAfter} is answered as it came`);
  }
});
