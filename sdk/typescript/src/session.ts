// `Session`: create, connect to, list and destroy sessions, and their lifecycle (pause,
// resume, suspend, snapshots, restore, fork).

import "./polyfill.js";
import type { components } from "./generated/api.js";
import { ApiClient, type ConnectionOptions } from "./client.js";
import { Commands } from "./commands.js";
import { SessionStreams, lookupUser, type SessionContext, type User } from "./context.js";
import { BadRequestError, ConnectionClosedError, NotFoundError, StreamInterruptedError } from "./errors.js";
import { Files } from "./files.js";
import { Network } from "./network.js";
import { Ports } from "./ports.js";
import { Pty } from "./pty.js";
import {
  camelize,
  snakeize,
  type NetworkPolicy,
  type RuntimeKind,
  type SessionEvent,
  type SessionInfo,
  type SessionState,
  type SessionStats,
  type Snapshot,
  type SnapshotKind,
  type SnapshotPolicy,
} from "./types.js";

type Schemas = components["schemas"];

export interface SessionSettings {
  /** A name for people (at most 128 characters); not unique. */
  name?: string;
  /** Labels to find sessions by (`Session.list({ labels })`). */
  labels?: Record<string, string>;
  /** Free-form data kept with the session (at most 16 KiB). */
  metadata?: Record<string, string>;
  /** Calls on the session while it is suspended resume it first, instead of failing with
   * `SessionSuspendedError`. */
  autoResume?: boolean;
  /** Suspend the session after this long without activity (rounded up to seconds). */
  idleTimeoutMs?: number;
  /** Destroy the session this long after it was created (rounded up to seconds). */
  maxAgeMs?: number;
  /** When a call resumes the suspended session (`autoResume`), it ends this long after that
   * resume (rounded up to seconds). */
  autoResumeMaxAgeMs?: number;
  /** Automatic snapshots and their retention. */
  snapshotPolicy?: SnapshotPolicy;
}

export interface CreateOptions extends ConnectionOptions, SessionSettings {
  /** Template name (default: the server's default template). */
  template?: string;
  /** `linux` or `vm` (default: the server's). */
  runtime?: RuntimeKind;
  /** Host names the session may connect to (`api.github.com`, `*.pypi.org`): shorthand for
   * `network.allow`. Default: nowhere. */
  allow?: string[];
  /** The whole egress policy (`allow`, `deny`, `ports`, `cidrs`). */
  network?: NetworkPolicy;
  /** Names of credentials to grant (see the API's `POST /v1/credentials`). */
  grants?: string[];
  /** Environment variables of every command in the session. */
  env?: Record<string, string>;
  cpus?: number;
  memoryMib?: number;
  /** Disk limit in MiB; 0 for none (default: the server's). */
  diskMib?: number;
  pids?: number;
}

export interface ConnectSessionOptions extends ConnectionOptions {
  /** Resume the session when it is suspended or paused (default true). */
  resume?: boolean;
}

export interface ListOptions extends ConnectionOptions {
  /** Only sessions with all of these labels. */
  labels?: Record<string, string>;
  state?: SessionState;
  template?: string;
  /** Include destroyed sessions. */
  all?: boolean;
  /** Every tenant's sessions (admin keys only). */
  allTenants?: boolean;
}

function seconds(ms: number | undefined): number | undefined {
  return ms === undefined ? undefined : Math.ceil(ms / 1000);
}

/** The `/etc/passwd` lookups a session caches for `user` options. */
class Users {
  #passwd: Promise<string> | undefined;

  constructor(private readonly files: () => Files) {}

