//! How tool arguments map onto API requests.

use serde_json::{Value, json};

use super::*;

const SES: &str = "ses_0123456789abcdefghij";
const SNAP: &str = "snap_0123456789abcdefghij";

fn args(value: Value) -> JsonObject {
    value.as_object().expect("an object").clone()
}

fn parsed<T: DeserializeOwned>(value: Value) -> T {
    parse(args(value)).unwrap_or_else(|e| panic!("{e}"))
}

fn refusal<T: DeserializeOwned + std::fmt::Debug>(value: Value) -> String {
    let e = parse::<T>(args(value)).expect_err("refused");
    assert_eq!(e.code(), "bad_request");
    e.to_string()
}

#[test]
fn create_session_maps_allow_env_and_timeouts_onto_the_request() {
    let p: CreateSessionParams = parsed(json!({
        "template": "busybox", "runtime": "vm", "allow": ["pypi.org", "*.github.com"],
        "env": {"A": "1"}, "idle_timeout_secs": 600, "memory_mib": 1024
    }));
    let request = p.request();
    assert_eq!(request.template.as_deref(), Some("busybox"));
    assert_eq!(request.runtime, Some(RuntimeKind::Vm));
    assert_eq!(request.network.expect("a policy").allow, ["pypi.org", "*.github.com"]);
    assert_eq!(request.env.get("A").map(String::as_str), Some("1"));
    assert_eq!((request.idle_timeout_secs, request.memory_mib, request.cpus), (Some(600), Some(1024), None));
}

#[test]
fn create_session_without_arguments_takes_the_servers_defaults() {
    let request = parsed::<CreateSessionParams>(json!({})).request();
    assert!(request.template.is_none() && request.runtime.is_none());
    // No `network` at all: the server's default, deny all.
    assert!(request.network.is_none());
    let body = serde_json::to_value(&request).unwrap();
    assert_eq!(body["network"], Value::Null);
}

#[test]
fn misspelled_or_mistyped_arguments_are_refused_with_what_is_wrong() {
    let e = refusal::<CreateSessionParams>(json!({"templ": "busybox"}));
    assert!(e.contains("unknown field `templ`"), "{e}");
    let e = refusal::<CreateSessionParams>(json!({"runtime": "docker"}));
    assert!(e.contains("docker"), "{e}");
    let e = refusal::<RunCommandParams>(json!({"command": "ls"}));
    assert!(e.contains("session_id"), "{e}");
}

#[test]
fn a_command_string_runs_in_sh_and_an_array_as_argv() {
    let p: RunCommandParams = parsed(json!({"session_id": SES, "command": "echo hi | tr a-z A-Z"}));
    let (path, request, max) = p.request().unwrap();
    assert_eq!(path, format!("/v1/sessions/{SES}/exec"));
    assert_eq!(request.cmd, ["sh", "-c", "echo hi | tr a-z A-Z"]);
    assert_eq!(max, DEFAULT_MAX_OUTPUT);
    let p: RunCommandParams = parsed(json!({"session_id": SES, "command": ["ls", "-la", "/tmp dir"]}));
    assert_eq!(p.request().unwrap().1.cmd, ["ls", "-la", "/tmp dir"]);
}

#[test]
fn empty_commands_are_refused() {
    for command in [json!(""), json!("  "), json!([]), json!([""])] {
        let p: RunCommandParams = parsed(json!({"session_id": SES, "command": command}));
        let e = p.request().expect_err("refused");
        assert!(e.to_string().contains("command is empty"), "{e}");
    }
}

#[test]
fn run_command_passes_cwd_env_stdin_and_converts_the_timeout() {
    let p: RunCommandParams = parsed(json!({
        "session_id": SES, "command": "cat", "cwd": "/tmp", "env": {"K": "V"}, "stdin": "input",
        "timeout_secs": 5, "max_output_bytes": 10_000_000
    }));
    let (_, request, max) = p.request().unwrap();
    assert_eq!(request.cwd.as_deref(), Some("/tmp"));
    assert_eq!(request.env.get("K").map(String::as_str), Some("V"));
    assert_eq!(request.stdin.as_deref(), Some("input"));
    assert_eq!(request.timeout_ms, Some(5000));
    assert!(!request.background);
    assert_eq!(max, MAX_OUTPUT, "capped");
}

#[test]
fn timeouts_default_to_a_minute_in_the_foreground_and_none_in_the_background() {
    let timeout = |extra: Value| {
        let mut value = json!({"session_id": SES, "command": "true"});
        value.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        parsed::<RunCommandParams>(value).request().unwrap().1.timeout_ms
    };
    assert_eq!(timeout(json!({})), Some(DEFAULT_TIMEOUT_SECS * 1000));
    assert_eq!(timeout(json!({"timeout_secs": 0})), None);
    assert_eq!(timeout(json!({"background": true})), None);
    assert_eq!(timeout(json!({"background": true, "timeout_secs": 30})), Some(30_000));
    assert_eq!(timeout(json!({"timeout_secs": u64::MAX})), Some(u64::MAX), "saturates");
}

