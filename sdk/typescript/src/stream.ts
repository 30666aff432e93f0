// The exec and attach WebSockets (`GET …/exec/ws`, `GET …/processes/{pid}/attach`):
// server binary frames are a channel byte (1 stdout, 2 stderr) and bytes; server text frames
// are `started`, `exit` and `error`; client binary frames are stdin, client text frames
// `eof`, `signal` and `resize`.

import type WebSocket from "ws";
import { ConnectionClosedError, type SpaceError } from "./errors.js";
import { socketError } from "./client.js";

const CHANNEL_STDOUT = 1;
const CHANNEL_STDERR = 2;
/** Pings keep a quiet socket from the server's idle timeout (5 minutes by default). */
const PING_EVERY_MS = 30_000;

export interface ExitInfo {
  exitCode: number | null;
  signal: number | null;
  timedOut: boolean;
  oomKilled: boolean;
}

export interface StreamHandlers {
  onStdout?: (data: Uint8Array) => void;
  onStderr?: (data: Uint8Array) => void;
}

/** Data a caller may feed to stdin or to a file. */
export type BinaryInput = string | Uint8Array | ArrayBuffer;

export function toBytes(data: BinaryInput): Uint8Array {
  if (typeof data === "string") return new TextEncoder().encode(data);
  if (data instanceof Uint8Array) return data;
  return new Uint8Array(data);
}

/** Largest stdin frame sent. */
const FRAME_MAX = 1 << 20;

function concat(chunks: Uint8Array[], size: number): Uint8Array {
  const out = new Uint8Array(size);
  let at = 0;
  for (const chunk of chunks) {
    out.set(chunk, at);
    at += chunk.length;
  }
  return out;
}

/** Resolves after the I/O callbacks already due: a source that has data at hand yields it
 * before this. */
