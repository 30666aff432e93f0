// `session.files`: read, write (streamed both ways), list, stat, mkdir, move, remove, watch.

import "./polyfill.js";
import type WebSocket from "ws";
import type { components } from "./generated/api.js";
import type { SessionContext } from "./context.js";
import type { Body } from "./wire.js";
import { socketError } from "./client.js";
import { FileNotFoundError, type SpaceError } from "./errors.js";
import { camelize, type FileInfo, type WatchEvent, type WriteInfo } from "./types.js";

type Schemas = components["schemas"];

/** What `files.write` accepts: text, bytes, a Blob, or a stream (web `ReadableStream`, or any
 * async iterable of chunks, such as a Node `Readable` from `fs.createReadStream`), which is
 * uploaded as it is read. */
export type FileData =
  | string
  | Uint8Array
  | ArrayBuffer
  | Blob
  | ReadableStream<Uint8Array>
  | AsyncIterable<Uint8Array | string>;

export interface WriteOptions {
  /** Permission bits of a new file: `0o755` or `"755"` (default 644). */
  mode?: number | string;
}

export interface WriteEntry extends WriteOptions {
  path: string;
  data: FileData;
}

export interface WatchOptions {
  /** Watch subdirectories too. */
  recursive?: boolean;
  /** Called for each event (the watcher is also an async iterable of them). */
  onEvent?: (event: WatchEvent) => void;
  /** Called when the watch ends with an error (the server closed it). */
  onError?: (error: SpaceError) => void;
}

/** Uploads in flight at once for `writeMany`. */
const WRITE_CONCURRENCY = 4;

function toBody(data: FileData): Body {
  if (typeof data === "string" || data instanceof Uint8Array || data instanceof ArrayBuffer || data instanceof Blob) {
    return data;
  }
  if (data instanceof ReadableStream) return data;
  const iterator = data[Symbol.asyncIterator]();
  const encoder = new TextEncoder();
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      const { done, value } = await iterator.next();
      if (done) controller.close();
      else controller.enqueue(typeof value === "string" ? encoder.encode(value) : value);
    },
    async cancel(reason) {
      await iterator.return?.(reason);
    },
  });
}

function octal(mode: number | string | undefined): string | undefined {
  if (mode === undefined) return undefined;
  return typeof mode === "number" ? mode.toString(8) : mode;
}

export class Files {
  readonly #ctx: SessionContext;

  /** @internal */
  constructor(ctx: SessionContext) {
    this.#ctx = ctx;
  }

  /** Reads a file: as text (default), as bytes, or as a web `ReadableStream` for large files
   * (`Readable.fromWeb(stream)` makes it a Node stream). */
  read(path: string, options?: { format?: "text" }): Promise<string>;
  read(path: string, options: { format: "bytes" }): Promise<Uint8Array>;
  read(path: string, options: { format: "stream" }): Promise<ReadableStream<Uint8Array>>;
  async read(
    path: string,
    options: { format?: "text" | "bytes" | "stream" } = {},
  ): Promise<string | Uint8Array | ReadableStream<Uint8Array>> {
    const response = await this.#ctx.client.fetch("GET", this.#ctx.path("/files/content"), { query: { path } });
    switch (options.format ?? "text") {
      case "bytes":
        return new Uint8Array(await response.arrayBuffer());
      case "stream":
        return (response.body as ReadableStream<Uint8Array> | null) ?? new ReadableStream({ start: (c) => c.close() });
      default:
        return response.text();
    }
  }

