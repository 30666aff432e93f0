// Offline checks of the SDK against docs/openapi.json (no server needed).

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { describe, test } from "node:test";
import { ERROR_CLASSES, ERROR_STATUS, SpaceError, apiError, camelize } from "@space/sdk";

const root = fileURLToPath(new URL("../../", import.meta.url));
const schema = JSON.parse(readFileSync(new URL("../../../../docs/openapi.json", import.meta.url), "utf8"));

describe("docs/openapi.json", () => {
  test("src/generated/api.ts is what the document generates", () => {
    const check = spawnSync(process.execPath, ["scripts/generate-types.mjs", "--check"], { cwd: root, encoding: "utf8" });
    assert.equal(check.status, 0, check.stderr + check.stdout);
  });

  test("every error code of the document has its own error class and status", () => {
    const codes: string[] = schema.components.schemas.ErrorCode.enum;
    assert.ok(codes.length > 20);
    for (const code of codes) {
      assert.ok(code in ERROR_CLASSES, `no error class for ${code}`);
      assert.ok(ERROR_STATUS[code], `no status for ${code}`);
      const error = apiError(code, "message");
      assert.ok(error instanceof SpaceError);
      assert.equal(error.code, code);
      assert.notEqual(error.constructor, SpaceError, `${code} maps to the bare SpaceError`);
    }
  });

  test("an unknown code falls back on the class of its status", () => {
    const error = apiError("brand_new_code", "m", 404);
    assert.equal(error.constructor.name, "NotFoundError");
    assert.equal(apiError("other", "m", 599).constructor, SpaceError);
  });

  test("camelize renames the API's keys but not those of user maps", () => {
    const value = camelize<Record<string, unknown>>({
      memory_mib: 1,
      env: { MY_VAR: "x", lower_case: "y" },
      labels: { "team_a/x": "1" },
      nested: [{ exit_code: 0 }],
    });
    assert.deepEqual(value, {
      memoryMib: 1,
      env: { MY_VAR: "x", lower_case: "y" },
      labels: { "team_a/x": "1" },
      nested: [{ exitCode: 0 }],
    });
  });
});
