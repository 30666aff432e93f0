// Wire types docs/openapi.json does not describe yet (the WebSocket messages, the ports API
// of issue 15). Each is the generated schema as soon as the document has one of that name,
// and the local description until then.

import type { components } from "./generated/api.js";

type Schemas = components["schemas"];
type Schema<Name extends string, Fallback> = Name extends keyof Schemas ? Schemas[Name] : Fallback;

/** First text message of an exec WebSocket. */
export type ExecStart = Schema<
  "ExecStart",
  {
    cmd: string[];
    env?: Record<string, string>;
    cwd?: string | null;
    uid?: number | null;
    gid?: number | null;
    timeout_ms?: number | null;
    tty?: { rows: number; cols: number } | null;
    stdin?: boolean;
  }
>;

/** Text messages the server sends on exec, attach and watch WebSockets. */
export type WsServerMessage = Schema<
  "WsServerMessage",
  | { type: "started"; pid: number }
  | { type: "exit"; exit_code?: number | null; signal?: number | null; timed_out: boolean; oom_killed: boolean }
  | { type: "error"; code: string; message: string }
>;

export type WireWatchEvent = Schema<"WatchEvent", { kind: string; path: string; is_dir: boolean }>;

export type WirePortAccess = Schema<
  "PortAccess",
  { port: number; public: boolean; url: string; preview_url?: string | null; token?: string | null; opened_at?: number | null }
>;

export type Body = RequestInit["body"];
