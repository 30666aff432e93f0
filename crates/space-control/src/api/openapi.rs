//! What the OpenAPI document says beyond each handler's annotation, applied to every
//! operation alike so that no route can miss it: the errors it may answer (each status with
//! the codes it stands for and an example body), the messages of the WebSocket routes, and
//! examples of the main request bodies. The result must pass a real validator
//! (`openapi-spec-validator`, run by `scripts/test.sh`).

use std::collections::BTreeMap;

use serde_json::{Value, json};
use space_api::ErrorCode;
use utoipa::openapi::path::{Operation, ParameterIn, PathItem};
use utoipa::openapi::schema::Schema;
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, RefOr, ResponseBuilder};

/// The bearer API key every route but `/v1/health` takes.
pub(super) struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Error responses, WebSocket messages and examples (see the module doc).
pub(super) struct Documented;

impl utoipa::Modify for Documented {
    fn modify(&self, openapi: &mut OpenApi) {
        let codes = codes_by_status(openapi);
        describe_error_codes(openapi, &codes);
        for (path, item) in openapi.paths.paths.iter_mut() {
            for (method, operation) in operations(item) {
                add_errors(path, method, operation, &codes);
                describe_errors(operation, &codes);
                if let Some(example) = operation.operation_id.as_deref().and_then(request_example) {
                    add_request_example(operation, example);
                }
                if let Some(messages) = operation.operation_id.as_deref().and_then(websocket_messages) {
                    let extensions = operation.extensions.get_or_insert_with(Default::default);
                    extensions.insert("x-websocket".into(), messages);
                }
            }
        }
        if let Some(RefOr::T(Schema::Object(start))) =
            openapi.components.as_mut().and_then(|c| c.schemas.get_mut("ExecStart"))
        {
            start.example = Some(json!({ "cmd": ["bash", "-l"], "tty": { "rows": 24, "cols": 80 }, "stdin": true }));
        }
    }
}

fn operations(item: &mut PathItem) -> impl Iterator<Item = (&'static str, &mut Operation)> {
    [
        ("get", item.get.as_mut()),
        ("put", item.put.as_mut()),
        ("post", item.post.as_mut()),
        ("delete", item.delete.as_mut()),
        ("patch", item.patch.as_mut()),
    ]
    .into_iter()
    .filter_map(|(method, operation)| Some((method, operation?)))
}

/// Every error code by the HTTP status it is answered with, read from the `ErrorCode`
/// schema (so a code added to the enum is listed without touching this file).
fn codes_by_status(openapi: &OpenApi) -> BTreeMap<u16, Vec<String>> {
    let mut by_status: BTreeMap<u16, Vec<String>> = BTreeMap::new();
    let schema = openapi.components.as_ref().and_then(|c| c.schemas.get("ErrorCode"));
    let Some(RefOr::T(Schema::Object(schema))) = schema else { return by_status };
    for value in schema.enum_values.iter().flatten() {
        if let (Some(name), Ok(code)) = (value.as_str(), serde_json::from_value::<ErrorCode>(value.clone())) {
            by_status.entry(code.http_status()).or_default().push(name.to_owned());
        }
    }
    by_status
}

fn describe_error_codes(openapi: &mut OpenApi, codes: &BTreeMap<u16, Vec<String>>) {
    let schema = openapi.components.as_mut().and_then(|c| c.schemas.get_mut("ErrorCode"));
    let Some(RefOr::T(Schema::Object(schema))) = schema else { return };
    let statuses: Vec<String> = codes.iter().map(|(status, names)| format!("{status}: {}", names.join(", "))).collect();
    schema.description = Some(format!(
        "Stable machine-readable error codes; never renamed once released. Each is answered with one HTTP \
         status: {}.",
        statuses.join("; ")
    ));
}

/// The statuses every operation of its kind may answer besides those its annotation lists:
/// 400 when it reads input, 401 unless it is public, 404 when its path names something,
/// 503 when it needs the node, 500 always.
fn add_errors(path: &str, method: &str, operation: &mut Operation, codes: &BTreeMap<u16, Vec<String>>) {
    let queried = operation.parameters.iter().flatten().any(|p| matches!(p.parameter_in, ParameterIn::Query));
    // A path parameter that must parse (a pid) is refused with 400 too.
    let reads_input = operation.request_body.is_some()
        || queried
        || path.contains("{pid}")
        || websocket_messages(operation.operation_id.as_deref().unwrap_or_default()).is_some();
    let public = path == "/v1/health";
    let on_node = path.starts_with("/v1/sessions/{id}/")
        && (method != "get" || ["/exec", "/files", "/processes", "/watch", "/stats"].iter().any(|p| path.contains(p)));
    let wanted = [
        (400, reads_input),
        (401, !public),
        (404, path.contains('{')),
        (500, true),
        (503, on_node || (path == "/v1/sessions" && method == "post")),
    ];
    for (status, _) in wanted.into_iter().filter(|(_, wanted)| *wanted) {
        let key = status.to_string();
        if !operation.responses.responses.contains_key(&key) && codes.contains_key(&status) {
            operation.responses.responses.insert(key, RefOr::T(ResponseBuilder::new().build()));
        }
    }
}