function nextTurn(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/** One exec or attach conversation over an open WebSocket. */
export class ProcessStream {
  readonly #ws: WebSocket;
  readonly #handlers: StreamHandlers;
  readonly started: Promise<number>;
  readonly exited: Promise<ExitInfo>;
  #pinger: NodeJS.Timeout;
  #error: SpaceError | undefined;
  #exit: ExitInfo | undefined;
  #resolveStarted!: (pid: number) => void;
  #rejectStarted!: (error: unknown) => void;

  constructor(ws: WebSocket, handlers: StreamHandlers, what: string) {
    this.#ws = ws;
    this.#handlers = handlers;
    this.started = new Promise((resolve, reject) => {
      this.#resolveStarted = resolve;
      this.#rejectStarted = reject;
    });
    this.exited = new Promise((resolve, reject) => {
      ws.on("message", (data: Buffer, isBinary: boolean) => {
        if (isBinary) return this.#output(data);
        this.#control(data.toString("utf8"));
      });
      ws.on("error", () => {});
      ws.on("close", () => {
        clearInterval(this.#pinger);
        if (this.#exit) return resolve(this.#exit);
        const error =
          this.#error ??
          new ConnectionClosedError(`${what}: the connection closed before the command exited`, {
            code: "connection_closed",
            status: 0,
          });
        this.#rejectStarted(error);
        reject(error);
      });
    });
    // Nobody may be waiting on these yet; their failure is reported where they are awaited.
    this.started.catch(() => {});
    this.exited.catch(() => {});
    this.#pinger = setInterval(() => ws.readyState === ws.OPEN && ws.ping(), PING_EVERY_MS);
    this.#pinger.unref();
  }

  #output(frame: Buffer): void {
    const bytes = new Uint8Array(frame.buffer, frame.byteOffset + 1, frame.byteLength - 1);
    if (frame[0] === CHANNEL_STDOUT) this.#handlers.onStdout?.(bytes);
    else if (frame[0] === CHANNEL_STDERR) this.#handlers.onStderr?.(bytes);
  }

  #control(text: string): void {
    let message: { type?: string; pid?: number; exit_code?: number | null; signal?: number | null };
    try {
      message = JSON.parse(text);
    } catch {
      return;
    }
    switch (message.type) {
      case "started":
        this.#resolveStarted(message.pid ?? 0);
        break;
      case "exit": {
        const m = message as { exit_code?: number | null; signal?: number | null; timed_out?: boolean; oom_killed?: boolean };
        this.#exit = {
          exitCode: m.exit_code ?? null,
          signal: m.signal ?? null,
          timedOut: m.timed_out ?? false,
          oomKilled: m.oom_killed ?? false,
        };
        break;
      }
      case "error":
        // Kept for the close that follows (an error that ends the stream: a refused start,
        // the idle timeout, the sandbox gone).
        this.#error = socketError(message as { code?: unknown; message?: unknown });
        break;
    }
  }

  /** Whether stdin data can still be sent. */
  get open(): boolean {
    return this.#ws.readyState === this.#ws.OPEN;
  }

  #send(data: Uint8Array | string): Promise<void> {
    if (!this.open) {
      return Promise.reject(
        new ConnectionClosedError("the command's connection is closed", { code: "connection_closed", status: 0 }),
      );
    }
    return new Promise((resolve, reject) => this.#ws.send(data, (error) => (error ? reject(error) : resolve())));
  }

  /** Writes to stdin; resolves once the bytes are handed to the socket (backpressure). */
  sendStdin(data: BinaryInput): Promise<void> {
    return this.#send(toBytes(data));
  }

  /** Copies a stream to stdin, then closes stdin. Chunks that arrive together go in one
   * frame (up to 1 MiB): the server queues a bounded number of frames per command, and
   * stalls while that queue is full and the command prints nothing, so a burst of tiny
   * chunks must not become a burst of tiny frames. */
  async pipeStdin(source: AsyncIterable<Uint8Array | string>): Promise<void> {
    const iterator = source[Symbol.asyncIterator]();
    let pending: Uint8Array[] = [];
    let size = 0;
    const flush = async () => {
      if (size === 0) return;
      const frame = pending.length === 1 ? (pending[0] as Uint8Array) : concat(pending, size);
      pending = [];
      size = 0;
      await this.sendStdin(frame);
    };
    // A failure of the source is seen where `next` is awaited (a rejection nobody awaits
    // yet must not count as unhandled meanwhile).
    const advance = () => {
      const promise = iterator.next();
      promise.catch(() => {});
      return promise;
    };
    let next = advance();
    for (;;) {
      // What is ready now joins the frame; once the source makes us wait, the frame goes.
      const ready = await Promise.race([next, nextTurn().then(() => undefined)]);
      if (ready === undefined) {
        await flush();
        continue;
      }
      if (ready.done) break;
      next = advance();
      const bytes = toBytes(ready.value);
      for (let at = 0; at < bytes.length; at += FRAME_MAX) {
        const piece = bytes.subarray(at, at + FRAME_MAX);
        if (size + piece.length > FRAME_MAX) await flush();
        pending.push(piece);
        size += piece.length;
      }
    }
    await flush();
    await this.closeStdin();
  }

  closeStdin(): Promise<void> {
    return this.#send(JSON.stringify({ type: "eof" }));
  }

  signal(signal: number): Promise<void> {
    return this.#send(JSON.stringify({ type: "signal", signal }));
  }

  resize(rows: number, cols: number): Promise<void> {
    return this.#send(JSON.stringify({ type: "resize", rows, cols }));
  }

  /** Ends the stream at once: `exited` rejects with `error` (unless the exit was seen). For
   * streams the server has ended without telling (see `SessionContext.streams`). */
  abort(error: SpaceError): void {
    clearInterval(this.#pinger);
    this.#error = error;
    this.#ws.terminate();
  }

  /** Settles when the socket has closed. */
  get closed(): Promise<unknown> {
    return this.exited.catch(() => {});
  }

  /** Closes the socket. For an exec that kills the command; for an attach it only detaches. */
  close(): void {
    clearInterval(this.#pinger);
    if (this.#ws.readyState === this.#ws.OPEN || this.#ws.readyState === this.#ws.CONNECTING) this.#ws.close();
  }
}
