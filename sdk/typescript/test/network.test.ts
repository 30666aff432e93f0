import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { BadRequestError, CommandExitError } from "@space/sdk";
import { SUITE_TIMEOUT, newSession } from "./helpers.js";

describe("network policy", { timeout: SUITE_TIMEOUT }, () => {
  test("allow at create, update, audit", async () => {
    const s = await newSession({ allow: ["example.com"], network: { allow: ["*.example.org"], ports: [443] } });
    const network = await s.network.get();
    assert.deepEqual([...(network.policy.allow ?? [])].sort(), ["*.example.org", "example.com"]);
    assert.deepEqual(network.policy.ports, [443]);
    const updated = await s.network.update({ allow: ["api.example.net"], deny: ["example.com"], ports: [80, 443] });
    assert.ok((updated.policy.allow ?? []).includes("api.example.net"));
    assert.ok(!(updated.policy.allow ?? []).includes("example.com"));
    assert.ok((updated.policy.deny ?? []).includes("example.com"));
    assert.deepEqual(updated.policy.ports, [80, 443]);
    await assert.rejects(s.network.update({ allow: ["not a host!"] }), BadRequestError);
    assert.ok(Array.isArray(await s.network.audit({ limit: 10 })));
  });
});

describe("check", { timeout: SUITE_TIMEOUT }, () => {
  test("check: true throws CommandExitError carrying the result", async () => {
    const s = await newSession();
    const error = await s.commands.run("echo partial; echo broke >&2; exit 4", { check: true }).catch((e: unknown) => e);
    assert.ok(error instanceof CommandExitError, String(error));
    assert.equal(error.result.exitCode, 4);
    assert.equal(error.result.stdout, "partial\n");
    assert.match(error.message, /exited with code 4: broke/);
    assert.equal((await s.commands.run("true", { check: true })).exitCode, 0);
    const handle = await s.commands.run("exit 2", { background: true });
    await assert.rejects(handle.wait({ check: true }), CommandExitError);
    assert.equal((await handle.wait()).exitCode, 2);
  });
});
