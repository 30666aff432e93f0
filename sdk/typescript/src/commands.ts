// `session.commands`: run commands to completion or in the background, list and re-attach.

import "./polyfill.js";
import type WebSocket from "ws";
import type { components } from "./generated/api.js";
import type { SessionContext, User } from "./context.js";
import { CommandExitError, NoSuchProcessError, SandboxUnavailableError, StreamInterruptedError } from "./errors.js";
import { signalNumber, type Signal } from "./signals.js";
import { ProcessStream, type BinaryInput, type ExitInfo } from "./stream.js";
import { camelize, type CommandResult, type ProcessInfo } from "./types.js";
import type { ExecStart } from "./wire.js";

type ExecRequest = components["schemas"]["ExecRequest"];
type ExecResult = components["schemas"]["ExecResult"];

/** What a command reads on stdin: data (then end of input), or a stream of it. With
 * `background: true`, `true` keeps stdin open for `handle.sendStdin()`. */
export type StdinInput = BinaryInput | AsyncIterable<Uint8Array | string> | ReadableStream<Uint8Array>;

export interface RunOptions {
  /** Working directory (default `/`). */
  cwd?: string;
  /** Variables on top of the session's `env`. */
  env?: Record<string, string>;
  user?: User;
  /** Kill the command after this many milliseconds (`timedOut` is then set). */
  timeoutMs?: number;
  /** Called with output as it arrives (decoded as UTF-8). */
  onStdout?: (data: string) => void;
  onStderr?: (data: string) => void;
  stdin?: StdinInput;
  /** Throw `CommandExitError` unless the command exits 0 (default: the result says how it
   * ended, as `subprocess.run` does). */
  check?: boolean;
}

export interface BackgroundRunOptions extends Omit<RunOptions, "stdin" | "check"> {
  background: true;
  stdin?: StdinInput | true;
}

export interface ConnectOptions {
  onStdout?: (data: string) => void;
  onStderr?: (data: string) => void;
}

/** Output kept per stream for the result; callbacks see everything. */
const RESULT_CAP = 16 << 20;
/** Output `spaced` keeps per stream of a background process, replayed by an attach. */
const REPLAY_BYTES = 1 << 20;
/** Re-attaches of one handle after streams ended under it. */
const MAX_REATTACH = 8;
/** The first pause before attaching again to an agent out of reach; each next one is longer. */
const REATTACH_PAUSE_MS = 250;

/** Collects a command's output, decoded incrementally (a character split between two
 * frames stays whole). */
export class Output {
  stdout = "";
  stderr = "";
  truncated = false;
  readonly #decoders = { stdout: new TextDecoder(), stderr: new TextDecoder() };
  /** Raw bytes taken per stream, and bytes of a replay still to drop. */
  readonly #received = { stdout: 0, stderr: 0 };
  readonly #skip = { stdout: 0, stderr: 0 };

  constructor(private readonly options: ConnectOptions) {}

  readonly handlers = {
    onStdout: (bytes: Uint8Array) => this.#take("stdout", bytes),
    onStderr: (bytes: Uint8Array) => this.#take("stderr", bytes),
  };

