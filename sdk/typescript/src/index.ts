// @space/sdk: the TypeScript SDK of space (secure, stateful sandboxes for AI agents).

import "./polyfill.js";

export { Session } from "./session.js";
export type { CreateOptions, ConnectSessionOptions, ListOptions, SessionSettings } from "./session.js";
export { Commands, CommandHandle } from "./commands.js";
export type { RunOptions, BackgroundRunOptions, ConnectOptions, StdinInput } from "./commands.js";
export { Files, Watcher } from "./files.js";
export type { FileData, WriteOptions, WriteEntry, WatchOptions } from "./files.js";
export { Pty, PtyHandle } from "./pty.js";
export type { PtyOptions, PtySize } from "./pty.js";
export { Ports } from "./ports.js";
export { ApiClient, DEFAULT_URL } from "./client.js";
export type { ConnectionOptions } from "./client.js";
export { SpaceClient, Keys, Quotas } from "./space.js";
export type { ApiKey, CreatedKey, TenantQuota, QuotaLimits } from "./space.js";
export { Network } from "./network.js";
export type { SessionNetwork, NetworkPolicyUpdate, AuditEvent } from "./network.js";
export type { User } from "./context.js";
export type { Signal } from "./signals.js";
export type { ExitInfo, BinaryInput } from "./stream.js";
export * from "./errors.js";
export type * from "./types.js";
export { camelize } from "./types.js";
export type { components as ApiSchemas, paths as ApiPaths } from "./generated/api.js";
