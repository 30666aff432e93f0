// API keys and quotas (issue 15, branch `keys`). Needs the admin key.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { describe, test } from "node:test";
import { KeyRevokedError, QuotaExceededError, Session, SpaceClient } from "@space/sdk";
import { SUITE_TIMEOUT, TEMPLATE, server, track } from "../helpers.js";

describe("keys and quotas", { timeout: SUITE_TIMEOUT }, () => {
  test("a key is created, used, rotated and revoked; a quota refuses the next create", async () => {
    const admin = new SpaceClient(server());
    const tenant = `sdk-ts-${randomUUID().slice(0, 8)}`;
    const created = await admin.keys.create(tenant, { name: "ci", expiresInMs: 3_600_000 });
    assert.equal(created.tenant, tenant);
    assert.equal(created.name, "ci");
    assert.ok(created.key && created.expiresAt);
    const listed = await admin.keys.list();
    const mine = listed.find((k) => k.id === created.id);
    assert.ok(mine, "the new key is listed");
    assert.equal("key" in mine, false, "secrets are never listed");

    const asTenant = { url: server().url, apiKey: created.key };
    await admin.quotas.set(tenant, { maxSessions: 1 });
    const quota = await admin.quotas.get(tenant);
    assert.equal(quota.maxSessions, 1);
    const first = track(await Session.create({ ...asTenant, template: TEMPLATE }));
    const refused = await Session.create({ ...asTenant, template: TEMPLATE }).then(
      (s) => track(s) && assert.fail("a second session over the quota was created"),
      (e: unknown) => e,
    );
    assert.ok(refused instanceof QuotaExceededError, String(refused));
    assert.equal(refused.status, 429);
    await first.destroy();

    const rotated = await admin.keys.rotate(created.id);
    assert.notEqual(rotated.key, created.key);
    await assert.rejects(Session.list(asTenant), KeyRevokedError);
    assert.deepEqual(await Session.list({ url: server().url, apiKey: rotated.key }), []);
    const revoked = await admin.keys.revoke(rotated.id);
    assert.ok(revoked.revokedAt);
    const error = await Session.list({ url: server().url, apiKey: rotated.key }).catch((e: unknown) => e);
    assert.ok(error instanceof KeyRevokedError, String(error));
    assert.equal(error.code, "key_revoked");
  });
});