  async credentials(user: User | undefined): Promise<{ uid?: number; gid?: number }> {
    if (user === undefined) return {};
    if (typeof user === "number") return { uid: user };
    if (typeof user === "object") return user.gid === undefined ? { uid: user.uid } : { uid: user.uid, gid: user.gid };
    if (/^\d+$/.test(user)) return { uid: Number(user) };
    if (user === "root") return { uid: 0, gid: 0 };
    this.#passwd ??= this.files().read("/etc/passwd");
    const found = lookupUser(await this.#passwd.catch(() => ""), user);
    if (!found) {
      throw new BadRequestError(`no user ${JSON.stringify(user)} in the sandbox's /etc/passwd; pass a uid instead`, {
        code: "bad_request",
        status: 400,
      });
    }
    return found;
  }
}

/** A session: a sandbox's processes, memory and files that live until destroyed, and can be
 * paused, suspended, snapshotted, restored and forked. */
export class Session implements AsyncDisposable {
  readonly id: string;
  readonly client: ApiClient;
  /** The session as last seen (refreshed by lifecycle calls and `refresh()`). */
  info: SessionInfo;
  readonly commands: Commands;
  readonly files: Files;
  readonly pty: Pty;
  readonly ports: Ports;
  readonly network: Network;
  readonly #streams = new SessionStreams();

  /** @internal Use `Session.create`, `Session.connect` or `Session.list`. */
  constructor(client: ApiClient, info: SessionInfo) {
    this.client = client;
    this.id = info.id;
    this.info = info;
    const users = new Users(() => this.files);
    const ctx: SessionContext = {
      client,
      id: this.id,
      streams: this.#streams,
      path: (suffix) => `/v1/sessions/${encodeURIComponent(this.id)}${suffix}`,
      credentials: (user) => users.credentials(user),
    };
    this.commands = new Commands(ctx);
    this.files = new Files(ctx);
    this.pty = new Pty(ctx);
    this.ports = new Ports(ctx);
    this.network = new Network(ctx);
  }

  /** Creates a session and waits until it runs. */
  static async create(options: CreateOptions = {}): Promise<Session> {
    const client = new ApiClient(options);
    const network = options.network || options.allow ? { ...options.network } : undefined;
    if (network && options.allow) network.allow = [...(network.allow ?? []), ...options.allow];
    const request: Schemas["CreateSessionRequest"] = {
      template: options.template ?? null,
      runtime: options.runtime ?? null,
      cpus: options.cpus ?? null,
      memory_mib: options.memoryMib ?? null,
      disk_mib: options.diskMib ?? null,
      pids: options.pids ?? null,
      env: options.env ?? {},
      grants: options.grants ?? [],
      network: network ? (snakeize(network) as Schemas["NetworkPolicy"]) : null,
      snapshot_policy: options.snapshotPolicy ? (snakeize(options.snapshotPolicy) as Schemas["SnapshotPolicy"]) : null,
      idle_timeout_secs: seconds(options.idleTimeoutMs) ?? null,
      max_age_secs: seconds(options.maxAgeMs) ?? null,
      auto_resume_max_age_secs: seconds(options.autoResumeMaxAgeMs) ?? null,
      ...extensions(options),
    };
    const info = await client.json<Schemas["Session"]>("POST", "/v1/sessions", { json: dropNulls(request), idempotent: true });
    return new Session(client, camelize<Schemas["Session"]>(info));
  }

  /** A handle to an existing session; resumes it when it is suspended or paused (unless
   * `resume: false`). */
  static async connect(id: string, options: ConnectSessionOptions = {}): Promise<Session> {
    const session = new Session(new ApiClient(options), { id } as SessionInfo);
    const info = await session.refresh();
    if ((options.resume ?? true) && (info.state === "suspended" || info.state === "paused")) await session.resume();
    return session;
  }

  /** The caller's sessions, newest first, filtered by labels, state and template. */
  static async list(options: ListOptions = {}): Promise<Session[]> {
    const client = new ApiClient(options);
    const list = await client.json<Schemas["SessionList"]>("GET", "/v1/sessions", {
      query: {
        label: Object.entries(options.labels ?? {}).map(([key, value]) => `${key}=${value}`),
        state: options.state,
        template: options.template,
        all: options.all || undefined,
        all_tenants: options.allTenants || undefined,
      },
    });
    return list.sessions.map((info) => new Session(client, camelize<Schemas["Session"]>(info)));
  }

  get state(): SessionState {
    return this.info.state;
  }

