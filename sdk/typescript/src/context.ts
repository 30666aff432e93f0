// What the parts of a session (commands, files, pty, ports) share.

import type { ApiClient } from "./client.js";
import type { SpaceError } from "./errors.js";

/** A WebSocket stream of the session (exec, attach, pty, watch). */
export interface SessionStream {
  abort(error: SpaceError): void;
  readonly closed: Promise<unknown>;
}

/** The session's open streams. Restore, suspend, full snapshots and destroy end them on the
 * server (docs/lifecycle.md), and the server does not always close their WebSockets then:
 * after such a call through this SDK they are ended here, so nothing waits forever. */
export class SessionStreams {
  readonly #open = new Set<SessionStream>();

  add<T extends SessionStream>(stream: T): T {
    this.#open.add(stream);
    void stream.closed.finally(() => this.#open.delete(stream));
    return stream;
  }

  get size(): number {
    return this.#open.size;
  }

  abortAll(error: () => SpaceError): void {
    for (const stream of this.#open) stream.abort(error());
    this.#open.clear();
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
