import assert from "node:assert/strict";
import { Readable } from "node:stream";
import { describe, test } from "node:test";
import { BadRequestError, type CommandHandle, type Session } from "@space/sdk";
import { SUITE_TIMEOUT, eventually, newSession } from "./helpers.js";

let shared: Session | undefined;
async function session(): Promise<Session> {
  shared ??= await newSession({ env: { FROM_SESSION: "session-value" } });
  return shared;
}

describe("commands.run to completion", { timeout: SUITE_TIMEOUT }, () => {
  test("a shell command line returns its exit code and output", async () => {
    const s = await session();
    const result = await s.commands.run("echo out; echo err >&2; exit 3");
    assert.equal(result.exitCode, 3);
    assert.equal(result.stdout, "out\n");
    assert.equal(result.stderr, "err\n");
    assert.equal(result.signal, null);
    assert.equal(result.timedOut, false);
    assert.ok(result.pid > 0);
  });

  test("an argv runs without a shell, arguments intact", async () => {
    const s = await session();
    const result = await s.commands.run(["printf", "%s|", "a b", "$HOME", "'q'"]);
    assert.equal(result.stdout, "a b|$HOME|'q'|");
  });

  test("cwd, env (over the session's) and user apply", async () => {
    const s = await session();
    const result = await s.commands.run('pwd; echo "$FROM_SESSION $MINE"; id -u; id -g', {
      cwd: "/tmp",
      env: { MINE: "mine" },
      user: 1234,
    });
    assert.equal(result.stdout, "/tmp\nsession-value mine\n1234\n1234\n");
    const root = await s.commands.run("id -u", { user: "root" });
    assert.equal(root.stdout, "0\n");
    const named = await s.commands.run("id -u; id -g", { user: "nobody" });
    const passwd = (await s.files.read("/etc/passwd")).split("\n").find((l) => l.startsWith("nobody:"));
    assert.ok(passwd, "busybox has a nobody user");
    const [, , uid, gid] = passwd.split(":");
    assert.equal(named.stdout, `${uid}\n${gid}\n`);
    await assert.rejects(s.commands.run("true", { user: "no-such-user" }), BadRequestError);
  });

  test("streaming callbacks see output as it comes, in order per stream", async () => {
    const s = await session();
    const out: string[] = [];
    const err: string[] = [];
    const handle = await s.commands.run("for i in 1 2 3; do echo line$i; echo e$i >&2; done", {
      onStdout: (data) => out.push(data),
      onStderr: (data) => err.push(data),
    });
    assert.equal(out.join(""), "line1\nline2\nline3\n");
    assert.equal(err.join(""), "e1\ne2\ne3\n");
    assert.equal(handle.stdout, "line1\nline2\nline3\n");
    assert.equal(handle.exitCode, 0);
  });

  test("a callback is called before the command exits", async () => {
    const s = await session();
    let sawReady = false;
    // The command only finishes once the callback has seen its first line.
    const run = s.commands.run("rm -f /tmp/gate-ok; echo ready; while [ ! -e /tmp/gate-ok ]; do sleep 0.05; done; echo done", {
      onStdout: (data) => {
        if (data.includes("ready") && !sawReady) {
          sawReady = true;
          void s.files.write("/tmp/gate-ok", "");
        }
      },
    });
    const result = await run;
    assert.ok(sawReady);
    assert.equal(result.stdout, "ready\ndone\n");
  });

  test("multi-byte characters split across frames stay whole", async () => {
    const s = await session();
    const text = "ünïcødé ✓ ".repeat(20_000);
    await s.files.write("/tmp/utf8.txt", text);
    let seen = "";
    const result = await s.commands.run("cat /tmp/utf8.txt", { onStdout: (d) => (seen += d) });
    assert.equal(result.stdout, text);
    assert.equal(seen, text);
  });

  test("stdin: a string, bytes and a stream", async () => {
    const s = await session();
    assert.equal((await s.commands.run("cat", { stdin: "from a string" })).stdout, "from a string");
    const bytes = new TextEncoder().encode("from bytes\n");
    assert.equal((await s.commands.run("wc -c", { stdin: bytes })).stdout.trim(), String(bytes.length));
    const chunks = Readable.from(
      (function* () {
        for (let i = 0; i < 1000; i++) yield Buffer.from(`chunk ${i}\n`);
      })(),
    );
    const counted = await s.commands.run("wc -l", { stdin: chunks });
    assert.equal(counted.stdout.trim(), "1000");
  });

  test("a timeout kills the command and says so", async () => {
    const s = await session();
    const result = await s.commands.run("sleep 30", { timeoutMs: 300 });
    assert.equal(result.timedOut, true);
    assert.notEqual(result.exitCode, 0);
    const streamed = await s.commands.run("sleep 30", { timeoutMs: 300, onStdout: () => {} });
    assert.equal(streamed.timedOut, true);
  });

  test("a missing program exits 127 with a message, like a shell", async () => {
    const s = await session();
    const result = await s.commands.run(["no-such-program"]);
    assert.equal(result.exitCode, 127);
    assert.match(result.stderr, /no-such-program/);
  });
});

