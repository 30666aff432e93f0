// Suspended sessions wake on use when created with autoResume (issue 15, branch `keys`).

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { SessionSuspendedError, InvalidStateError } from "@space/sdk";
import { SUITE_TIMEOUT, newSession } from "../helpers.js";

describe("auto-resume", { timeout: SUITE_TIMEOUT }, () => {
  test("a call on a suspended autoResume session resumes it first", async () => {
    const s = await newSession({ autoResume: true });
    assert.equal(s.info.autoResume, true);
    await s.files.write("/root/kept", "kept");
    assert.equal((await s.suspend()).state, "suspended");
    const result = await s.commands.run("cat /root/kept");
    assert.equal(result.stdout, "kept");
    assert.equal((await s.refresh()).state, "running");
    await s.suspend();
    assert.equal(await s.files.read("/root/kept"), "kept", "file calls wake it too");
  });

  test("without autoResume the call fails saying how to resume", async () => {
    const s = await newSession();
    assert.equal(s.info.autoResume, false);
    await s.suspend();
    const error = await s.commands.run("true").catch((e: unknown) => e);
    assert.ok(error instanceof SessionSuspendedError, String(error));
    assert.ok(error instanceof InvalidStateError);
    assert.equal(error.code, "session_suspended");
    assert.equal(error.status, 409);
    assert.match(error.message, /resume/);
    await s.resume();
    assert.equal((await s.commands.run("echo back")).stdout, "back\n");
  });
});
