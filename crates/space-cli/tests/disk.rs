//! Disk limits and a full pool, on real btrfs simple quotas (hardening item 6): a session
//! cannot write past its limit, data its snapshots still hold keeps counting, a restore does
//! not reset what it used, and a full pool is a clear 507 that loses nothing.

mod common;

use common::{Server, curl};
use serde_json::{Value, json};

const MIB: u64 = 1 << 20;

/// Runs a shell command in the session; returns (exit code, stdout and stderr).
fn sh(server: &Server, id: &str, script: &str) -> (i64, String) {
    let result = server.exec(id, &["sh", "-c", script]);
    let output =
        format!("{}{}", result["stdout"].as_str().unwrap_or_default(), result["stderr"].as_str().unwrap_or_default());
    (result["exit_code"].as_i64().unwrap_or(-1), output)
}

/// Writes `mib` MiB of zeros to `path` in the session and flushes them (quota usage is what
/// the last transaction commit counted).
fn write(server: &Server, id: &str, path: &str, mib: u64) -> (i64, String) {
    sh(
        server,
        id,
        &format!(
            "dd if=/dev/zero of={path} bs=1M count={mib} 2>&1 | grep -v records; sync; [ -s {path} ] && [ $(wc -c < {path}) = {} ]",
            mib << 20
        ),
    )
}

fn stats(server: &Server, id: &str) -> Value {
    let (status, stats) = server.call("GET", &format!("/v1/sessions/{id}/stats"), None);
    assert_eq!(status, 200, "{stats}");
    stats
}

fn used(server: &Server, id: &str) -> u64 {
    stats(server, id)["disk"]["used_bytes"].as_u64().unwrap()
}

/// Waits until the session is charged for less than `bytes`: deleted snapshots are freed by
/// the kernel's cleaner, which wakes at transaction commits (`sync` makes one).
fn wait_used_below(server: &Server, id: &str, bytes: u64) {
    let freed = (0..120).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(500));
        sh(server, id, "sync");
        used(server, id) < bytes
    });
    assert!(freed, "still charged for {bytes} bytes or more: {}", stats(server, id));
}

#[test]
fn a_session_cannot_write_past_its_disk_limit_and_others_are_unaffected() {
    let server = Server::start();
    let small = server.create_session(json!({ "disk_mib": 64 }));
    let other = server.create_session(json!({ "disk_mib": 256 }));

    let (code, out) = write(&server, &small, "/root/big", 100);
    assert_ne!(code, 0, "dd of 100 MiB into a 64 MiB session succeeded");
    assert!(out.contains("Disk quota exceeded"), "EDQUOT expected: {out}");
    let disk = stats(&server, &small)["disk"].clone();
    assert_eq!((disk["enforced"].as_bool(), disk["limit_bytes"].as_u64()), (Some(true), Some(64 * MIB)), "{disk}");
    let charged = disk["used_bytes"].as_u64().unwrap();
    assert!((50 * MIB..=64 * MIB).contains(&charged), "charged {charged} bytes for what was written");
    // Process images live outside the pool, but count: a full snapshot past the limit is refused.
    let (status, body) =
        server.call("POST", &format!("/v1/sessions/{small}/snapshots"), Some(json!({ "kind": "full" })));
    assert_eq!((status, body["error"]["code"].as_str()), (507, Some("disk_quota_exceeded")), "{body}");
    let (_, list) = server.call("GET", &format!("/v1/sessions/{small}/snapshots"), None);
    assert_eq!(list["snapshots"].as_array().map(Vec::len), Some(0), "the refused snapshot is gone: {list}");

    assert_eq!(write(&server, &other, "/root/file", 100).0, 0, "another session still writes");
    // Freeing what it wrote lets the session write again (once the refused snapshot's copy of
    // the root is gone too).
    assert_eq!(sh(&server, &small, "rm /root/big && sync").0, 0);
    wait_used_below(&server, &small, 16 * MIB);
    assert_eq!(write(&server, &small, "/root/again", 32).0, 0);
}

