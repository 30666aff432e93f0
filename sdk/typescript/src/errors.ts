// Typed errors. Every API error carries the server's stable `code`, the HTTP `status` and its
// message (which says what to do). Each code has a class of its own, under a base class per
// kind of failure, so callers can catch as broadly or as narrowly as they need:
//
//   try { await session.files.read("/nope") } catch (e) { if (e instanceof FileNotFoundError) … }
//   catch (e) { if (e instanceof NotFoundError) … }   // any 404
//   catch (e) { if (e instanceof SpaceError) console.log(e.code, e.status) }

import type { components } from "./generated/api.js";
import type { CommandResult } from "./types.js";

/** The error codes of docs/openapi.json (`ErrorCode`), plus those the SDK adds. */
export type ApiErrorCode = components["schemas"]["ErrorCode"];

export interface SpaceErrorOptions {
  code: string;
  status: number;
  /** `X-Request-Id` of the response, when the server sent one. */
  requestId?: string | undefined;
  cause?: unknown;
}

/** Base of every error the SDK throws about the server or the connection to it. */
export class SpaceError extends Error {
  /** The API's stable machine code (`not_found`, `invalid_state`, …) or one of the SDK's
   * (`connection_error`, `connection_closed`, `configuration_error`, `unknown`). */
  readonly code: string;
  /** HTTP status of the response; 0 when there was none (no connection, in-band errors
   * of a WebSocket carry the status their code maps to). */
  readonly status: number;
  readonly requestId: string | undefined;

  constructor(message: string, options: SpaceErrorOptions) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = options.code;
    this.status = options.status;
    this.requestId = options.requestId;
  }
}

// One base class per status.
export class BadRequestError extends SpaceError {}
export class AuthenticationError extends SpaceError {}
export class ForbiddenError extends SpaceError {}
export class NotFoundError extends SpaceError {}
export class MethodNotAllowedError extends SpaceError {}
export class RequestTimeoutError extends SpaceError {}
export class ConflictError extends SpaceError {}
export class PayloadTooLargeError extends SpaceError {}
export class UriTooLongError extends SpaceError {}
export class TooManyRequestsError extends SpaceError {}
export class HeadersTooLargeError extends SpaceError {}
export class InternalError extends SpaceError {}
export class FeatureUnavailableError extends SpaceError {}
export class BadGatewayError extends SpaceError {}
export class SandboxUnavailableError extends SpaceError {}
/** The server's database could not be reached, or was too busy to answer in time: retry
 * after a few seconds (the response's `Retry-After`); calls that change something are safe to
 * retry with the same `Idempotency-Key`. */
export class DatabaseUnavailableError extends SpaceError {}
/** The blob store could not take a snapshot, which stays on its node only: retry, or suspend
 * with `force` to keep it there. */
export class BlobStoreUnavailableError extends SpaceError {}
/** The tenant's own key (BYOK) cannot be used: its KMS refused (the key was disabled, revoked or
 * deleted) or did not answer. The message names the key. */
export class KeyUnavailableError extends SpaceError {}
/** An OAuth provider's token endpoint refused or failed (e.g. during a sign-in's code
 * exchange); the message says what it answered and what to do. */
export class OAuthFailedError extends SpaceError {}
export class TimeoutError extends SpaceError {}
export class InsufficientStorageError extends SpaceError {}

// 400
export class UnknownTemplateError extends BadRequestError {}
/** A Dockerfile build failed (422): the message names the line, and for a `RUN` its exit status and last output. */
export class BuildFailedError extends BadRequestError {}
export class RuntimeUnavailableError extends BadRequestError {}
export class NotADirectoryError extends BadRequestError {}
export class IsADirectoryError extends BadRequestError {}
export class DirectoryNotEmptyError extends BadRequestError {}
export class PortReservedError extends BadRequestError {}
// 401
export class KeyRevokedError extends AuthenticationError {}
export class KeyExpiredError extends AuthenticationError {}
// 403
export class PermissionDeniedError extends ForbiddenError {}
// 404
export class FileNotFoundError extends NotFoundError {}
export class NoSuchProcessError extends NotFoundError {}
export class SnapshotNotFoundError extends NotFoundError {}
export class CredentialNotFoundError extends NotFoundError {}
// 409
export class InvalidStateError extends ConflictError {}
/** A call on a suspended session that was not created with `autoResume`: resume it first
 * (`session.resume()`, or `Session.connect(id)`). */
