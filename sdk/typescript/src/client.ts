// The HTTP and WebSocket transport: configuration, authentication, error mapping.

import { randomUUID } from "node:crypto";
import type { IncomingMessage } from "node:http";
import WebSocket from "ws";
import type { Body } from "./wire.js";
import { ConfigurationError, ConnectionError, apiError, errorFromResponse, type SpaceError } from "./errors.js";

/** Where the server is and how to authenticate; each falls back on its environment variable. */
export interface ConnectionOptions {
  /** Base URL of the space server, e.g. `http://127.0.0.1:7070`. Default: `SPACE_URL`, else
   * `http://127.0.0.1:7070`. */
  url?: string;
  /** API key. Default: `SPACE_API_KEY`. */
  apiKey?: string;
  /** Headers sent with every request (e.g. for a proxy in front of the server). */
  headers?: Record<string, string>;
}

export const DEFAULT_URL = "http://127.0.0.1:7070";

export type Query = Record<string, string | number | boolean | string[] | undefined | null>;

export interface RequestOptions {
  query?: Query;
  /** JSON body. */
  json?: unknown;
  /** Raw body (streamed when it is a stream). */
  body?: Body;
  headers?: Record<string, string>;
  signal?: AbortSignal;
  /** Send an `Idempotency-Key` and retry (twice) when the connection fails: the server
   * replays the first answer instead of acting twice. For lifecycle calls with JSON bodies. */
  idempotent?: boolean;
}

/** Waits before the retries of an idempotent call. */
const RETRY_DELAYS_MS = [250, 1000];

/** The transport one or more sessions share. */
export class ApiClient {
  readonly url: string;
  readonly #apiKey: string;
  readonly #headers: Record<string, string>;

  constructor(options: ConnectionOptions = {}) {
    const url = options.url ?? process.env.SPACE_URL ?? DEFAULT_URL;
    const apiKey = options.apiKey ?? process.env.SPACE_API_KEY;
    if (!apiKey) {
      throw new ConfigurationError(
        "no API key: pass { apiKey } or set SPACE_API_KEY (an admin creates keys with `space key create TENANT`)",
        { code: "configuration_error", status: 0 },
      );
    }
    try {
      new URL(url);
    } catch (cause) {
      throw new ConfigurationError(`SPACE_URL ${JSON.stringify(url)} is not a URL; use e.g. ${DEFAULT_URL}`, {
        code: "configuration_error",
        status: 0,
        cause,
      });
    }
    this.url = url.replace(/\/+$/, "");
    this.#apiKey = apiKey;
    this.#headers = options.headers ?? {};
  }

  /** The absolute URL of `path` (which starts with `/v1/`) with `query`. */
  href(path: string, query?: Query): string {
    const url = new URL(this.url + path);
    for (const [name, value] of Object.entries(query ?? {})) {
      if (value === undefined || value === null) continue;
      for (const item of Array.isArray(value) ? value : [value]) url.searchParams.append(name, String(item));
    }
    return url.toString();
  }