  #set(info: Schemas["Session"]): SessionInfo {
    this.info = camelize<Schemas["Session"]>(info);
    return this.info;
  }

  #path(suffix = ""): string {
    return `/v1/sessions/${encodeURIComponent(this.id)}${suffix}`;
  }

  async #call(method: string, suffix: string, json?: unknown): Promise<SessionInfo> {
    const idempotent = method === "POST" || method === "DELETE";
    return this.#set(await this.client.json<Schemas["Session"]>(method, this.#path(suffix), { json, idempotent }));
  }

  /** Fetches the session's current state. */
  refresh(): Promise<SessionInfo> {
    return this.#call("GET", "");
  }

  /** Changes the session's settings (name, labels, metadata, auto-resume, idle timeout,
   * maximum age, snapshot policy); a timeout of 0 turns it off. */
  update(settings: SessionSettings): Promise<SessionInfo> {
    const request: Schemas["UpdateSessionRequest"] = {
      idle_timeout_secs: seconds(settings.idleTimeoutMs) ?? null,
      max_age_secs: seconds(settings.maxAgeMs) ?? null,
      auto_resume_max_age_secs: seconds(settings.autoResumeMaxAgeMs) ?? null,
      snapshot_policy: settings.snapshotPolicy ? (snakeize(settings.snapshotPolicy) as Schemas["SnapshotPolicy"]) : null,
      ...extensions(settings),
    };
    return this.#call("PATCH", "", dropNulls(request));
  }

  /** Destroys the session and its sandbox (its snapshots go too). Fine if already destroyed. */
  async destroy(): Promise<void> {
    await this.#streams.ending(async () => {
      await this.#call("DELETE", "");
      this.#endStreams("destroyed");
    });
  }

  /** Ends the streams (commands, terminals, watches) open through this object after a call
   * that ended them on the server (`what`: "suspended", …): their `wait()` and iteration
   * reject with a `ConnectionClosedError` saying so. Background commands keep running where
   * the session does (`commands.connect(pid)` follows one again). */
  #endStreams(what: string, processesGoOn = false): void {
    const Class = processesGoOn ? StreamInterruptedError : ConnectionClosedError;
    this.#streams.abortAll(
      () =>
        new Class(
          `session ${this.id} was ${what}, which ends its open command, terminal and watch streams; ` +
            "background commands keep running: follow one again with commands.connect(pid)",
          { code: "connection_closed", status: 0 },
        ),
    );
  }

  /** Freezes every process in place; memory stays on the node. */
  pause(): Promise<SessionInfo> {
    return this.#call("POST", "/pause");
  }

  /** Thaws a paused session, or brings a suspended one back with its processes. */
  resume(): Promise<SessionInfo> {
    return this.#call("POST", "/resume");
  }

  /** Saves processes, memory and files in a full snapshot and frees the sandbox; `resume()`
   * (or `Session.connect`) brings it back. */
  suspend(): Promise<SessionInfo> {
    return this.#streams.ending(async () => {
      const info = await this.#call("POST", "/suspend");
      this.#endStreams("suspended");
      return info;
    });
  }

  /**
   * Takes a snapshot: `disk` (the files; default) or `full` (processes and memory too). With
   * `outlivesSession` it is kept when the session is destroyed (new sessions can still be forked
   * from it) until it is deleted.
   */
  async snapshot(options: { kind?: SnapshotKind; name?: string; outlivesSession?: boolean } = {}): Promise<Snapshot> {
    const request: Schemas["CreateSnapshotRequest"] = {
      kind: options.kind ?? null,
      name: options.name ?? null,
      outlives_session: options.outlivesSession ?? null,
    };
    const take = async () => {
      const snapshot = await this.client.json<Schemas["Snapshot"]>("POST", this.#path("/snapshots"), {
        json: dropNulls(request),
        idempotent: true,
      });
      if (snapshot.kind === "full") this.#endStreams("snapshotted with its processes (a full snapshot)", true);
      return camelize<Schemas["Snapshot"]>(snapshot);
    };
    // A disk snapshot leaves the streams alone; one of the server's default kind may be full.
    return options.kind === "disk" ? take() : this.#streams.ending(take);
  }

  /** The session's snapshots. */
  async snapshots(): Promise<Snapshot[]> {
    const list = await this.client.json<Schemas["SnapshotList"]>("GET", this.#path("/snapshots"));
    return camelize<Schemas["SnapshotList"]>(list).snapshots;
  }

  async deleteSnapshot(snapshot: Snapshot | string): Promise<void> {
    await this.client.fetch("DELETE", this.#path(`/snapshots/${encodeURIComponent(snapshotId(snapshot))}`), {
      idempotent: true,
    });
  }

  /** Puts the session back to `snapshot` (one of its own) in a new sandbox. */
  async restore(snapshot: Snapshot | string): Promise<SessionInfo> {
    const request: Schemas["RestoreRequest"] = { snapshot: snapshotId(snapshot) };
    return this.#streams.ending(async () => {
      const info = await this.#call("POST", "/restore", request);
      this.#endStreams("restored into a new sandbox");
      return info;
    });
  }

  /** Creates `count` (default 1) new sessions from a snapshot of this one (`from`, or one
   * taken now: full when the server can, else disk). Each goes on independently. */
  async fork(options: number | { count?: number; from?: Snapshot | string } = {}): Promise<Session[]> {
    const { count, from } = typeof options === "number" ? { count: options, from: undefined } : options;
    const request: Schemas["ForkRequest"] = { count: count ?? null, from: from === undefined ? null : snapshotId(from) };
    const fork = async () => {
      const list = await this.client.json<Schemas["SessionList"]>("POST", this.#path("/fork"), {
        json: dropNulls(request),
        idempotent: true,
      });
      // A fork from now takes a full snapshot when the server can, which ends open streams.
      if (from === undefined && this.#streams.size > 0 && (await this.#fullSnapshots())) {
        this.#endStreams("forked from a full snapshot", true);
      }
      return list;
    };
    const list = from === undefined ? await this.#streams.ending(fork) : await fork();
    return list.sessions.map((info) => new Session(this.client, camelize<Schemas["Session"]>(info)));
  }

  async #fullSnapshots(): Promise<boolean> {
    const status = await this.client.json<Schemas["Status"]>("GET", "/v1/status");
    return status.full_snapshots.available;
  }

  /** Memory, CPU, processes and disk use now. */
  async stats(): Promise<SessionStats> {
    return camelize<Schemas["SessionStats"]>(await this.client.json<Schemas["SessionStats"]>("GET", this.#path("/stats")));
  }

  /** State transitions and notable events, oldest first. */
  async events(): Promise<SessionEvent[]> {
    const list = await this.client.json<Schemas["EventList"]>("GET", this.#path("/events"));
    return camelize<Schemas["EventList"]>(list).events;
  }

  /** `await using session = await Session.create()` destroys it at the end of the scope. */
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await this.destroy();
    } catch (error) {
      if (!(error instanceof NotFoundError)) throw error;
    }
  }
}

function snapshotId(snapshot: Snapshot | string): string {
  return typeof snapshot === "string" ? snapshot : snapshot.id;
}

type Meta = Pick<Schemas["CreateSessionRequest"], "name" | "labels" | "metadata" | "auto_resume">;

/** The settings given (a server older than one of them is not sent it). */
function extensions(settings: SessionSettings): Meta {
  const wire: Meta = {};
  if (settings.name !== undefined) wire.name = settings.name;
  if (settings.labels !== undefined) wire.labels = settings.labels;
  if (settings.metadata !== undefined) wire.metadata = settings.metadata;
  if (settings.autoResume !== undefined) wire.auto_resume = settings.autoResume;
  return wire;
}

/** The request without its `null`s: the server takes a missing field for its default, and
 * a server without a field (an older one) then still accepts the request. */
function dropNulls<T extends object>(request: T): Partial<T> {
  return Object.fromEntries(Object.entries(request).filter(([, value]) => value !== null)) as Partial<T>;
}