  /** Writes a file, replacing it if it exists; missing parent directories are created. The
   * upload goes to a temporary file renamed into place, so readers never see half of it. */
  async write(path: string, data: FileData, options: WriteOptions = {}): Promise<WriteInfo> {
    const result = await this.#ctx.client.json<Schemas["WriteResult"]>("PUT", this.#ctx.path("/files/content"), {
      query: { path, mode: octal(options.mode) },
      body: toBody(data),
      headers: { "content-type": "application/octet-stream" },
    });
    return camelize<Schemas["WriteResult"]>(result);
  }

  /** Writes several files, a few at a time; rejects with the first failure (files written
   * before it stay). */
  async writeMany(entries: WriteEntry[]): Promise<WriteInfo[]> {
    const results: WriteInfo[] = new Array(entries.length);
    let next = 0;
    const worker = async () => {
      while (next < entries.length) {
        const index = next++;
        const entry = entries[index] as WriteEntry;
        results[index] = await this.write(entry.path, entry.data, entry);
      }
    };
    await Promise.all(Array.from({ length: Math.min(WRITE_CONCURRENCY, entries.length) }, worker));
    return results;
  }

  /** The entries of a directory. */
  async list(path: string): Promise<FileInfo[]> {
    const list = await this.#ctx.client.json<Schemas["FileList"]>("GET", this.#ctx.path("/files/list"), { query: { path } });
    return camelize<Schemas["FileList"]>(list).entries;
  }

  /** Describes a path (a symlink itself, not what it points to). */
  async stat(path: string): Promise<FileInfo> {
    const info = await this.#ctx.client.json<Schemas["FileInfo"]>("GET", this.#ctx.path("/files/stat"), { query: { path } });
    return camelize<Schemas["FileInfo"]>(info);
  }

  async exists(path: string): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (error) {
      if (error instanceof FileNotFoundError) return false;
      throw error;
    }
  }

  /** Creates a directory and its missing parents (fine if it exists). */
  async mkdir(path: string): Promise<void> {
    const request: Schemas["PathRequest"] = { path };
    await this.#ctx.client.fetch("POST", this.#ctx.path("/files/mkdir"), { json: request });
  }

  /** Moves or renames a path. */
  async move(from: string, to: string): Promise<void> {
    const request: Schemas["MoveRequest"] = { from, to };
    await this.#ctx.client.fetch("POST", this.#ctx.path("/files/move"), { json: request });
  }

  /** Removes a file, or a directory and its contents with `recursive`. */
  async remove(path: string, options: { recursive?: boolean } = {}): Promise<void> {
    await this.#ctx.client.fetch("DELETE", this.#ctx.path("/files"), {
      query: { path, recursive: options.recursive ?? false },
    });
  }

  /** Watches a directory for changes; resolves once the watch is in place, so changes made
   * after it resolves are seen. Stop it with `watcher.stop()`. */
  async watch(path: string, options: WatchOptions = {}): Promise<Watcher> {
    const query = { path, recursive: options.recursive ?? false };
    return this.#ctx.streams.add(
      await this.#ctx.client.socket(this.#ctx.path("/watch"), query, (ws) => new Watcher(ws, options)),
    );
  }
}

/** A running watch: events arrive on `onEvent` and through `for await (const e of watcher)`. */
export class Watcher implements AsyncIterable<WatchEvent>, AsyncDisposable {
  readonly #ws: WebSocket;
  readonly #queue: WatchEvent[] = [];
  readonly #waiting: Array<(result: IteratorResult<WatchEvent>) => void> = [];
  readonly #failures: Array<(error: unknown) => void> = [];
  #ended = false;
  #stopped = false;
  #error: SpaceError | undefined;
  #pinger: NodeJS.Timeout;
  /** Resolves when the watch has ended (stopped, or closed by the server). */
  readonly closed: Promise<void>;

  /** @internal */
  constructor(ws: WebSocket, options: WatchOptions) {
    this.#ws = ws;
    ws.on("error", () => {});
    ws.on("message", (data: Buffer, isBinary: boolean) => {
      if (isBinary) return;
      let message: Record<string, unknown>;
      try {
        message = JSON.parse(data.toString("utf8")) as Record<string, unknown>;
      } catch {
        return;
      }
      if (message.type === "error") {
        this.#error = socketError(message);
        options.onError?.(this.#error);
        return;
      }
      const event: WatchEvent = {
        kind: String(message.kind),
        path: String(message.path),
        isDir: Boolean(message.is_dir),
      };
      options.onEvent?.(event);
      const waiter = this.#waiting.shift();
      this.#failures.shift();
      if (waiter) waiter({ value: event, done: false });
      else this.#queue.push(event);
    });
    this.closed = new Promise((resolve) => {
      ws.on("close", () => {
        clearInterval(this.#pinger);
        this.#ended = true;
        // Ended by the server with an error (the idle timeout): iteration rejects with it.
        // Otherwise (stopped, or the session went away) iteration just ends.
        const error = this.#stopped ? undefined : this.#error;
        const failures = this.#failures.splice(0);
        this.#waiting.splice(0).forEach((waiter, i) => (error ? failures[i]?.(error) : waiter({ value: undefined, done: true })));
        resolve();
      });
    });
    this.#pinger = setInterval(() => ws.readyState === ws.OPEN && ws.ping(), 30_000);
    this.#pinger.unref();
  }

  /** Ends the watch at once; iteration rejects with `error`. */
  abort(error: SpaceError): void {
    this.#error = error;
    this.#ws.terminate();
  }

  /** Ends the watch. */
  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#ws.readyState === this.#ws.OPEN) this.#ws.close();
    await this.closed;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }

  [Symbol.asyncIterator](): AsyncIterator<WatchEvent> {
    return {
      next: () => {
        const event = this.#queue.shift();
        if (event) return Promise.resolve({ value: event, done: false });
        if (this.#ended) {
          return this.#error && !this.#stopped ? Promise.reject(this.#error) : Promise.resolve({ value: undefined, done: true });
        }
        return new Promise((resolve, reject) => {
          this.#waiting.push(resolve);
          this.#failures.push(reject);
        });
      },
      return: async () => {
        await this.stop();
        return { value: undefined, done: true };
      },
    };
  }
}
