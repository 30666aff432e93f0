import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";
import { ConnectionClosedError, NotFoundError, Session, SpaceClient } from "@space/sdk";
import { SUITE_TIMEOUT, TEMPLATE, newSession, server, track } from "./helpers.js";

const schema = JSON.parse(readFileSync(new URL("../../../../docs/openapi.json", import.meta.url), "utf8"));

describe("session lifecycle", { timeout: SUITE_TIMEOUT }, () => {
  test("create, show, list, destroy", async () => {
    const s = await newSession({ env: { A: "1", lower_case: "kept" }, cpus: 0.5, memoryMib: 256 });
    assert.match(s.id, /^ses_/);
    assert.equal(s.state, "running");
    assert.equal(s.info.template, TEMPLATE);
    assert.deepEqual(s.info.env, { A: "1", lower_case: "kept" }, "env keys are the user's, never renamed");
    assert.equal(s.info.resources.cpus, 0.5);
    assert.equal(s.info.resources.memoryMib, 256);
    const listed = await Session.list(server());
    assert.ok(listed.some((l) => l.id === s.id && l.state === "running"));
    await s.destroy();
    assert.equal(s.info.state, "destroyed");
    await s.destroy();
    const all = await Session.list({ ...server(), all: true });
    assert.equal(all.find((l) => l.id === s.id)?.state, "destroyed");
    assert.ok(!(await Session.list(server())).some((l) => l.id === s.id));
  });

  test("the server's Session objects have only properties the OpenAPI document declares", async () => {
    const s = await newSession();
    const raw = (await s.client.json("GET", `/v1/sessions/${s.id}`)) as Record<string, unknown>;
    const declared = Object.keys(schema.components.schemas.Session.properties);
    for (const key of Object.keys(raw)) assert.ok(declared.includes(key), `Session.${key} is not in docs/openapi.json`);
    for (const key of schema.components.schemas.Session.required) assert.ok(key in raw, `Session.${key} is missing`);
  });

  test("await using destroys the session at the end of the scope", async () => {
    let id: string;
    {
      await using s = track(await Session.create({ template: TEMPLATE, ...server() }));
      id = s.id;
      assert.equal((await s.commands.run("echo hi")).stdout, "hi\n");
    }
    const after = await Session.connect(id, { ...server(), resume: false });
    assert.equal(after.state, "destroyed");
  });

  test("pause and resume keep processes; connect resumes a paused session", async () => {
    const s = await newSession();
    const counter = await s.commands.run("i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done", {
      background: true,
    });
    assert.equal((await s.pause()).state, "paused");
    assert.equal(s.state, "paused");
    const resumed = await Session.connect(s.id, server());
    assert.equal(resumed.state, "running");
    const listed = await resumed.commands.list();
    assert.equal(listed.find((p) => p.pid === counter.pid)?.running, true, "the background process survived");
    await counter.kill();
    assert.equal((await s.refresh()).state, "running");
    assert.equal((await s.resume()).state, "running", "resume of a running session is a no-op");
  });

  test("suspend frees the sandbox; connect brings it back with its processes", async () => {
    const status = await new SpaceClient(server()).status();
    assert.ok(status.fullSnapshots.available, `suspend needs full snapshots: ${status.fullSnapshots.detail}`);
    const s = await newSession();
    const sleeper = await s.commands.run(["sleep", "600"], { background: true });
    await s.files.write("/tmp/kept.txt", "kept");
    const suspended = await s.suspend();
    // Suspending ends the streams open at that moment (docs/lifecycle.md).
    await assert.rejects(sleeper.wait(), /was suspended/);
    assert.equal(suspended.state, "suspended");
    assert.equal(suspended.sandboxId ?? null, null);
    const back = await Session.connect(s.id, server());
    assert.equal(back.state, "running");
    assert.equal(await back.files.read("/tmp/kept.txt"), "kept");
    const processes = await back.commands.list();
    assert.ok(processes.some((p) => p.pid === sleeper.pid && p.running), JSON.stringify(processes));
  });

  test("update changes the idle timeout; stats and events describe the session", async () => {
    const s = await newSession({ idleTimeoutMs: 3_600_000 });
    assert.equal(s.info.lifetime?.idleTimeoutSecs, 3600);
    const updated = await s.update({ idleTimeoutMs: 1500, maxAgeMs: 7_200_000 });
    assert.equal(updated.lifetime?.idleTimeoutSecs, 2, "rounded up to whole seconds");
    assert.equal(updated.lifetime?.maxAgeSecs, 7200);
    const off = await s.update({ idleTimeoutMs: 0 });
    assert.equal(off.lifetime?.idleTimeoutSecs ?? null, null);
    const stats = await s.stats();
    assert.ok(stats.sandbox && stats.sandbox.memoryLimitBytes > 0);
    const events = await s.events();
    assert.ok(events.some((e) => e.toState === "running"), JSON.stringify(events));
  });

  test("destroy ends the session's open streams", async () => {
    const s = await newSession();
    const sleeper = await s.commands.run(["sleep", "600"], { background: true });
    const watcher = await s.files.watch("/tmp");
    await s.destroy();
    await assert.rejects(sleeper.wait(), ConnectionClosedError);
    await assert.rejects(watcher[Symbol.asyncIterator]().next(), ConnectionClosedError);
  });

  test("connect to a destroyed or unknown session", async () => {
    await assert.rejects(Session.connect("ses_doesnotexist", server()), NotFoundError);
  });
});