export class SessionSuspendedError extends InvalidStateError {}
export class IdempotencyConflictError extends ConflictError {}
export class FileExistsError extends ConflictError {}
/** The snapshot's copy in the blob store failed its checksum and was not restored: the
 * message names an older durable snapshot to use instead. */
export class SnapshotCorruptError extends ConflictError {}
// 429
export class LimitExceededError extends TooManyRequestsError {}
export class QuotaExceededError extends TooManyRequestsError {}
// 502
export class PortNotListeningError extends BadGatewayError {}
// 507
export class StorageFullError extends InsufficientStorageError {}
export class DiskQuotaExceededError extends InsufficientStorageError {}

/** A command run with `check: true` exited non-zero, was killed, or timed out; `result`
 * has its output. */
export class CommandExitError extends SpaceError {
  readonly result: CommandResult;

  constructor(result: CommandResult) {
    const what = result.timedOut
      ? "timed out"
      : result.exitCode === null
        ? `was killed by signal ${result.signal}`
        : `exited with code ${result.exitCode}`;
    const last = result.stderr.trim().split("\n").at(-1);
    super(`command ${what}${last ? `: ${last}` : ""}`, { code: "command_failed", status: 0 });
    this.result = result;
  }
}

/** No connection to the server (refused, reset, DNS): check `SPACE_URL`. */
export class ConnectionError extends SpaceError {}
/** A WebSocket (exec, attach, watch) closed before the command or stream ended. */
export class ConnectionClosedError extends SpaceError {}
/** A stream ended because the session's connections were cut under it (a full snapshot or a
 * fork); the process goes on. Background command handles attach again on their own. */
export class StreamInterruptedError extends ConnectionClosedError {}
/** The SDK is missing what it needs to talk to the server (an API key). */
export class ConfigurationError extends SpaceError {}

type ErrorClass = new (message: string, options: SpaceErrorOptions) => SpaceError;

/** Every code of the API's `ErrorCode`, and the codes the issue-15 additions bring
 * (`session_suspended`, `quota_exceeded`, `port_not_listening`, `port_reserved`,
 * `key_revoked`, `key_expired`). A test fails when the OpenAPI document has a code that is
 * missing here. */
export const ERROR_CLASSES = {
  bad_request: BadRequestError,
  unknown_template: UnknownTemplateError,
  runtime_unavailable: RuntimeUnavailableError,
  not_a_directory: NotADirectoryError,
  is_a_directory: IsADirectoryError,
  directory_not_empty: DirectoryNotEmptyError,
  port_reserved: PortReservedError,
  unauthorized: AuthenticationError,
  key_revoked: KeyRevokedError,
  key_expired: KeyExpiredError,
  forbidden: ForbiddenError,
  permission_denied: PermissionDeniedError,
  not_found: NotFoundError,
  file_not_found: FileNotFoundError,
  no_such_process: NoSuchProcessError,
  snapshot_not_found: SnapshotNotFoundError,
  credential_not_found: CredentialNotFoundError,
  method_not_allowed: MethodNotAllowedError,
  request_timeout: RequestTimeoutError,
  conflict: ConflictError,
  invalid_state: InvalidStateError,
  session_suspended: SessionSuspendedError,
  idempotency_conflict: IdempotencyConflictError,
  file_exists: FileExistsError,
  payload_too_large: PayloadTooLargeError,
  uri_too_long: UriTooLongError,
  headers_too_large: HeadersTooLargeError,
  limit_exceeded: LimitExceededError,
  quota_exceeded: QuotaExceededError,
  internal: InternalError,
  feature_unavailable: FeatureUnavailableError,
  port_not_listening: PortNotListeningError,
  sandbox_unavailable: SandboxUnavailableError,
  database_unavailable: DatabaseUnavailableError,
  blob_store_unavailable: BlobStoreUnavailableError,
  key_unavailable: KeyUnavailableError,
  oauth_failed: OAuthFailedError,
  snapshot_corrupt: SnapshotCorruptError,
  timeout: TimeoutError,
  storage_full: StorageFullError,
  disk_quota_exceeded: DiskQuotaExceededError,
  build_failed: BuildFailedError,
} satisfies Record<ApiErrorCode, ErrorClass> & Record<string, ErrorClass>;

