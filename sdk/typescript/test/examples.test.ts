import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { test } from "node:test";
import { server } from "./helpers.js";

test("examples/quickstart runs to the end", () => {
  server();
  const script = fileURLToPath(new URL("../examples/quickstart.js", import.meta.url));
  const run = spawnSync(process.execPath, [script], { encoding: "utf8", env: process.env, timeout: 300_000 });
  assert.equal(run.status, 0, `${run.stdout}\n${run.stderr}`);
  assert.match(run.stdout, /exit 0: hello from /);
  assert.match(run.stdout, /typed error: file_not_found \(404\)/);
  assert.match(run.stdout, /background pid \d+: hi agent/);
  assert.match(run.stdout, /count.txt exists again: true/);
  assert.match(run.stdout, /fork 1 sees \d+ links/);
});
