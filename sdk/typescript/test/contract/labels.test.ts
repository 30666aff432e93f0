// Names, labels, metadata and list filters (issue 15, branch `keys`).

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { describe, test } from "node:test";
import { BadRequestError, Session } from "@space/sdk";
import { SUITE_TIMEOUT, newSession, server } from "../helpers.js";

describe("names, labels and metadata", { timeout: SUITE_TIMEOUT }, () => {
  test("are set at create, shown, changed, and filter the list", async () => {
    const run = randomUUID().slice(0, 8);
    const a = await newSession({
      name: "agent a",
      labels: { "sdk-test": run, role: "a" },
      metadata: { note: "anything, even spaces" },
    });
    const b = await newSession({ labels: { "sdk-test": run, role: "b" } });
    assert.equal(a.info.name, "agent a");
    assert.deepEqual(a.info.labels, { "sdk-test": run, role: "a" });
    assert.deepEqual(a.info.metadata, { note: "anything, even spaces" });
    assert.equal(b.info.name ?? null, null);

    const both = await Session.list({ ...server(), labels: { "sdk-test": run } });
    assert.deepEqual(both.map((s) => s.id).sort(), [a.id, b.id].sort());
    const onlyA = await Session.list({ ...server(), labels: { "sdk-test": run, role: "a" } });
    assert.deepEqual(onlyA.map((s) => s.id), [a.id]);
    const running = await Session.list({ ...server(), labels: { "sdk-test": run }, state: "running" });
    assert.equal(running.length, 2);

    await b.pause();
    const paused = await Session.list({ ...server(), labels: { "sdk-test": run }, state: "paused" });
    assert.deepEqual(paused.map((s) => s.id), [b.id]);

    const updated = await a.update({ name: "renamed", labels: { "sdk-test": run, role: "c" } });
    assert.equal(updated.name, "renamed");
    const onlyC = await Session.list({ ...server(), labels: { "sdk-test": run, role: "c" } });
    assert.deepEqual(onlyC.map((s) => s.id), [a.id]);
  });

  test("bad labels are refused", async () => {
    await assert.rejects(
      Session.create({ ...server(), template: "busybox", labels: { "Not Valid!": "x" } }),
      BadRequestError,
    );
  });
});
