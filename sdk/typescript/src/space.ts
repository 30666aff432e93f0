// Calls about the server rather than one session.

import type { components } from "./generated/api.js";
import { ApiClient, type ConnectionOptions } from "./client.js";
import { camelize, type ServerStatus, type TemplateList } from "./types.js";

export class SpaceClient {
  readonly client: ApiClient;

  constructor(options: ConnectionOptions = {}) {
    this.client = new ApiClient(options);
  }

  /** Version, sessions by state, templates, pool, what full snapshots and runtimes need. */
  async status(): Promise<ServerStatus> {
    return camelize<components["schemas"]["Status"]>(await this.client.json("GET", "/v1/status"));
  }

  async templates(): Promise<TemplateList> {
    return camelize<components["schemas"]["TemplateList"]>(await this.client.json("GET", "/v1/templates"));
  }
}