  /** A new attach is about to replay the process's buffered output (the last MiB of each
   * stream): what was already taken is dropped from it, so nothing is seen twice. Beyond a
   * MiB the replay cannot be lined up with what came before: `truncated` says so. */
  replayFollows(): void {
    for (const channel of ["stdout", "stderr"] as const) {
      this.#skip[channel] = Math.min(this.#received[channel], REPLAY_BYTES);
      if (this.#received[channel] > REPLAY_BYTES) this.truncated = true;
    }
  }

  #take(channel: "stdout" | "stderr", bytes: Uint8Array): void {
    const dropped = Math.min(this.#skip[channel], bytes.length);
    this.#skip[channel] -= dropped;
    const fresh = dropped ? bytes.subarray(dropped) : bytes;
    if (fresh.length === 0) return;
    this.#received[channel] += fresh.length;
    const text = this.#decoders[channel].decode(fresh, { stream: true });
    if (!text) return;
    if (this[channel].length + text.length <= RESULT_CAP) this[channel] += text;
    else this.truncated = true;
    (channel === "stdout" ? this.options.onStdout : this.options.onStderr)?.(text);
  }

  result(pid: number, exit: ExitInfo): CommandResult {
    for (const channel of ["stdout", "stderr"] as const) {
      const rest = this.#decoders[channel].decode();
      if (rest) this[channel] += rest;
    }
    return { pid, ...exit, stdout: this.stdout, stderr: this.stderr, truncated: this.truncated };
  }
}

/** The argv of `cmd`: a string runs through `sh -c` (pipes, redirections, `&&`), an array as is. */
export function argv(cmd: string | string[]): string[] {
  return typeof cmd === "string" ? ["/bin/sh", "-c", cmd] : cmd;
}

function isStream(input: unknown): input is AsyncIterable<Uint8Array | string> | ReadableStream<Uint8Array> {
  return typeof input === "object" && input !== null && (Symbol.asyncIterator in input || input instanceof ReadableStream);
}

function iterate(input: AsyncIterable<Uint8Array | string> | ReadableStream<Uint8Array>): AsyncIterable<Uint8Array | string> {
  if (Symbol.asyncIterator in input) return input as AsyncIterable<Uint8Array | string>;
  const reader = (input as ReadableStream<Uint8Array>).getReader();
  return {
    async *[Symbol.asyncIterator]() {
      try {
        for (;;) {
          const { done, value } = await reader.read();
          if (done) return;
          yield value;
        }
      } finally {
        reader.releaseLock();
      }
    },
  };
}

/** Feeds `stdin` to a started process and closes its stdin; a failure because the process
 * already exited (and the socket closed) is not the caller's problem. */
async function feed(stream: ProcessStream, stdin: StdinInput): Promise<void> {
  try {
    if (isStream(stdin)) await stream.pipeStdin(iterate(stdin));
    else {
      await stream.sendStdin(stdin);
      await stream.closeStdin();
    }
  } catch (error) {
    if (stream.open) throw error;
  }
}

function checked(result: CommandResult): CommandResult {
  if (result.exitCode !== 0 || result.timedOut) throw new CommandExitError(result);
  return result;
}

/** Sends `signal` to process `pid`; `false` if there is no such process (any more). */
async function signalProcess(ctx: SessionContext, pid: number, signal: Signal): Promise<boolean> {
  try {
    await ctx.client.fetch("POST", ctx.path(`/processes/${pid}/signal`), { json: { signal: signalNumber(signal) } });
    return true;
  } catch (error) {
    if (error instanceof NoSuchProcessError) return false;
    throw error;
  }
}

/** A command started in the background (or re-attached with `commands.connect`). It keeps
 * running when this handle is dropped or disconnected. */
export class CommandHandle implements AsyncDisposable {
  readonly pid: number;
  readonly #ctx: SessionContext;
  #stream: ProcessStream | undefined;
  readonly #output: Output;
  readonly #result: Promise<CommandResult>;
  readonly #reattach: (() => Promise<ProcessStream>) | undefined;
  #disconnected = false;
  #settled: CommandResult | undefined;

  /** @internal */
  constructor(
    ctx: SessionContext,
    pid: number,
    output: Output,
    follow: { stream: ProcessStream; fed?: Promise<void>; reattach: () => Promise<ProcessStream> } | CommandResult,
  ) {
    this.#ctx = ctx;
    this.pid = pid;
    this.#output = output;
    if ("stream" in follow) {
      this.#stream = follow.stream;
      this.#reattach = follow.reattach;
      this.#result = this.#follow(follow.stream, follow.fed);
    } else {
      this.#reattach = undefined;
      this.#result = Promise.resolve(follow);
    }
    this.#result.then((r) => (this.#settled = r)).catch(() => {});
  }