/** The HTTP status each code maps to (as `ErrorCode::http_status` in space-api). */
export const ERROR_STATUS: Record<string, number> = {
  bad_request: 400, unknown_template: 400, runtime_unavailable: 400, not_a_directory: 400,
  is_a_directory: 400, directory_not_empty: 400, port_reserved: 400,
  unauthorized: 401, key_revoked: 401, key_expired: 401,
  forbidden: 403, permission_denied: 403,
  not_found: 404, file_not_found: 404, no_such_process: 404, snapshot_not_found: 404, credential_not_found: 404,
  method_not_allowed: 405, request_timeout: 408,
  conflict: 409, invalid_state: 409, session_suspended: 409, idempotency_conflict: 409, file_exists: 409,
  snapshot_corrupt: 409,
  payload_too_large: 413, build_failed: 422, uri_too_long: 414, headers_too_large: 431,
  limit_exceeded: 429, quota_exceeded: 429,
  internal: 500, feature_unavailable: 501, port_not_listening: 502, oauth_failed: 502, sandbox_unavailable: 503,
  database_unavailable: 503, blob_store_unavailable: 503, key_unavailable: 503, timeout: 504,
  storage_full: 507, disk_quota_exceeded: 507,
};

const BY_STATUS: Record<number, ErrorClass> = {
  400: BadRequestError, 401: AuthenticationError, 403: ForbiddenError, 404: NotFoundError,
  405: MethodNotAllowedError, 408: RequestTimeoutError, 409: ConflictError, 413: PayloadTooLargeError,
  414: UriTooLongError, 429: TooManyRequestsError, 431: HeadersTooLargeError, 500: InternalError,
  501: FeatureUnavailableError, 502: BadGatewayError, 503: SandboxUnavailableError, 504: TimeoutError,
  507: InsufficientStorageError,
};

/** The typed error for an API error `code` (falling back on the class of `status`, then on
 * `SpaceError`, for codes this SDK does not know yet). */
export function apiError(code: string, message: string, status?: number, requestId?: string, cause?: unknown): SpaceError {
  const resolved = status ?? ERROR_STATUS[code] ?? 0;
  const Class: ErrorClass =
    (ERROR_CLASSES as Record<string, ErrorClass>)[code] ?? BY_STATUS[resolved] ?? SpaceError;
  return new Class(message, { code, status: resolved, requestId, cause });
}

/** The typed error of a failed HTTP response, from its `{"error":{"code","message"}}` body or,
 * when it has none (a proxy in front of the server answered), its status line. */
export async function errorFromResponse(response: Response, what: string): Promise<SpaceError> {
  const requestId = response.headers.get("x-request-id") ?? undefined;
  const text = await response.text().catch(() => "");
  try {
    const body = JSON.parse(text) as { error?: { code?: unknown; message?: unknown } };
    if (typeof body.error?.code === "string" && typeof body.error.message === "string") {
      return apiError(body.error.code, body.error.message, response.status, requestId);
    }
  } catch {
    // Not the API's envelope: described below.
  }
  const snippet = text.length > 300 ? `${text.slice(0, 300)}…` : text;
  return apiError(
    "unknown",
    `${what} failed with HTTP ${response.status} ${response.statusText}${snippet ? `: ${snippet}` : ""} ` +
      "(not an error of the space API: is SPACE_URL the space server?)",
    response.status,
    requestId,
  );
}