describe("background commands", { timeout: SUITE_TIMEOUT }, () => {
  test("run returns a handle at once; wait gives the result; callbacks stream", async () => {
    const s = await session();
    const seen: string[] = [];
    const handle = await s.commands.run("echo started; read line; echo got:$line; exit 7", {
      background: true,
      stdin: true,
      onStdout: (d) => seen.push(d),
    });
    assert.ok(handle.pid > 0);
    await eventually(() => handle.stdout.includes("started"), "the first line");
    assert.equal(handle.exitCode, undefined, "still running: it reads stdin");
    await handle.sendStdin("hello\n");
    const result = await handle.wait();
    assert.equal(result.exitCode, 7);
    assert.equal(result.stdout, "started\ngot:hello\n");
    assert.equal(seen.join(""), "started\ngot:hello\n");
    assert.equal(handle.exitCode, 7);
  });

  test("stdin data given at start is fed and closed", async () => {
    const s = await session();
    const handle = await s.commands.run("cat; echo end", { background: true, stdin: "abc\n" });
    const result = await handle.wait();
    assert.equal(result.stdout, "abc\nend\n");
  });

  test("closeStdin ends input", async () => {
    const s = await session();
    const handle = await s.commands.run("cat", { background: true, stdin: true });
    await handle.sendStdin("x");
    await handle.closeStdin();
    assert.equal((await handle.wait()).stdout, "x");
  });

  test("kill stops it; list shows it; kill of an exited process is false", async () => {
    const s = await session();
    const handle = await s.commands.run(["sleep", "600"], { background: true });
    const listed = await s.commands.list();
    const mine = listed.find((p) => p.pid === handle.pid);
    assert.ok(mine, `pid ${handle.pid} in ${JSON.stringify(listed)}`);
    assert.equal(mine.running, true);
    assert.equal(mine.background, true);
    assert.deepEqual(mine.cmd, ["sleep", "600"]);
    assert.equal(await handle.kill(), true);
    const result = await handle.wait();
    assert.equal(result.signal, 9);
    assert.equal(result.exitCode, null);
    assert.equal(await s.commands.kill(999_999), false);
  });

  test("it keeps running when disconnected, and connect(pid) follows it again", async () => {
    const s = await session();
    const first: CommandHandle = await s.commands.run(
      "echo one; while [ ! -e /tmp/bg-go ]; do sleep 0.05; done; echo two",
      { background: true },
    );
    await eventually(() => first.stdout.includes("one"), "the first line");
    first.disconnect();
    await s.files.write("/tmp/bg-go", "");
    let live = "";
    const again = await s.commands.connect(first.pid, { onStdout: (d) => (live += d) });
    const result = await again.wait();
    assert.equal(result.exitCode, 0);
    assert.equal(result.stdout, "one\ntwo\n", "buffered output comes first");
    assert.equal(live, "one\ntwo\n");
  });

  test("a program that cannot start exits 127", async () => {
    const s = await session();
    const handle = await s.commands.run(["/no/such/program"], { background: true });
    const result = await handle.wait();
    assert.equal(result.exitCode, 127);
  });
});
