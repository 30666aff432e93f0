// `session.pty`: interactive terminals. A PTY lives as long as its connection: `kill()` or
// closing it ends the shell, as closing a terminal window does.

import "./polyfill.js";
import type WebSocket from "ws";
import type { ExecStart } from "./wire.js";
import type { SessionContext, User } from "./context.js";
import { argv } from "./commands.js";
import { signalNumber, type Signal } from "./signals.js";
import { ProcessStream, type BinaryInput, type ExitInfo } from "./stream.js";

export interface PtySize {
  rows: number;
  cols: number;
}

export interface PtyOptions extends Partial<PtySize> {
  /** Called with the terminal's output, as raw bytes (escape sequences included). */
  onData: (data: Uint8Array) => void;
  /** The program (default: an interactive `/bin/sh`). */
  cmd?: string | string[];
  cwd?: string;
  env?: Record<string, string>;
  user?: User;
  timeoutMs?: number;
}

export class PtyHandle implements AsyncDisposable {
  readonly pid: number;
  readonly #stream: ProcessStream;

  /** @internal */
  constructor(pid: number, stream: ProcessStream) {
    this.pid = pid;
    this.#stream = stream;
  }

  /** Types into the terminal. */
  sendInput(data: BinaryInput): Promise<void> {
    return this.#stream.sendStdin(data);
  }

  resize(size: PtySize): Promise<void> {
    return this.#stream.resize(size.rows, size.cols);
  }

  /** Sends a signal to the terminal's program (default SIGKILL), which ends it. */
  kill(signal: Signal = "SIGKILL"): Promise<void> {
    return this.#stream.signal(signalNumber(signal));
  }

  /** Resolves when the program exits. */
  wait(): Promise<ExitInfo> {
    return this.#stream.exited;
  }

  /** Closes the terminal (its program is killed). */
  close(): void {
    this.#stream.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
    await this.#stream.exited.catch(() => {});
  }
}

export class Pty {
  readonly #ctx: SessionContext;

  /** @internal */
  constructor(ctx: SessionContext) {
    this.#ctx = ctx;
  }

  /** Starts a program (default `/bin/sh -i`) on a new pseudo-terminal of `rows` × `cols`
   * (default 24 × 80). */
  async create(options: PtyOptions): Promise<PtyHandle> {
    const start: ExecStart = {
      cmd: options.cmd === undefined ? ["/bin/sh", "-i"] : argv(options.cmd),
      env: options.env ?? {},
      cwd: options.cwd ?? null,
      ...(await this.#ctx.credentials(options.user)),
      timeout_ms: options.timeoutMs ?? null,
      tty: { rows: options.rows ?? 24, cols: options.cols ?? 80 },
      stdin: true,
    };
    let ws!: WebSocket;
    const handlers = { onStdout: options.onData, onStderr: options.onData };
    const stream = await this.#ctx.client.socket(this.#ctx.path("/exec/ws"), undefined, (socket) => {
      ws = socket;
      return new ProcessStream(socket, handlers, "terminal");
    });
    this.#ctx.streams.add(stream);
    try {
      ws.send(JSON.stringify(start));
      return new PtyHandle(await stream.started, stream);
    } catch (error) {
      stream.close();
      throw error;
    }
  }
}
