// `session.ports`: reach servers listening inside the sandbox through the API server's proxy
// (`/v1/sessions/{id}/ports/{port}/…`), or through preview URLs when the server has a
// preview domain. Private by default: the API key or the port's token is needed.

import type { SessionContext } from "./context.js";
import { ERROR_CLASSES, apiError } from "./errors.js";
import { camelize, type PortAccess } from "./types.js";
import type { WirePortAccess } from "./wire.js";

function checkPort(port: number): number {
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new RangeError(`port ${port} is not 1-65535`);
  return port;
}

export class Ports {
  readonly #ctx: SessionContext;
  /** Access opened through this object, for `url()`. */
  readonly #exposed = new Map<number, PortAccess>();

  /** @internal */
  constructor(ctx: SessionContext) {
    this.#ctx = ctx;
  }

  /** The URL that reaches `port` inside the sandbox: its preview URL when it was exposed
   * through this object and the server has a preview domain, else the proxy path on the API
   * server (`{server}/v1/sessions/{id}/ports/{port}/`), which needs the API key (see
   * `fetch`) or the port's token unless the port is public. */
  url(port: number): string {
    const exposed = this.#exposed.get(checkPort(port));
    return exposed?.previewUrl ?? `${this.#ctx.client.url}${this.#ctx.path(`/ports/${port}/`)}`;
  }

  /** Opens access to `port`: returns its URLs and a token for clients without the API key;
   * `public: true` lets anyone reach it without either. */
  async expose(port: number, options: { public?: boolean } = {}): Promise<PortAccess> {
    const access = await this.#ctx.client.json<WirePortAccess>("POST", this.#ctx.path(`/ports/${checkPort(port)}`), {
      json: { public: options.public ?? false },
    });
    const result = camelize<WirePortAccess>(access);
    this.#exposed.set(port, result);
    return result;
  }

  /** The headers that let a client of the proxy in as this API key (`Authorization`). */
  get headers(): Record<string, string> {
    return { authorization: this.#ctx.client.authHeaders().authorization as string };
  }

  /** The access of one port (its token is not shown again). */
  async get(port: number): Promise<PortAccess> {
    const path = this.#ctx.path(`/ports/${checkPort(port)}`);
    return camelize<WirePortAccess>(await this.#ctx.client.json<WirePortAccess>("GET", path));
  }

  /** Ports with open access. */
  async list(): Promise<PortAccess[]> {
    const list = await this.#ctx.client.json<{ ports: WirePortAccess[] }>("GET", this.#ctx.path("/ports"));
    return camelize<{ ports: WirePortAccess[] }>(list).ports;
  }

  /** Closes the token and public access of `port` (the API key still reaches it). */
  async close(port: number): Promise<void> {
    await this.#ctx.client.fetch("DELETE", this.#ctx.path(`/ports/${checkPort(port)}`));
    this.#exposed.delete(port);
  }

  /** An HTTP request to `path` on `port` inside the sandbox, through the proxy, with the API
   * key. Unlike other calls it does not throw for error statuses: they are the server's in
   * the sandbox (the proxy's own errors, e.g. 502 `port_not_listening`, do throw). */
  async fetch(port: number, path = "/", init: RequestInit = {}): Promise<Response> {
    const url = `${this.#ctx.client.url}${this.#ctx.path(`/ports/${checkPort(port)}`)}${path.startsWith("/") ? path : `/${path}`}`;
    const headers = new Headers(init.headers);
    for (const [name, value] of Object.entries(this.#ctx.client.authHeaders())) {
      if (!headers.has(name)) headers.set(name, value);
    }
    const response = await this.#ctx.client.raw(url, { ...init, headers });
    return proxyError(response);
  }
}

/** Throws the proxy's own errors (502 `port_not_listening`, 404 for a session that is not
 * the caller's, 409 for one not running…): error answers in the API's envelope with one of
 * its codes. Other answers, whatever their status, are the sandbox server's and returned. */
async function proxyError(response: Response): Promise<Response> {
  if (response.ok || !response.headers.get("content-type")?.includes("application/json")) return response;
  const text = await response.text();
  try {
    const body = JSON.parse(text) as { error?: { code?: unknown; message?: unknown } };
    const code = body.error?.code;
    if (typeof code === "string" && code in ERROR_CLASSES && typeof body.error?.message === "string") {
      throw apiError(code, body.error.message, response.status, response.headers.get("x-request-id") ?? undefined);
    }
  } catch (error) {
    if (!(error instanceof SyntaxError)) throw error;
  }
  return new Response(text, { status: response.status, statusText: response.statusText, headers: response.headers });
}
