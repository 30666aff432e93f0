import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { Readable } from "node:stream";
import { describe, test } from "node:test";
import {
  DirectoryNotEmptyError,
  FileNotFoundError,
  IsADirectoryError,
  type Session,
  type WatchEvent,
} from "@space/sdk";
import { SUITE_TIMEOUT, newSession } from "./helpers.js";

let shared: Session | undefined;
async function session(): Promise<Session> {
  shared ??= await newSession();
  return shared;
}

/** `size` bytes of a deterministic pseudo-random sequence, in 1 MiB chunks, never all held. */
function* noise(size: number, seed = 1): Generator<Uint8Array> {
  let state = seed >>> 0;
  for (let left = size; left > 0; ) {
    const chunk = new Uint8Array(Math.min(left, 1 << 20));
    const words = new Uint32Array(chunk.buffer, 0, chunk.length >>> 2);
    for (let i = 0; i < words.length; i++) {
      state ^= state << 13;
      state ^= state >>> 17;
      state ^= state << 5;
      words[i] = state >>> 0;
    }
    left -= chunk.length;
    yield chunk;
  }
}

function sha256Of(chunks: Iterable<Uint8Array>): string {
  const hash = createHash("sha256");
  for (const chunk of chunks) hash.update(chunk);
  return hash.digest("hex");
}

describe("files, small", { timeout: SUITE_TIMEOUT }, () => {
  test("text and bytes round-trip; write reports the size", async () => {
    const s = await session();
    const info = await s.files.write("/tmp/small/hello.txt", "héllo\n");
    assert.deepEqual(info, { path: "/tmp/small/hello.txt", bytes: 7 });
    assert.equal(await s.files.read("/tmp/small/hello.txt"), "héllo\n");
    const every = new Uint8Array(256).map((_, i) => i);
    await s.files.write("/tmp/small/bytes.bin", every);
    assert.deepEqual(await s.files.read("/tmp/small/bytes.bin", { format: "bytes" }), every);
    await s.files.write("/tmp/small/blob.txt", new Blob(["from a blob"]));
    assert.equal(await s.files.read("/tmp/small/blob.txt"), "from a blob");
    await s.files.write("/tmp/small/empty", "");
    assert.equal(await s.files.read("/tmp/small/empty"), "");
  });

  test("a file written in the sandbox is read back, and one written by the SDK is seen there", async () => {
    const s = await session();
    await s.commands.run("printf from-sandbox > /tmp/from-sandbox");
    assert.equal(await s.files.read("/tmp/from-sandbox"), "from-sandbox");
    await s.files.write("/tmp/from-sdk", "from-sdk");
    assert.equal((await s.commands.run("cat /tmp/from-sdk")).stdout, "from-sdk");
  });

  test("mode sets permission bits", async () => {
    const s = await session();
    await s.files.write("/tmp/run.sh", "#!/bin/sh\necho ran\n", { mode: 0o755 });
    assert.equal((await s.files.stat("/tmp/run.sh")).mode & 0o777, 0o755);
    assert.equal((await s.commands.run("/tmp/run.sh")).stdout, "ran\n");
    await s.files.write("/tmp/private", "x", { mode: "600" });
    assert.equal((await s.files.stat("/tmp/private")).mode & 0o777, 0o600);
  });

  test("list, stat, exists, mkdir, move, remove", async () => {
    const s = await session();
    await s.files.mkdir("/tmp/tree/a/b");
    await s.files.mkdir("/tmp/tree/a/b");
    await s.files.write("/tmp/tree/a/file.txt", "12345");
    const entries = await s.files.list("/tmp/tree/a");
    assert.deepEqual(entries.map((e) => [e.name, e.type]).sort(), [["b", "dir"], ["file.txt", "file"]]);
    const stat = await s.files.stat("/tmp/tree/a/file.txt");
    assert.equal(stat.size, 5);
    assert.equal(stat.type, "file");
    assert.equal(stat.path, "/tmp/tree/a/file.txt");
    assert.ok(stat.modifiedMs > 0);
    assert.equal(await s.files.exists("/tmp/tree/a/file.txt"), true);
    assert.equal(await s.files.exists("/tmp/tree/nope"), false);
    await s.files.move("/tmp/tree/a/file.txt", "/tmp/tree/moved.txt");
    assert.equal(await s.files.exists("/tmp/tree/a/file.txt"), false);
    assert.equal(await s.files.read("/tmp/tree/moved.txt"), "12345");
    await assert.rejects(s.files.remove("/tmp/tree/a"), DirectoryNotEmptyError);
    await s.files.remove("/tmp/tree/moved.txt");
    await s.files.remove("/tmp/tree", { recursive: true });
    assert.equal(await s.files.exists("/tmp/tree"), false);
  });

  test("missing paths and directories fail with typed errors", async () => {
    const s = await session();
    const missing = await s.files.read("/tmp/does/not/exist").catch((e: unknown) => e);
    assert.ok(missing instanceof FileNotFoundError, String(missing));
    assert.equal(missing.code, "file_not_found");
    assert.equal(missing.status, 404);
    await assert.rejects(s.files.stat("/nope"), FileNotFoundError);
    await assert.rejects(s.files.read("/tmp"), IsADirectoryError);
  });

  test("writeMany writes every file", async () => {
    const s = await session();
    const entries = Array.from({ length: 10 }, (_, i) => ({ path: `/tmp/many/f${i}.txt`, data: `file ${i}` }));
    const written = await s.files.writeMany([...entries, { path: "/tmp/many/x.sh", data: "echo x", mode: 0o700 }]);
    assert.equal(written.length, 11);
    assert.deepEqual(written[3], { path: "/tmp/many/f3.txt", bytes: 6 });
    const listing = (await s.files.list("/tmp/many")).map((e) => e.name).sort();
    assert.deepEqual(listing, [...entries.map((_, i) => `f${i}.txt`), "x.sh"].sort());
    assert.equal((await s.commands.run("cat /tmp/many/f7.txt")).stdout, "file 7");
    assert.equal((await s.files.stat("/tmp/many/x.sh")).mode & 0o777, 0o700);
  });
});