  authHeaders(): Record<string, string> {
    return { ...this.#headers, authorization: `Bearer ${this.#apiKey}` };
  }

  /** Sends a request; a non-2xx answer is thrown as its typed error. */
  async fetch(method: string, path: string, options: RequestOptions = {}): Promise<Response> {
    if (!options.idempotent) return this.#fetchOnce(method, path, options);
    const headers = { ...options.headers, "idempotency-key": randomUUID() };
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.#fetchOnce(method, path, { ...options, headers });
      } catch (error) {
        const delay = RETRY_DELAYS_MS[attempt];
        if (!(error instanceof ConnectionError) || delay === undefined) throw error;
        await new Promise((resolve) => setTimeout(resolve, delay));
      }
    }
  }

  async #fetchOnce(method: string, path: string, options: RequestOptions): Promise<Response> {
    const headers: Record<string, string> = { ...this.authHeaders(), ...options.headers };
    let body: Body | undefined = options.body;
    if (options.json !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(options.json);
    }
    const init: RequestInit & { duplex?: "half" } = { method, headers, body, signal: options.signal };
    // A streamed upload needs half duplex in Node's fetch.
    if (body instanceof ReadableStream) init.duplex = "half";
    let response: Response;
    try {
      response = await fetch(this.href(path, options.query), init);
    } catch (cause) {
      throw connectionError(this.url, `${method} ${path}`, cause);
    }
    if (!response.ok) throw await errorFromResponse(response, `${method} ${path}`);
    return response;
  }

  /** A request to any URL, with connection failures mapped; the answer is returned whatever
   * its status. */
  async raw(url: string, init: RequestInit & { duplex?: "half" } = {}): Promise<Response> {
    if (init.body instanceof ReadableStream) init.duplex = "half";
    try {
      return await fetch(url, init);
    } catch (cause) {
      throw connectionError(this.url, `${init.method ?? "GET"} ${new URL(url).pathname}`, cause);
    }
  }

  /** A JSON call; `undefined` for 204 answers. */
  async json<T>(method: string, path: string, options: RequestOptions = {}): Promise<T> {
    const response = await this.fetch(method, path, options);
    if (response.status === 204) return undefined as T;
    const text = await response.text();
    return (text ? JSON.parse(text) : undefined) as T;
  }

  /** Opens a WebSocket and resolves with what `setup` made of it once it is open; rejects
   * with the typed error of a refused upgrade (404 for a session that is not the caller's,
   * 409 for one that is not running…). `setup` runs before the socket opens, so its
   * listeners see the first messages (which can arrive with the upgrade's response). */
  socket<T>(path: string, query: Query | undefined, setup: (ws: WebSocket) => T): Promise<T> {
    const url = this.href(path, query).replace(/^http/, "ws");
    const ws = new WebSocket(url, { headers: this.authHeaders(), perMessageDeflate: false });
    ws.binaryType = "nodebuffer";
    const made = setup(ws);
    return new Promise((resolve, reject) => {
      const cleanup = () => {
        ws.off("open", onOpen);
        ws.off("error", onError);
        ws.off("unexpected-response", onResponse);
      };
      const fail = (error: SpaceError) => {
        cleanup();
        ws.on("error", () => {});
        ws.terminate();
        reject(error);
      };
      const onOpen = () => {
        cleanup();
        resolve(made);
      };
      const onError = (cause: Error) => fail(connectionError(this.url, `GET ${path}`, cause));
      const onResponse = (_request: unknown, response: IncomingMessage) => {
        const chunks: Buffer[] = [];
        response.on("data", (chunk: Buffer) => chunks.push(chunk));
        response.on("error", () => {});
        response.on("end", () => {
          const headers = new Headers();
          for (const [name, value] of Object.entries(response.headers)) {
            if (typeof value === "string") headers.set(name, value);
          }
          const status = response.statusCode ?? 0;
          // `Response` refuses bodies on some statuses (101, 204…): those get none.
          const body = status >= 200 && status !== 204 && status !== 304 ? Buffer.concat(chunks) : null;
          errorFromResponse(new Response(body, { status: status || 500, headers }), `GET ${path}`).then(fail, fail);
        });
      };
      ws.on("open", onOpen);
      ws.on("error", onError);
      ws.on("unexpected-response", onResponse);
    });
  }
}

function connectionError(url: string, what: string, cause: unknown): ConnectionError {
  const reason = cause instanceof Error ? ((cause.cause as Error | undefined)?.message ?? cause.message) : String(cause);
  return new ConnectionError(
    `${what}: cannot reach the space server at ${url} (${reason}); check SPACE_URL and that \`space serve\` runs`,
    { code: "connection_error", status: 0, cause },
  );
}

/** The typed error of an in-band `{"type":"error","code","message"}` WebSocket message. */
export function socketError(message: { code?: unknown; message?: unknown }): SpaceError {
  return apiError(String(message.code ?? "unknown"), String(message.message ?? "the server reported an error"));
}
