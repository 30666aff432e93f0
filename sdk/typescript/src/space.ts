// Calls about the server rather than one session: status, templates, API keys and quotas.

import type { components } from "./generated/api.js";
import { ApiClient, type ConnectionOptions } from "./client.js";
import { camelize, type Camelize, type ServerStatus, type TemplateList } from "./types.js";

type Schemas = components["schemas"];
export type ApiKey = Camelize<Schemas["ApiKey"]>;
export type CreatedKey = Camelize<Schemas["CreatedKey"]>;
export type TenantQuota = Camelize<Schemas["TenantQuota"]>;
/** Limits of a tenant; `null` is unlimited, a missing one is left as it is. */
export type QuotaLimits = Camelize<Schemas["QuotaLimits"]>;

/** API keys (`/v1/keys`): admins manage every tenant's, others see their tenant's. */
export class Keys {
  readonly #client: ApiClient;

  /** @internal */
  constructor(client: ApiClient) {
    this.#client = client;
  }

  /** A new key of `tenant` (created if new; admin key only). The secret is in `key`, shown
   * only here. */
  async create(tenant: string, options: { name?: string; expiresInMs?: number } = {}): Promise<CreatedKey> {
    const request: Schemas["CreateKeyRequest"] = { tenant };
    if (options.name !== undefined) request.name = options.name;
    if (options.expiresInMs !== undefined) request.expires_in_secs = Math.ceil(options.expiresInMs / 1000);
    return camelize<Schemas["CreatedKey"]>(await this.#client.json("POST", "/v1/keys", { json: request }));
  }

  /** Keys (never their secrets). */
  async list(): Promise<ApiKey[]> {
    return camelize<Schemas["KeyList"]>(await this.#client.json("GET", "/v1/keys")).keys;
  }

  /** Revokes a key: its next request fails with `KeyRevokedError`. */
  async revoke(id: string): Promise<ApiKey> {
    return camelize<Schemas["ApiKey"]>(await this.#client.json("DELETE", `/v1/keys/${encodeURIComponent(id)}`));
  }

  /** A new key with the same tenant and name; the old one is revoked. */
  async rotate(id: string): Promise<CreatedKey> {
    return camelize<Schemas["CreatedKey"]>(await this.#client.json("POST", `/v1/keys/${encodeURIComponent(id)}/rotate`));
  }
}

/** Per-tenant quotas on sessions, CPUs, memory and disk (`/v1/tenants/{tenant}/quota`). */
export class Quotas {
  readonly #client: ApiClient;

  /** @internal */
  constructor(client: ApiClient) {
    this.#client = client;
  }

  async get(tenant: string): Promise<TenantQuota> {
    return camelize<Schemas["TenantQuota"]>(await this.#client.json("GET", `/v1/tenants/${encodeURIComponent(tenant)}/quota`));
  }

  /** Sets limits (admin key only); a create or fork beyond one fails with `QuotaExceededError`. */
  async set(tenant: string, limits: QuotaLimits): Promise<TenantQuota> {
    const request: Schemas["QuotaLimits"] = {};
    if (limits.maxSessions !== undefined) request.max_sessions = limits.maxSessions;
    if (limits.maxCpus !== undefined) request.max_cpus = limits.maxCpus;
    if (limits.maxMemoryMib !== undefined) request.max_memory_mib = limits.maxMemoryMib;
    if (limits.maxDiskMib !== undefined) request.max_disk_mib = limits.maxDiskMib;
    const quota = await this.#client.json<Schemas["TenantQuota"]>("PUT", `/v1/tenants/${encodeURIComponent(tenant)}/quota`, {
      json: request,
    });
    return camelize<Schemas["TenantQuota"]>(quota);
  }
}

export class SpaceClient {
  readonly client: ApiClient;
  readonly keys: Keys;
  readonly quotas: Quotas;

  constructor(options: ConnectionOptions = {}) {
    this.client = new ApiClient(options);
    this.keys = new Keys(this.client);
    this.quotas = new Quotas(this.client);
  }

  /** Version, sessions by state, templates, pool, what full snapshots and runtimes need. */
  async status(): Promise<ServerStatus> {
    return camelize<Schemas["Status"]>(await this.client.json("GET", "/v1/status"));
  }

  async templates(): Promise<TemplateList> {
    return camelize<Schemas["TemplateList"]>(await this.client.json("GET", "/v1/templates"));
  }
}