#[test]
fn deleted_data_a_snapshot_holds_still_counts_and_the_snapshot_shows_it() {
    let server = Server::start();
    let id = server.create_session(json!({ "disk_mib": 64 }));
    assert_eq!(write(&server, &id, "/root/kept", 40).0, 0);
    let (status, snapshot) = server.call("POST", &format!("/v1/sessions/{id}/snapshots"), Some(json!({})));
    assert_eq!(status, 201, "{snapshot}");
    let snap = snapshot["id"].as_str().unwrap();
    assert_eq!(sh(&server, &id, "rm /root/kept && sync").0, 0);

    let (status, one) = server.call("GET", &format!("/v1/sessions/{id}/snapshots/{snap}"), None);
    assert_eq!(status, 200, "{one}");
    let exclusive = one["exclusive_bytes"].as_u64().unwrap();
    assert!(exclusive >= 40 * MIB, "the snapshot alone holds the deleted file: {one}");
    assert!(used(&server, &id) >= 40 * MIB, "still charged to the session");
    let (code, out) = write(&server, &id, "/root/more", 40);
    assert!(code != 0 && out.contains("Disk quota exceeded"), "40 + 40 MiB do not fit in 64 MiB: {out}");

    // Deleting the snapshot frees it, once the kernel's cleaner has dropped it (it wakes at
    // transaction commits, which `sync` makes).
    assert_eq!(server.call("DELETE", &format!("/v1/sessions/{id}/snapshots/{snap}"), None).0, 204);
    wait_used_below(&server, &id, 40 * MIB);
}

/// The pool's level-1 qgroups (one per session that had a root here), as of a fresh commit.
fn session_groups(server: &Server) -> Vec<String> {
    let pool = server.data_dir.join("pool");
    assert!(std::process::Command::new("sync").arg("-f").arg(&pool).status().unwrap().success());
    let out = std::process::Command::new("btrfs").args(["qgroup", "show", "-c", "--raw"]).arg(&pool).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines().filter(|l| l.starts_with("1/")).map(str::to_owned).collect()
}

#[test]
fn a_destroyed_sessions_quota_group_is_removed_in_the_background() {
    let server = Server::start();
    let id = server.create_session(json!({ "disk_mib": 64 }));
    assert_eq!(write(&server, &id, "/root/data", 8).0, 0);
    let before = session_groups(&server);
    assert_eq!(before.len(), 1, "one group, the session's: {before:?}");
    assert_eq!(server.call("DELETE", &format!("/v1/sessions/{id}"), None).0, 200);
    // The node deletes the root, the kernel's cleaner drops it, then the node's next sweep
    // (every few seconds) removes what is left unused.
    let removed = (0..120).any(|_| {
        std::thread::sleep(std::time::Duration::from_secs(1));
        session_groups(&server).is_empty()
    });
    assert!(removed, "still there: {:?}", session_groups(&server));
}

#[test]
fn a_restore_does_not_reset_what_the_session_used() {
    let server = Server::start();
    let id = server.create_session(json!({ "disk_mib": 64 }));
    assert_eq!(write(&server, &id, "/root/a", 40).0, 0);
    let (status, snapshot) = server.call("POST", &format!("/v1/sessions/{id}/snapshots"), Some(json!({})));
    assert_eq!(status, 201, "{snapshot}");
    let (status, restored) =
        server.call("POST", &format!("/v1/sessions/{id}/restore"), Some(json!({ "snapshot": snapshot["id"] })));
    assert_eq!(status, 200, "{restored}");
    let (code, out) = write(&server, &id, "/root/b", 40);
    assert!(code != 0 && out.contains("Disk quota exceeded"), "the new root started from zero: {out}");
}

#[test]
fn a_full_pool_is_a_507_that_loses_nothing() {
    let server = Server::start_with(&["--pool-size-gib", "2", "--default-disk-gib", "0"]);
    let filler = server.create_session(json!({}));
    let writer = server.create_session(json!({}));
    let (code, out) = write(&server, &filler, "/root/fill", 4096);
    assert!(code != 0 && out.contains("No space left on device"), "ENOSPC expected: {out}");

    let upload = |path: &str| {
        let url = format!("{}/v1/sessions/{writer}/files/content?path={path}", server.url);
        let out =
            curl(&["-s", "-w", "\n%{http_code}", "-X", "PUT", "-H", &server.auth(), "--data-binary", "@/bin/sh", &url]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.parse::<u16>().unwrap_or(0), serde_json::from_str::<Value>(body).unwrap_or(Value::Null))
    };
    let (status, body) = upload("/root/sh");
    assert_eq!((status, body["error"]["code"].as_str()), (507, Some("storage_full")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("delete snapshots"), "{body}");
    // A create either fits in btrfs's reserve or is the same 507; never a stall or another 5xx.
    let (status, body) = server.call("POST", "/v1/sessions", Some(json!({})));
    assert!(status == 201 || (status == 507 && body["error"]["code"] == "storage_full"), "{status} {body}");

    assert_eq!(sh(&server, &filler, "rm /root/fill && sync").0, 0);
    let (status, body) = upload("/root/sh");
    assert_eq!(status, 200, "the pool has room again: {body}");
    let size = std::fs::metadata("/bin/sh").unwrap().len();
    assert_eq!(sh(&server, &writer, "wc -c < /root/sh"), (0, format!("{size}\n")), "the upload arrived whole");
}
