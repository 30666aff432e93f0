// The SDK's model types: the API's schemas (src/generated/api.ts, generated from
// docs/openapi.json) with their properties in camelCase. Deriving them rather than restating
// them means a changed document changes these types, and the code using them stops compiling
// where it no longer fits.

import type { components } from "./generated/api.js";
import type { WirePortAccess } from "./wire.js";

type Schemas = components["schemas"];

type CamelCase<S extends string> = S extends `${infer Head}_${infer Tail}` ? `${Head}${Capitalize<CamelCase<Tail>>}` : S;

/** `T` with every property name (deeply) in camelCase; free-form maps keep their keys. */
export type Camelize<T> = T extends readonly (infer U)[]
  ? Camelize<U>[]
  : T extends object
    ? { [K in keyof T as K extends string ? CamelCase<K> : K]: Camelize<T[K]> }
    : T;

/** Fields whose values are maps of the user's own keys: their keys are never renamed. */
const VERBATIM = new Set(["env", "labels", "metadata", "sessions"]);

/** The runtime half of `Camelize`: renames the keys of API objects, not of user maps. */
export function camelize<T>(value: unknown): Camelize<T> {
  return convert(value) as Camelize<T>;
}

function convert(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(convert);
  if (value === null || typeof value !== "object") return value;
  const out: Record<string, unknown> = {};
  for (const [key, item] of Object.entries(value)) {
    out[key.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase())] = VERBATIM.has(key) ? item : convert(item);
  }
  return out;
}

export type SessionState = Schemas["SessionState"];
export type RuntimeKind = Schemas["RuntimeKind"];
export type SnapshotKind = Schemas["SnapshotKind"];
export type NetworkPolicy = Camelize<Schemas["NetworkPolicy"]>;
export type SnapshotPolicy = Camelize<Schemas["SnapshotPolicy"]>;

/** A session as the API describes it (`GET /v1/sessions/{id}`). */
export type SessionInfo = Camelize<Schemas["Session"]>;
export type Snapshot = Camelize<Schemas["Snapshot"]>;
export type SessionStats = Camelize<Schemas["SessionStats"]>;
export type SessionEvent = Camelize<Schemas["SessionEvent"]>;
export type FileInfo = Camelize<Schemas["FileInfo"]>;
export type FileType = Schemas["FileType"];
export type WriteInfo = Camelize<Schemas["WriteResult"]>;
export type ProcessInfo = Camelize<Schemas["ProcessInfo"]>;
export type Template = Camelize<Schemas["Template"]>;
export type TemplateList = Camelize<Schemas["TemplateList"]>;
export type ServerStatus = Camelize<Schemas["Status"]>;

/** One filesystem change seen by `files.watch`. */
export interface WatchEvent {
  /** `create`, `modify`, `remove`, `moved_from`, `moved_to` or `overflow` (events were lost). */
  kind: "create" | "modify" | "remove" | "moved_from" | "moved_to" | "overflow" | (string & {});
  path: string;
  isDir: boolean;
}

/** Access to a port of the session (`POST /v1/sessions/{id}/ports/{port}`): `url` (the
 * proxy path on the API server), `previewUrl` (`{port}-{id}.{domain}` when the server has a
 * preview domain), and `token`, for clients without the API key (header
 * `X-Space-Port-Token` or query `space_token`; shown only by the call that opened it). */
export type PortAccess = Camelize<WirePortAccess>;

/** How a command ended. */
export interface CommandResult {
  pid: number;
  /** Exit code; `null` when the process was killed by a signal. */
  exitCode: number | null;
  /** The signal that killed the process, if one did. */
  signal: number | null;
  stdout: string;
  stderr: string;
  /** Killed because it ran longer than `timeoutMs`. */
  timedOut: boolean;
  /** The sandbox hit its memory limit while the command ran. */
  oomKilled: boolean;
  /** Output was cut (at 16 MiB per stream); callbacks still saw all of it. */
  truncated: boolean;
}

/** The inverse of `camelize`, for request bodies built from camelCase options. */
export function snakeize(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(snakeize);
  if (value === null || typeof value !== "object") return value;
  const out: Record<string, unknown> = {};
  for (const [key, item] of Object.entries(value)) {
    const name = key.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
    out[name] = VERBATIM.has(name) ? item : snakeize(item);
  }
  return out;
}
