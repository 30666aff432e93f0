import assert from "node:assert/strict";
import { createServer } from "node:net";
import { describe, test } from "node:test";
import {
  AuthenticationError,
  BadRequestError,
  ConfigurationError,
  ConflictError,
  ConnectionError,
  InvalidStateError,
  NotFoundError,
  Session,
  SpaceError,
  UnknownTemplateError,
} from "@space/sdk";
import { SUITE_TIMEOUT, TEMPLATE, newSession, server } from "./helpers.js";

/** The error `promise` rejects with (failing when it resolves). */
async function failure(promise: Promise<unknown>): Promise<SpaceError> {
  const error = await promise.then(
    () => assert.fail("expected the call to fail"),
    (e: unknown) => e,
  );
  assert.ok(error instanceof SpaceError, `not a SpaceError: ${String(error)}`);
  return error;
}

describe("typed errors", { timeout: SUITE_TIMEOUT }, () => {
  test("404: a session that does not exist", async () => {
    const error = await failure(Session.connect("ses_00000000000000000000000000", server()));
    assert.ok(error instanceof NotFoundError);
    assert.equal(error.code, "not_found");
    assert.equal(error.status, 404);
    assert.match(error.message, /ses_00000000000000000000000000/);
    assert.equal(error.name, "NotFoundError");
  });

  test("404 also for calls on a destroyed session's commands", async () => {
    const s = await newSession();
    await s.destroy();
    const error = await failure(s.commands.run("true"));
    assert.ok(error instanceof NotFoundError || error instanceof InvalidStateError, `${error.code}`);
  });

  test("400: bad input", async () => {
    const error = await failure(Session.create({ ...server(), template: TEMPLATE, cpus: 1000 }));
    assert.ok(error instanceof BadRequestError);
    assert.equal(error.code, "bad_request");
    assert.equal(error.status, 400);
    assert.match(error.message, /cpus/);
    const template = await failure(Session.create({ ...server(), template: "no-such-template" }));
    assert.ok(template instanceof UnknownTemplateError && template instanceof BadRequestError);
    assert.equal(template.code, "unknown_template");
    const s = await newSession();
    const empty = await failure(s.commands.run([]));
    assert.ok(empty instanceof BadRequestError);
  });

  test("409: a call the session's state does not allow", async () => {
    const s = await newSession();
    await s.pause();
    const error = await failure(s.commands.run("true"));
    assert.ok(error instanceof InvalidStateError && error instanceof ConflictError);
    assert.equal(error.code, "invalid_state");
    assert.equal(error.status, 409);
    assert.match(error.message, /paused/);
    const streamed = await failure(s.commands.run("true", { onStdout: () => {} }));
    assert.ok(streamed instanceof InvalidStateError, "a refused WebSocket upgrade is typed too");
    const watch = await failure(s.files.watch("/tmp"));
    assert.ok(watch instanceof InvalidStateError);
    await s.resume();
  });

  test("401: a wrong API key", async () => {
    const error = await failure(Session.list({ url: server().url, apiKey: "sk_wrong" }));
    assert.ok(error instanceof AuthenticationError);
    assert.equal(error.status, 401);
  });

  test("no server, no key", async () => {
    const listener = createServer();
    await new Promise<void>((resolve) => listener.listen(0, "127.0.0.1", resolve));
    const port = (listener.address() as { port: number }).port;
    await new Promise((resolve) => listener.close(resolve));
    const error = await failure(Session.list({ url: `http://127.0.0.1:${port}`, apiKey: "x" }));
    assert.ok(error instanceof ConnectionError);
    assert.equal(error.code, "connection_error");
    assert.match(error.message, /SPACE_URL/);
    const { url } = server();
    const saved = process.env.SPACE_API_KEY;
    delete process.env.SPACE_API_KEY;
    try {
      await assert.rejects(Session.list({ url }), ConfigurationError);
    } finally {
      process.env.SPACE_API_KEY = saved;
    }
  });
});
