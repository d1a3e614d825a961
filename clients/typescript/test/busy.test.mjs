// The client's resend of a call refused `429 TOO_MANY_REQUESTS`, against a `fetch` that answers from a script.
// Run with `npm test` (tsc builds src/ into build/ first).

import assert from "node:assert/strict";
import { test } from "node:test";

import { createClient, ok } from "../build/index.js";

const POOL = "pool_01";

/** A `fetch` that answers each request with the next of `answers` and keeps what it was sent. */
function scripted(answers) {
  const sent = [];
  const fetch = async (request) => {
    sent.push({ method: request.method, url: request.url, body: await request.text() });
    const next = answers.shift();
    assert.ok(next, `an answer was scripted for request ${sent.length}`);
    return next();
  };
  return { fetch, sent };
}

function refused(code, retryAfter) {
  return () =>
    new Response(JSON.stringify({ error: { code, message: "too many", details: {} } }), {
      status: 429,
      headers: { "Content-Type": "application/json", "Retry-After": retryAfter },
    });
}

function pool() {
  return new Response(JSON.stringify({ id: POOL, name: "h100" }), {
    status: 200,
    headers: { "Content-Type": "application/json" },
  });
}

function created() {
  return new Response(JSON.stringify({ id: "rsv_1", state: "placed" }), {
    status: 201,
    headers: { "Content-Type": "application/json" },
  });
}

test("a call refused as too many in flight is sent again after Retry-After, body and all", async () => {
  const { fetch, sent } = scripted([refused("TOO_MANY_REQUESTS", "0"), refused("TOO_MANY_REQUESTS", "0"), created]);
  const client = createClient({ baseUrl: "https://bc.test", token: "t", fetch });
  const body = { poolId: POOL, devices: { class: "gpu", count: 2 }, duration: 3600 };
  const answer = await client.POST("/v1/reservations", {
    body,
    params: { header: { "Idempotency-Key": "k" } },
  });
  assert.equal(answer.response.status, 201);
  assert.equal(ok(answer).id, "rsv_1");
  assert.equal(sent.length, 3, "two refusals, then the call that was served");
  for (const request of sent) {
    assert.equal(request.method, "POST");
    assert.deepEqual(JSON.parse(request.body), body, "every resend carries the whole body");
  }
});

test("another 429, a long Retry-After, or a client told not to retry answers the refusal at once", async () => {
  const cases = [
    { name: "too many streams", answer: refused("TOO_MANY_STREAMS", "0"), options: {} },
    { name: "a wait past ten seconds", answer: refused("TOO_MANY_REQUESTS", "11"), options: {} },
    { name: "a Retry-After that is a date", answer: refused("TOO_MANY_REQUESTS", "Wed, 21 Oct 2026 07:28:00 GMT"), options: {} },
    { name: "no retries", answer: refused("TOO_MANY_REQUESTS", "0"), options: { busyRetries: 0 } },
  ];
  for (const { name, answer, options } of cases) {
    const { fetch, sent } = scripted([answer, pool]);
    const client = createClient({ baseUrl: "https://bc.test", token: "t", fetch, ...options });
    const got = await client.GET("/v1/pools/{pool_id}", { params: { path: { pool_id: POOL } } });
    assert.equal(got.response.status, 429, name);
    assert.equal(sent.length, 1, `${name}: sent once`);
    assert.throws(() => ok(got), (err) => err.status === 429, name);
  }
});

test("a call refused past its retries answers the last refusal", async () => {
  const { fetch, sent } = scripted(Array.from({ length: 4 }, () => refused("TOO_MANY_REQUESTS", "0")));
  const client = createClient({ baseUrl: "https://bc.test", token: "t", fetch, busyRetries: 3 });
  const got = await client.GET("/v1/pools/{pool_id}", { params: { path: { pool_id: POOL } } });
  assert.equal(got.response.status, 429);
  assert.equal(got.error.error.code, "TOO_MANY_REQUESTS", "the refusal's body is still readable");
  assert.equal(sent.length, 4, "the first call and three resends");
});