#[test]
fn session_ids_are_checked_before_they_reach_a_url() {
    for id in ["", "ses_x", "../keys", "ses_0123456789abcdefghij/../../keys", "snap_0123456789abcdefghij"] {
        let e = session_path(id, "/exec").expect_err(id);
        assert_eq!(e.code(), "bad_request");
        assert!(e.to_string().contains("not a valid session id"), "{e}");
    }
    assert_eq!(session_path(SES, "").unwrap(), format!("/v1/sessions/{SES}"));
}

#[test]
fn file_paths_are_percent_encoded_in_the_query() {
    let p: ReadFileParams = parsed(json!({"session_id": SES, "path": "/tmp/a b&c=d.txt"}));
    let (path, max) = p.request().unwrap();
    assert_eq!(path, format!("/v1/sessions/{SES}/files/content?path=/tmp/a%20b%26c%3Dd.txt"));
    assert_eq!(max, DEFAULT_MAX_READ);
    let p: ListFilesParams = parsed(json!({"session_id": SES}));
    assert_eq!(p.request().unwrap(), format!("/v1/sessions/{SES}/files/list?path=/"));
}

#[test]
fn write_file_takes_text_or_base64_and_a_mode() {
    let p: WriteFileParams = parsed(json!({"session_id": SES, "path": "/a.sh", "content": "echo é\n", "mode": "755"}));
    let (path, body) = p.request().unwrap();
    assert_eq!(path, format!("/v1/sessions/{SES}/files/content?path=/a.sh&mode=755"));
    assert_eq!(body, "echo é\n".as_bytes());
    let p: WriteFileParams = parsed(json!({"session_id": SES, "path": "/b", "content": "/wCA", "encoding": "base64"}));
    assert_eq!(p.request().unwrap().1, [0xff, 0x00, 0x80]);
    let p: WriteFileParams = parsed(json!({"session_id": SES, "path": "/b", "content": "%%%", "encoding": "base64"}));
    assert!(p.request().unwrap_err().to_string().contains("not valid base64"));
}

#[test]
fn snapshot_defaults_to_disk_and_keeps_a_name() {
    let (path, request) = parsed::<SnapshotParams>(json!({"session_id": SES})).request().unwrap();
    assert_eq!(path, format!("/v1/sessions/{SES}/snapshots"));
    assert_eq!((request.kind, request.name), (Some(SnapshotKind::Disk), None));
    let (_, request) =
        parsed::<SnapshotParams>(json!({"session_id": SES, "kind": "full", "name": "before"})).request().unwrap();
    assert_eq!((request.kind, request.name.as_deref()), (Some(SnapshotKind::Full), Some("before")));
}

#[test]
fn restore_and_fork_take_snapshot_ids() {
    let (path, request) = parsed::<RestoreParams>(json!({"session_id": SES, "snapshot_id": SNAP})).request().unwrap();
    assert_eq!((path, request.snapshot.as_str()), (format!("/v1/sessions/{SES}/restore"), SNAP));
    let e = parsed::<RestoreParams>(json!({"session_id": SES, "snapshot_id": "x"})).request().unwrap_err();
    assert!(e.to_string().contains("not a valid snapshot id"), "{e}");

    let (path, request) = parsed::<ForkParams>(json!({"session_id": SES})).request().unwrap();
    assert_eq!((path, request.count, request.from), (format!("/v1/sessions/{SES}/fork"), Some(1), None));
    let (_, request) =
        parsed::<ForkParams>(json!({"session_id": SES, "count": 3, "from_snapshot_id": SNAP})).request().unwrap();
    assert_eq!((request.count, request.from.map(String::from)), (Some(3), Some(SNAP.to_owned())));
}

#[test]
fn expose_port_posts_public_to_the_ports_endpoint() {
    let (path, body) = parsed::<ExposePortParams>(json!({"session_id": SES, "port": 8000})).request().unwrap();
    assert_eq!((path, body), (format!("/v1/sessions/{SES}/ports/8000"), ExposePortRequest { public: false }));
    let (_, body) =
        parsed::<ExposePortParams>(json!({"session_id": SES, "port": 1, "public": true})).request().unwrap();
    assert_eq!(serde_json::to_value(body).unwrap(), json!({"public": true}));
    for port in [0, 65536] {
        let e = parsed::<ExposePortParams>(json!({"session_id": SES, "port": port})).request().unwrap_err();
        assert!(e.to_string().contains("not a TCP port"), "{e}");
    }
}

#[test]
fn list_sessions_can_include_destroyed_ones() {
    assert_eq!(parsed::<ListSessionsParams>(json!({})).path(), "/v1/sessions?all=false");
    assert_eq!(parsed::<ListSessionsParams>(json!({"include_destroyed": true})).path(), "/v1/sessions?all=true");
}

#[test]
fn schemas_describe_every_argument_for_the_model() {
    let schema = rmcp::handler::server::common::schema_for_type::<RunCommandParams>();
    let properties = schema["properties"].as_object().expect("properties");
    for (name, property) in properties {
        assert!(property.get("description").is_some_and(|d| d.as_str().is_some_and(|d| d.len() > 10)), "{name}");
    }
    assert_eq!(schema["required"], json!(["session_id", "command"]));
    assert_eq!(schema["additionalProperties"], json!(false));
    let command = serde_json::to_string(&properties["command"]).unwrap();
    assert!(command.contains("\"string\"") && command.contains("\"array\""), "{command}");
}
