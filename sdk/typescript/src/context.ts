// What the parts of a session (commands, files, pty, ports) share.

import type { ApiClient } from "./client.js";
import { SandboxUnavailableError, type SpaceError } from "./errors.js";

/** A WebSocket stream of the session (exec, attach, pty, watch). */
export interface SessionStream {
  abort(error: SpaceError): void;
  readonly closed: Promise<unknown>;
}

/** The session's open streams. Restore, suspend, full snapshots and destroy end them on the
 * server (docs/lifecycle.md): a stream the server ends then says only that the sandbox's
 * agent went away. After such a call through this SDK the streams are ended here, with an
 * error that says which call it was, and a stream the server ended while the call ran learns
 * the same from `explain`. */
export class SessionStreams {
  readonly #open = new Set<SessionStream>();
  /** Calls of this session's own that end its streams, while they run. */
  readonly #ending = new Set<Promise<unknown>>();
  #generation = 0;
  #lastEnd: SpaceError | undefined;

  add<T extends SessionStream>(stream: T): T {
    this.#open.add(stream);
    // One that closes while an ending call runs stays here, so the call's end reaches it.
    void stream.closed.finally(() => this.#settled().then(() => this.#open.delete(stream)));
    return stream;
  }

  get size(): number {
    return this.#open.size;
  }

  /** Counts the streams ended so far; pass it to `explain`. */
  get generation(): number {
    return this.#generation;
  }

  /** Runs `call` (one that ends the session's streams and then calls `abortAll`), letting a
   * stream cut while it runs wait for it in `explain`. */
  async ending<T>(call: () => Promise<T>): Promise<T> {
    const running = call();
    this.#ending.add(running);
    try {
      return await running;
    } finally {
      this.#ending.delete(running);
    }
  }

  /** Why a stream opened at `generation` was cut with `error`: the error a call of the
   * session's own ended the streams with since (once it is over), else `error`. */
  async explain(error: unknown, generation: number): Promise<unknown> {
    if (!(error instanceof SandboxUnavailableError)) return error;
    await this.#settled();
    return this.#generation > generation && this.#lastEnd ? this.#lastEnd : error;
  }

  abortAll(error: () => SpaceError): void {
    this.#generation++;
    this.#lastEnd = error();
    for (const stream of this.#open) stream.abort(error());
    this.#open.clear();
  }

  async #settled(): Promise<void> {
    while (this.#ending.size > 0) await Promise.allSettled([...this.#ending]);
  }
}

export interface SessionContext {
  readonly client: ApiClient;
  readonly id: string;
  readonly streams: SessionStreams;
  /** `/v1/sessions/{id}{suffix}`. */
  path(suffix: string): string;
  /** The uid and gid to run as for a `user` option (names are looked up in the sandbox's
   * `/etc/passwd`). */
  credentials(user: User | undefined): Promise<{ uid?: number; gid?: number }>;
}

/** Who a command runs as: a uid, a user name of the sandbox (`"root"`), or both ids. */
export type User = number | string | { uid: number; gid?: number };

/** Parses `/etc/passwd` for `name`'s uid and gid. */
export function lookupUser(passwd: string, name: string): { uid: number; gid: number } | undefined {
  for (const line of passwd.split("\n")) {
    const [user, , uid, gid] = line.split(":");
    if (user === name && uid !== undefined && gid !== undefined) return { uid: Number(uid), gid: Number(gid) };
  }
  return undefined;
}
