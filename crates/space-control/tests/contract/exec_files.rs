//! Exec and files through the control plane's real agent client, answered by the simulated
//! agent: exit codes, output, and the file errors' codes.

use serde_json::json;

use crate::harness::{Server, assert_error};

#[tokio::test]
async fn exec_reports_output_and_exit_codes() {
    let server = Server::start().await;
    let id = server.session().await;
    let (status, r) = server.exec(&id, &["echo", "hello", "world"]).await;
    assert_eq!((status, r["stdout"].as_str(), r["exit_code"].as_i64()), (200, Some("hello world\n"), Some(0)), "{r}");
    assert_eq!(server.exec(&id, &["true"]).await.1["exit_code"], 0);
    assert_eq!(server.exec(&id, &["false"]).await.1["exit_code"], 1);
    let (status, missing) = server.exec(&id, &["no-such-program"]).await;
    assert_eq!((status, missing["exit_code"].as_i64()), (200, Some(127)), "like a shell: {missing}");
    assert!(missing["stderr"].as_str().is_some_and(|e| e.contains("no-such-program")), "{missing}");
    let (_, processes) = server.call("GET", &format!("/v1/sessions/{id}/processes"), None).await;
    assert!(processes["processes"].as_array().is_some_and(|p| !p.is_empty()), "{processes}");
}

#[tokio::test]
async fn files_round_trip_and_their_errors_have_codes() {
    let server = Server::start().await;
    let id = server.session().await;
    server.write_file(&id, "/tmp/a", "contents").await;
    assert_eq!(server.read_file(&id, "/tmp/a").await, "contents");
    assert_eq!(server.exec(&id, &["cat", "/tmp/a"]).await.1["stdout"], "contents", "exec sees it");
    let (status, stat) = server.call("GET", &format!("/v1/sessions/{id}/files/stat?path=/tmp/a"), None).await;
    assert_eq!((status, stat["size"].as_u64()), (200, Some(8)), "{stat}");

    let mkdir = server.act(&id, "files/mkdir", json!({ "path": "/tmp/d/e" })).await;
    assert!(mkdir.0 < 300, "{mkdir:?}");
    server.write_file(&id, "/tmp/d/e/f", "x").await;
    let (_, list) = server.call("GET", &format!("/v1/sessions/{id}/files/list?path=/tmp"), None).await;
    let names: Vec<&str> = list["entries"].as_array().unwrap().iter().filter_map(|e| e["name"].as_str()).collect();
    assert_eq!(names, ["a", "d"], "{list}");
    let moved = server.act(&id, "files/move", json!({ "from": "/tmp/a", "to": "/tmp/b" })).await;
    assert!(moved.0 < 300, "{moved:?}");
    assert_eq!(server.read_file(&id, "/tmp/b").await, "contents");

    let files = format!("/v1/sessions/{id}/files");
    assert_error(&server.call("GET", &format!("{files}/content?path=/tmp/a"), None).await, 404, "file_not_found");
    assert_error(&server.call("GET", &format!("{files}/list?path=/tmp/b"), None).await, 400, "not_a_directory");
    assert_error(&server.call("DELETE", &format!("{files}?path=/tmp/d"), None).await, 400, "directory_not_empty");
    let removed = server.call("DELETE", &format!("{files}?path=/tmp/d&recursive=true"), None).await;
    assert!(removed.0 < 300, "{removed:?}");
    assert_error(&server.call("GET", &format!("{files}/stat?path=/tmp/d"), None).await, 404, "file_not_found");
    assert_error(&server.call("GET", &format!("{files}/content?nopath=1"), None).await, 400, "bad_request");
}