/// Gives every error response the `ErrorBody` schema, a description naming the codes of its
/// status, and an example body.
fn describe_errors(operation: &mut Operation, codes: &BTreeMap<u16, Vec<String>>) {
    for (status, response) in operation.responses.responses.iter_mut() {
        let (Ok(status), RefOr::T(response)) = (status.parse::<u16>(), response) else { continue };
        let Some(names) = codes.get(&status).filter(|_| status >= 400) else { continue };
        let (code, message) = error_example(status, names);
        if response.description.is_empty() {
            let list: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
            response.description =
                format!("{}: `error.code` is {}; `error.message` says what to do.", reason(status), list.join(" or "));
        }
        let content = ContentBuilder::new()
            .schema(Some(Ref::from_schema_name("ErrorBody")))
            .example(Some(json!({ "error": { "code": code, "message": message } })))
            .build();
        response.content.insert("application/json".into(), content);
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        400 => "Bad request",
        401 => "No valid API key",
        403 => "Forbidden",
        404 => "Not found",
        408 => "The request body stopped arriving",
        409 => "Conflict with the current state",
        413 => "Too large",
        429 => "A limit was reached",
        501 => "Not available on this server",
        503 => "The sandbox or node could not do it",
        504 => "Timed out",
        507 => "Out of disk space",
        _ => "Server error",
    }
}

/// A code of `status` and a message like the server's, for the example body.
fn error_example(status: u16, names: &[String]) -> (String, &'static str) {
    let message = match status {
        400 => "the request body is not valid JSON: expected `,` or `}` at line 1 column 12",
        401 => "missing or unknown API key; send `Authorization: Bearer <key>`",
        403 => "this call needs the admin key",
        404 => "session ses_4hd8w2m0c9xq7j1f5k3z not found",
        408 => "the request body stopped arriving; send it without pausing for 60 s",
        409 => "session ses_4hd8w2m0c9xq7j1f5k3z is paused; only running sessions accept this call",
        413 => "the JSON body is larger than 1 MiB; upload files with PUT …/files/content",
        429 => "session ses_4hd8w2m0c9xq7j1f5k3z has 8 watches open, the most it may; close one first",
        501 => "full snapshots need CRIU 4.2 or newer on the node: run scripts/install-criu.sh and restart",
        503 => "the sandbox could not be reached: its agent did not answer; try again",
        504 => "the command did not finish in time",
        507 => "session ses_4hd8w2m0c9xq7j1f5k3z reached its disk limit of 1024 MiB: delete files or snapshots",
        _ => "internal error; the server's log has the details",
    };
    let preferred = ["bad_request", "not_found", "invalid_state", "internal", "disk_quota_exceeded"];
    let code = names.iter().find(|n| preferred.contains(&n.as_str())).or(names.first());
    (code.cloned().unwrap_or_default(), message)
}

fn add_request_example(operation: &mut Operation, example: Value) {
    if let Some(content) = operation.request_body.as_mut().and_then(|b| b.content.get_mut("application/json")) {
        content.example = Some(example);
    }
}

/// Examples of the main request bodies, by operation id (each is checked to parse as its
/// request type in the tests below).
fn request_example(operation_id: &str) -> Option<Value> {
    Some(match operation_id {
        "create_session" => json!({
            "template": "debian",
            "cpus": 2,
            "memory_mib": 2048,
            "env": { "PYTHONUNBUFFERED": "1" },
            "idle_timeout_secs": 900,
            "network": { "allow": ["pypi.org", "files.pythonhosted.org"] },
            "grants": ["github"]
        }),
        "update_session" => json!({ "idle_timeout_secs": 600, "max_age_secs": 0 }),
        "exec" => json!({ "cmd": ["python3", "-c", "print(6 * 7)"], "cwd": "/root", "timeout_ms": 30000 }),
        "signal_process" => json!({ "signal": 15 }),
        "mkdir" => json!({ "path": "/root/work" }),
        "move_path" => json!({ "from": "/root/draft.txt", "to": "/root/final.txt" }),
        "create_snapshot" => json!({ "kind": "full", "name": "before-migration" }),
        "restore" => json!({ "snapshot": "snap_7tq2n5x0b8kd3m1w9c4e" }),
        "fork" => json!({ "count": 3 }),
        "create_credential" => json!({
            "name": "github",
            "hosts": ["api.github.com"],
            "header": "Authorization: Bearer {secret}",
            "value": "ghp_example0000000000000000000000000000",
            "placeholder_env": "GITHUB_TOKEN"
        }),
        "update_credential" => json!({ "value": "ghp_rotated000000000000000000000000000" }),
        "update_network" => json!({ "allow": ["api.openai.com"], "ports": [443] }),
        "grant" => json!({ "credential": "github" }),
        "create_key" => json!({ "tenant": "team-a" }),
        "set_pool_size" => json!({ "size": 8, "runtime": "linux" }),
        "import_template" => json!({ "name": "python", "path": "/srv/roots/python.tar" }),
        "build_template" => json!({ "name": "debian" }),
        "tunnel" => json!({
            "client": { "binary": "bytes to the sandbox's port" },
            "server": { "binary": "bytes from the sandbox's port" }
        }),
        _ => return None,
    })
}

