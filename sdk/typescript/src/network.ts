// `session.network`: the session's egress policy, its credential grants and the gateway's
// audit of its connections (docs/egress.md).

import type { components } from "./generated/api.js";
import type { SessionContext } from "./context.js";
import { camelize, snakeize, type Camelize } from "./types.js";

type Schemas = components["schemas"];
export type SessionNetwork = Camelize<Schemas["SessionNetwork"]>;
export type NetworkPolicyUpdate = Camelize<Schemas["NetworkPolicyUpdate"]>;
export type AuditEvent = Camelize<Schemas["AuditEvent"]>;

export class Network {
  readonly #ctx: SessionContext;

  /** @internal */
  constructor(ctx: SessionContext) {
    this.#ctx = ctx;
  }

  /** The policy, grants, and grants inherited from a parent. */
  async get(): Promise<SessionNetwork> {
    return camelize<Schemas["SessionNetwork"]>(await this.#ctx.client.json("GET", this.#ctx.path("/network")));
  }

  /** Changes the policy for new connections at once: `allow`/`deny` patterns move between
   * the lists, `ports`/`cidrs` replace theirs; `detached` makes a fork's inherited grants its
   * own. */
  async update(update: NetworkPolicyUpdate): Promise<SessionNetwork> {
    const network = await this.#ctx.client.json<Schemas["SessionNetwork"]>("PATCH", this.#ctx.path("/network"), {
      json: snakeize(update),
    });
    return camelize<Schemas["SessionNetwork"]>(network);
  }

  /** Grants a credential (by name) to the session. */
  async grant(credential: string): Promise<SessionNetwork> {
    const request: Schemas["GrantRequest"] = { credential };
    const network = await this.#ctx.client.json<Schemas["SessionNetwork"]>("POST", this.#ctx.path("/grants"), { json: request });
    return camelize<Schemas["SessionNetwork"]>(network);
  }

  /** Revokes a grant (also from the forks that inherited it). */
  async revoke(credential: string): Promise<SessionNetwork> {
    const path = this.#ctx.path(`/grants/${encodeURIComponent(credential)}`);
    return camelize<Schemas["SessionNetwork"]>(await this.#ctx.client.json("DELETE", path));
  }

  /** The gateway's decisions about the session's connections, newest last. */
  async audit(options: { limit?: number } = {}): Promise<AuditEvent[]> {
    const list = await this.#ctx.client.json<Schemas["AuditList"]>("GET", this.#ctx.path("/audit"), {
      query: { limit: options.limit },
    });
    return camelize<Schemas["AuditList"]>(list).events;
  }
}
