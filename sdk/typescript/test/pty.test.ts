import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { SUITE_TIMEOUT, newSession } from "./helpers.js";

describe("pty", { timeout: SUITE_TIMEOUT }, () => {
  test("a shell on a terminal: input, output, resize, kill", async () => {
    const s = await newSession();
    let output = "";
    const decoder = new TextDecoder();
    const waitFor = async (pattern: RegExp) => {
      for (let i = 0; i < 400 && !pattern.test(output); i++) await new Promise((r) => setTimeout(r, 25));
      assert.match(output, pattern);
    };
    await using terminal = await s.pty.create({ rows: 30, cols: 100, onData: (d) => (output += decoder.decode(d, { stream: true })) });
    assert.ok(terminal.pid > 0);
    await terminal.sendInput("tty; stty size\n");
    await waitFor(/\/dev\/pts\/\d+/);
    await waitFor(/30 100/);
    await terminal.resize({ rows: 40, cols: 120 });
    await terminal.sendInput("stty size\n");
    await waitFor(/40 120/);
    await terminal.sendInput("echo $((6*7))\n");
    await waitFor(/\r\n42\r\n/);
    await terminal.kill();
    const exit = await terminal.wait();
    assert.equal(exit.signal, 9);
  });

  test("the terminal's program exits on its own", async () => {
    const s = await newSession();
    let output = "";
    const terminal = await s.pty.create({ cmd: "echo on-a-tty; [ -t 0 ] && exit 5", onData: (d) => (output += Buffer.from(d).toString()) });
    const exit = await terminal.wait();
    assert.equal(exit.exitCode, 5);
    assert.match(output, /on-a-tty\r\n/);
  });
});