describe("files, large and streamed", { timeout: SUITE_TIMEOUT }, () => {
  const SIZE = 64 << 20;

  test("64 MiB streamed up from a web stream and down as one", async () => {
    const s = await session();
    const expected = sha256Of(noise(SIZE));
    const source = noise(SIZE);
    const upload = new ReadableStream<Uint8Array>({
      pull(controller) {
        const next = source.next();
        if (next.done) controller.close();
        else controller.enqueue(next.value);
      },
    });
    const info = await s.files.write("/tmp/large.bin", upload);
    assert.equal(info.bytes, SIZE);
    const inSandbox = await s.commands.run("sha256sum /tmp/large.bin");
    assert.equal(inSandbox.stdout.split(" ")[0], expected);

    const download = await s.files.read("/tmp/large.bin", { format: "stream" });
    const hash = createHash("sha256");
    let size = 0;
    for await (const chunk of download) {
      hash.update(chunk);
      size += chunk.length;
    }
    assert.equal(size, SIZE);
    assert.equal(hash.digest("hex"), expected);
  });

  test("a Node Readable uploads, and a download converts to one", async () => {
    const s = await session();
    const size = 8 << 20;
    const expected = sha256Of(noise(size, 7));
    const info = await s.files.write("/tmp/node.bin", Readable.from(noise(size, 7)));
    assert.equal(info.bytes, size);
    const stream = Readable.fromWeb((await s.files.read("/tmp/node.bin", { format: "stream" })) as never);
    const hash = createHash("sha256");
    for await (const chunk of stream) hash.update(chunk as Buffer);
    assert.equal(hash.digest("hex"), expected);
  });
});

describe("files.watch", { timeout: SUITE_TIMEOUT }, () => {
  test("sees files created, changed and removed after it resolves", async () => {
    const s = await session();
    await s.files.mkdir("/tmp/watched/sub");
    const seen: WatchEvent[] = [];
    const watcher = await s.files.watch("/tmp/watched", { recursive: true, onEvent: (e) => seen.push(e) });
    try {
      await s.commands.run("echo 1 > /tmp/watched/new.txt; echo 2 >> /tmp/watched/new.txt; echo 3 > /tmp/watched/sub/deep; rm /tmp/watched/new.txt");
      const events: WatchEvent[] = [];
      for await (const event of watcher) {
        events.push(event);
        if (event.kind === "remove" && event.path.endsWith("new.txt")) break;
      }
      const kinds = (path: string) => events.filter((e) => e.path.endsWith(path)).map((e) => e.kind);
      assert.ok(kinds("new.txt").includes("create"), JSON.stringify(events));
      assert.ok(kinds("new.txt").includes("modify"), JSON.stringify(events));
      assert.ok(kinds("sub/deep").includes("create"), `recursive: ${JSON.stringify(events)}`);
      assert.equal(events.every((e) => e.isDir === false), true);
      assert.deepEqual(seen.slice(0, events.length), events, "onEvent saw the same events");
    } finally {
      await watcher.stop();
    }
    await watcher.closed;
  });

  test("a watch of a missing directory fails with a typed error", async () => {
    const s = await session();
    await assert.rejects(s.files.watch("/tmp/not-there"), FileNotFoundError);
  });
});
