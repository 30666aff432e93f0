import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { SnapshotNotFoundError } from "@space/sdk";
import { SUITE_TIMEOUT, eventually, newSession, track } from "./helpers.js";

describe("snapshots, restore, fork", { timeout: SUITE_TIMEOUT }, () => {
  test("a named disk snapshot is listed; restore brings its files back", async () => {
    const s = await newSession();
    await s.files.write("/root/state.txt", "v1");
    const snap = await s.snapshot({ name: "before-change" });
    assert.match(snap.id, /^snap_/);
    assert.equal(snap.kind, "disk");
    assert.equal(snap.name, "before-change");
    assert.equal(snap.sessionId, s.id);
    await s.files.write("/root/state.txt", "v2");
    await s.files.write("/root/later.txt", "later");
    assert.ok((await s.snapshots()).some((x) => x.id === snap.id && x.name === "before-change"));

    const restored = await s.restore(snap);
    assert.equal(restored.state, "running");
    assert.equal(await s.files.read("/root/state.txt"), "v1");
    assert.equal(await s.files.exists("/root/later.txt"), false);

    await s.deleteSnapshot(snap.id);
    assert.ok(!(await s.snapshots()).some((x) => x.id === snap.id));
    await assert.rejects(s.restore(snap), SnapshotNotFoundError);
  });

  test("a full snapshot restores running processes", async () => {
    const s = await newSession();
    const sleeper = await s.commands.run(["sleep", "600"], { background: true });
    const snap = await s.snapshot({ kind: "full" });
    assert.equal(snap.kind, "full");
    assert.equal(await s.commands.kill(sleeper.pid), true);
    assert.equal((await sleeper.wait()).signal, 9);
    await s.restore(snap);
    const processes = await s.commands.list();
    assert.ok(processes.some((p) => p.pid === sleeper.pid && p.running), JSON.stringify(processes));
  });

  test("a background handle follows its command across a full snapshot, output seen once", async () => {
    const s = await newSession();
    let seen = "";
    const command = await s.commands.run("echo before; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo after", {
      background: true,
      onStdout: (d) => (seen += d),
    });
    await eventually(() => command.stdout.includes("before"), "the first line");
    // A full snapshot cuts the session's streams (docs/lifecycle.md); the process goes on.
    await s.snapshot({ kind: "full" });
    await s.files.write("/tmp/go", "");
    const result = await command.wait();
    assert.equal(result.stdout, "before\nafter\n");
    assert.equal(seen, "before\nafter\n");
    assert.equal(result.truncated, false);
    assert.equal(result.exitCode, 0);
  });

  test("fork makes independent copies", async () => {
    const s = await newSession({ env: { ORIGIN: "parent" } });
    await s.files.write("/root/shared.txt", "from parent");
    const running = await s.commands.run(["sleep", "600"], { background: true });
    const forks = track(await s.fork(2));
    assert.equal(await running.kill(), true);
    assert.equal((await running.wait()).signal, 9, "the parent's handle follows its command across the fork");
    assert.equal(forks.length, 2);
    for (const fork of forks) {
      assert.notEqual(fork.id, s.id);
      assert.equal(fork.state, "running");
      assert.equal(await fork.files.read("/root/shared.txt"), "from parent");
      assert.equal((await fork.commands.run("echo $ORIGIN")).stdout, "parent\n");
    }
    const [a, b] = forks as [(typeof forks)[0], (typeof forks)[0]];
    await a.files.write("/root/shared.txt", "changed in a");
    assert.equal(await b.files.read("/root/shared.txt"), "from parent");
    assert.equal(await s.files.read("/root/shared.txt"), "from parent");

    const snap = await s.snapshot({ name: "fork-source" });
    await s.files.write("/root/shared.txt", "after the snapshot");
    const [fromSnap] = track(await s.fork({ from: snap }));
    assert.equal(await fromSnap?.files.read("/root/shared.txt"), "from parent");
  });
});