/// The message schemas of a WebSocket route, as the `x-websocket` extension: what the client
/// sends (`client`) and what the server sends (`server`), text frames as JSON of the schemas
/// named, binary frames as described.
fn websocket_messages(operation_id: &str) -> Option<Value> {
    let schema = |name: &str| json!({ "$ref": format!("#/components/schemas/{name}") });
    let output = "binary frames: one byte naming the stream (1 stdout, 2 stderr), then the bytes";
    Some(match operation_id {
        "exec_ws" => json!({
            "client": { "first": schema("ExecStart"), "text": schema("WsClientMessage"), "binary": "stdin bytes" },
            "server": { "text": schema("WsServerMessage"), "binary": output }
        }),
        "attach_ws" => json!({
            "client": { "text": schema("WsClientMessage"), "binary": "stdin bytes" },
            "server": { "text": schema("WsServerMessage"), "binary": output }
        }),
        "watch_ws" => json!({
            "client": { "text": "nothing (pings keep the socket open)" },
            "server": { "text": schema("WatchEvent"), "error": schema("WsServerMessage") }
        }),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use serde::de::DeserializeOwned;
    use space_api::egress::{CreateCredentialRequest, GrantRequest, NetworkPolicyUpdate, UpdateCredentialRequest};
    use space_api::*;

    use super::*;

    fn parses<T: DeserializeOwned>(operation_id: &str) {
        let example = request_example(operation_id).unwrap_or_else(|| panic!("no example for {operation_id}"));
        if let Err(e) = serde_json::from_value::<T>(example.clone()) {
            panic!("the example of {operation_id} does not parse: {e}: {example}");
        }
    }

    /// Examples that the server would refuse would mislead every client generated from them.
    #[test]
    fn request_examples_parse_as_their_request_types() {
        parses::<CreateSessionRequest>("create_session");
        parses::<UpdateSessionRequest>("update_session");
        parses::<ExecRequest>("exec");
        parses::<SignalRequest>("signal_process");
        parses::<PathRequest>("mkdir");
        parses::<MoveRequest>("move_path");
        parses::<CreateSnapshotRequest>("create_snapshot");
        parses::<RestoreRequest>("restore");
        parses::<ForkRequest>("fork");
        parses::<CreateCredentialRequest>("create_credential");
        parses::<UpdateCredentialRequest>("update_credential");
        parses::<NetworkPolicyUpdate>("update_network");
        parses::<GrantRequest>("grant");
        parses::<CreateKeyRequest>("create_key");
        parses::<SetPoolSizeRequest>("set_pool_size");
        parses::<ImportTemplateRequest>("import_template");
        parses::<BuildTemplateRequest>("build_template");
    }

    /// What the tools that read the document rely on, beyond what a validator checks.
    #[test]
    fn the_document_declares_parameters_errors_and_websocket_messages() {
        let doc: Value = serde_json::from_str(&super::super::openapi_json()).unwrap();
        let schemas = &doc["components"]["schemas"];
        for name in ["WsClientMessage", "WsServerMessage", "WatchEvent", "ExecStart", "ErrorBody", "ErrorCode"] {
            assert!(schemas.get(name).is_some(), "{name} is not in components");
        }
        let codes = schemas["ErrorCode"]["enum"].as_array().unwrap();
        assert!(codes.iter().any(|c| c == "invalid_state") && codes.len() > 20, "{codes:?}");
        let mut examples = 0;
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let id = op["operationId"].as_str().unwrap();
                for param in op["parameters"].as_array().into_iter().flatten() {
                    let name = param["name"].as_str().unwrap();
                    let in_path = path.contains(&format!("{{{name}}}"));
                    assert_eq!(param["in"], if in_path { "path" } else { "query" }, "{method} {path} {name}");
                }
                for (status, response) in op["responses"].as_object().unwrap() {
                    if status.parse::<u16>().unwrap() >= 400 {
                        let schema = &response["content"]["application/json"]["schema"]["$ref"];
                        assert_eq!(schema, "#/components/schemas/ErrorBody", "{method} {path} {status}");
                        assert!(!response["description"].as_str().unwrap().is_empty(), "{method} {path} {status}");
                    }
                }
                if path != "/v1/health" {
                    assert!(op["responses"].get("401").is_some(), "{method} {path} lists no 401");
                }
                if id.ends_with("_ws") {
                    assert!(op["responses"].get("101").is_some() && op.get("x-websocket").is_some(), "{id}");
                }
                examples += op["requestBody"]["content"]["application/json"].get("example").is_some() as usize;
            }
        }
        assert!(examples >= 17, "{examples} request examples");
    }
}