  /** Follows the process to its exit. When the stream ends under it because the sandbox's
   * connections were cut (a full snapshot or fork: the process goes on), it attaches again,
   * the replay lined up with what had arrived. */
  async #follow(first: ProcessStream, fed: Promise<void> | undefined): Promise<CommandResult> {
    let stream = first;
    let generation = this.#ctx.streams.generation;
    for (let attempt = 0; ; attempt++) {
      try {
        const [exit] = await Promise.all([stream.exited, attempt === 0 ? fed : undefined]);
        return this.#output.result(this.pid, exit);
      } catch (thrown) {
        // Cut while a suspend or destroy of this session's own ran: that call says why.
        const error = await this.#ctx.streams.explain(thrown, generation);
        const cut = error instanceof StreamInterruptedError || error instanceof SandboxUnavailableError;
        if (!cut || this.#disconnected || !this.#reattach || attempt >= MAX_REATTACH) throw error;
        this.#output.replayFollows();
        generation = this.#ctx.streams.generation;
        stream = await this.#attachAgain();
        this.#stream = stream;
        if (this.#disconnected) stream.close();
      }
    }
  }

  /** Attaches again; while the sandbox's agent is out of reach (another client's full
   * snapshot holds it back) it waits a little and tries again. */
  async #attachAgain(): Promise<ProcessStream> {
    for (let tries = 1; ; tries++) {
      try {
        return await this.#reattach!();
      } catch (error) {
        if (!(error instanceof SandboxUnavailableError) || tries >= MAX_REATTACH) throw error;
        await new Promise((resolve) => setTimeout(resolve, REATTACH_PAUSE_MS * tries));
      }
    }
  }

  /** Output so far. */
  get stdout(): string {
    return this.#output.stdout;
  }

  get stderr(): string {
    return this.#output.stderr;
  }

  /** The exit code once it exited (`null` if a signal killed it), `undefined` while it runs. */
  get exitCode(): number | null | undefined {
    return this.#settled?.exitCode;
  }

  /** Resolves when the command exits; with `check`, rejects with `CommandExitError` unless
   * it exited 0. */
  async wait(options: { check?: boolean } = {}): Promise<CommandResult> {
    const result = await this.#result;
    return options.check ? checked(result) : result;
  }

  /** Sends `signal` (default SIGKILL); `false` if there is no such process any more. */
  kill(signal: Signal = "SIGKILL"): Promise<boolean> {
    return signalProcess(this.#ctx, this.pid, signal);
  }

  /** Writes to the command's stdin (it must have been started with `stdin`). */
  sendStdin(data: BinaryInput): Promise<void> {
    return this.#attached().sendStdin(data);
  }

  /** Ends the command's stdin. */
  closeStdin(): Promise<void> {
    return this.#attached().closeStdin();
  }

  /** Stops following the command's output; it keeps running (`commands.connect(pid)`
   * follows it again). */
  disconnect(): void {
    this.#disconnected = true;
    this.#stream?.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.disconnect();
  }

  #attached(): ProcessStream {
    if (!this.#stream) throw new Error(`command ${this.pid} has ended`);
    return this.#stream;
  }
}

export class Commands {
  readonly #ctx: SessionContext;

  /** @internal */
  constructor(ctx: SessionContext) {
    this.#ctx = ctx;
  }

  /** Runs `cmd` (a shell command line, or an argv array) to completion. With
   * `background: true`, returns at once with a handle to it. */
  run(cmd: string | string[], options: BackgroundRunOptions): Promise<CommandHandle>;
  run(cmd: string | string[], options?: RunOptions & { background?: false }): Promise<CommandResult>;
  async run(cmd: string | string[], options: (RunOptions & { background?: boolean }) | BackgroundRunOptions = {}) {
    if (options.background) return this.#background(cmd, options as BackgroundRunOptions);
    const plain = !options.onStdout && !options.onStderr && (options.stdin === undefined || typeof options.stdin === "string");
    const result = await (plain ? this.#runJson(cmd, options as RunOptions) : this.#runStreaming(cmd, options as RunOptions));
    return options.check ? checked(result) : result;
  }

  /** Short commands without callbacks: one request, output in the response. */
  async #runJson(cmd: string | string[], options: RunOptions): Promise<CommandResult> {
    const request: ExecRequest = {
      cmd: argv(cmd),
      env: options.env ?? {},
      cwd: options.cwd ?? null,
      ...(await this.#ctx.credentials(options.user)),
      stdin: (options.stdin as string | undefined) ?? null,
      timeout_ms: options.timeoutMs ?? null,
    };
    const result = await this.#ctx.client.json<ExecResult>("POST", this.#ctx.path("/exec"), { json: request });
    const r = camelize<ExecResult>(result);
    return {
      pid: r.pid,
      exitCode: r.exitCode ?? null,
      signal: r.signal ?? null,
      stdout: r.stdout,
      stderr: r.stderr,
      timedOut: r.timedOut,
      oomKilled: r.oomKilled,
      truncated: r.truncated,
    };
  }

  async #runStreaming(cmd: string | string[], options: RunOptions): Promise<CommandResult> {
    const start: ExecStart = {
      cmd: argv(cmd),
      env: options.env ?? {},
      cwd: options.cwd ?? null,
      ...(await this.#ctx.credentials(options.user)),
      timeout_ms: options.timeoutMs ?? null,
      stdin: options.stdin !== undefined,
    };
    const output = new Output(options);
    let ws!: WebSocket;
    const stream = await this.#ctx.client.socket(this.#ctx.path("/exec/ws"), undefined, (socket) => {
      ws = socket;
      return new ProcessStream(socket, output.handlers, `running ${JSON.stringify(argv(cmd)[0])}`);
    });
    this.#ctx.streams.add(stream);
    const generation = this.#ctx.streams.generation;
    try {
      ws.send(JSON.stringify(start));
      const pid = await stream.started;
      const fed = options.stdin === undefined ? Promise.resolve() : feed(stream, options.stdin);
      const [exit] = await Promise.all([stream.exited, fed]);
      return output.result(pid, exit);
    } catch (error) {
      throw await this.#ctx.streams.explain(error, generation);
    } finally {
      stream.close();
    }
  }

  async #background(cmd: string | string[], options: BackgroundRunOptions): Promise<CommandHandle> {
    const request: ExecRequest = {
      cmd: argv(cmd),
      env: options.env ?? {},
      cwd: options.cwd ?? null,
      ...(await this.#ctx.credentials(options.user)),
      // An empty string opens stdin; what to write is sent once attached.
      stdin: options.stdin === undefined ? null : "",
      timeout_ms: options.timeoutMs ?? null,
      background: true,
    };
    const started = await this.#ctx.client.json<ExecResult>("POST", this.#ctx.path("/exec"), { json: request });
    const output = new Output(options);
    if (started.pid === 0) {
      // The program could not be executed; there is nothing to attach to.
      const stderr = `space: ${argv(cmd)[0]}: could not be executed (not found, or not executable)\n`;
      output.stderr = stderr;
      const exit = { exitCode: 127, signal: null, timedOut: false, oomKilled: false };
      return new CommandHandle(this.#ctx, 0, output, output.result(0, exit));
    }
    return this.#attach(started.pid, output, options.stdin === true ? undefined : options.stdin);
  }

  async #attach(pid: number, output: Output, stdin?: StdinInput): Promise<CommandHandle> {
    const stream = await this.#open(pid, output);
    // Fed while the caller goes on; `wait()` reports a failure to feed.
    const fed = stdin === undefined ? undefined : feed(stream, stdin);
    return new CommandHandle(this.#ctx, pid, output, { stream, fed, reattach: () => this.#open(pid, output) });
  }

  /** An attach stream of `pid`, once started. */
  async #open(pid: number, output: Output): Promise<ProcessStream> {
    const stream = await this.#ctx.client.socket(
      this.#ctx.path(`/processes/${pid}/attach`),
      undefined,
      (ws) => new ProcessStream(ws, output.handlers, `following process ${pid}`),
    );
    this.#ctx.streams.add(stream);
    await stream.started;
    return stream;
  }

  /** Follows a running (or recently exited) process: its buffered output first, then live
   * output and its exit. */
  connect(pid: number, options: ConnectOptions = {}): Promise<CommandHandle> {
    return this.#attach(pid, new Output(options));
  }

  /** Processes started in the session: running ones and recently exited ones. */
  async list(): Promise<ProcessInfo[]> {
    const list = await this.#ctx.client.json<components["schemas"]["ProcessList"]>("GET", this.#ctx.path("/processes"));
    return camelize<components["schemas"]["ProcessList"]>(list).processes;
  }

  /** Sends `signal` (default SIGKILL) to process `pid`; `false` if there is no such process. */
  kill(pid: number, signal: Signal = "SIGKILL"): Promise<boolean> {
    return signalProcess(this.#ctx, pid, signal);
  }
}
