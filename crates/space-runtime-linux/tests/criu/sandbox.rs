//! Full snapshots of real sandboxes (root only; skipped without CRIU >= 4.2): a running
//! sandbox (a counter loop, a TCP connection over its lo) is dumped, restored and forked, a
//! restored copy is dumped again, and a sandbox holding 100 MiB is timed.
//!
//! Uses the real `spaced` ($SPACED_BIN or the `cargo build-spaced` output): its pid 1
//! re-executes itself from inside the sandbox, which CRIU needs.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use space_criu::{Criu, DumpOptions, DumpStats, RestoreOptions, RestoredTree};
use space_proto::AgentClient;
use space_runtime::{Runtime, SandboxHandle, SandboxId, SandboxSpec};

/// Counts in /tmp/c; written by rename so that a reader (or the frozen snapshot) never sees
/// the file truncated but not yet written.
const COUNTER: &str = "n=0; while :; do n=$((n+1)); echo $n > /tmp/c.new; mv /tmp/c.new /tmp/c; sleep 0.1; done";
/// A TCP connection over the sandbox's lo that carries a line every 0.1 s into /tmp/tcp.
// (nc ends when its stdin does: the server gets one that never ends.)
const TCP_SERVER: &str = "tail -f /dev/null | nc -l -p 7000 > /tmp/tcp";
const TCP_CLIENT: &str = "sleep 0.5; while :; do echo x; sleep 0.1; done | nc 127.0.0.1 7000";

/// The tests measure and share two cores: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Starts a sandbox on a fresh root; `prepare` may add files to the root first.
async fn start(env: &Env, prepare: impl FnOnce(&Path)) -> (SandboxHandle, PathBuf) {
    let id = SandboxId::generate();
    let rootfs = env.new_root(&id);
    prepare(&rootfs);
    let spec = SandboxSpec { id, rootfs: rootfs.clone(), hostname: "criu-test".into(), limits: limits() };
    let handle = env.rt.start(&spec).await.expect("start");
    // The checkpointable init hands the socket file to sandbox root (see space-sandbox-init).
    let rebound = std::fs::symlink_metadata(&handle.socket).is_ok_and(|m| m.uid() == 100_000);
    assert!(
        rebound,
        "{} predates the checkpointable sandbox init: run `cargo build-spaced`",
        spaced_binary().display()
    );
    (handle, rootfs)
}

/// Dumps the sandbox into `<snapshots>/<name>/criu`, snapshotting its rootfs to
/// `<snapshots>/<name>/rootfs` while it is frozen. The caller has dropped its connections.
async fn dump(
    env: &Env,
    criu: &Criu,
    pid: u32,
    rootfs: &Path,
    name: &str,
    leave_running: bool,
) -> (PathBuf, DumpStats) {
    wait_disconnected(pid).await;
    let snap = env.snapshot_dir(name);
    let mut opts = DumpOptions::new(pid, snap.join("criu"));
    opts.leave_running = leave_running;
    opts.action_script = Some(snapshot_hook(&snap, rootfs, &snap.join("rootfs")));
    let stats = criu.dump(&opts).await.unwrap_or_else(|e| panic!("dump: {e}"));
    (snap, stats)
}

/// A restored copy, known to the runtime under a new id.
struct Copy {
    handle: SandboxHandle,
    tree: RestoredTree,
    client: AgentClient,
    /// From the start of the restore to the agent's first answer.
    ready: Duration,
}

/// Restores the dump in `snap` as a new sandbox, the way the runtime would adopt it: root =
/// a writable copy of the frozen rootfs snapshot, cgroups and socket named after the new id.
async fn restore(env: &Env, criu: &Criu, snap: &Path) -> Copy {
    let id = SandboxId::generate();
    let started = Instant::now();
    let root = env.root_from_snapshot(&id, &snap.join("rootfs"));
    // A directory of the copy's own for its socket, on the run dir's filesystem (CRIU
    // re-applies the dumped mount's flags, and atime flags cannot change).
    let socket = env.rt.socket_path(&id);
    let agent_dir = socket.with_extension("sock.d");
    let mut opts = RestoreOptions::new(snap.join("criu"), root, &agent_dir, spaced_binary());
    opts.cgroup_roots = cgroup_roots(&env.rt, &id);
    let tree = criu.restore(&opts).await.unwrap_or_else(|e| panic!("restore: {e}"));
    // The runtime finds sandboxes and their sockets by `<run dir>/<id>.sock`.
    let relative = tree.socket.strip_prefix(socket.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(relative, &socket).unwrap();
    let client = AgentClient::connect_unix(&socket).await.expect("connect to the restored agent");
    client.health().await.expect("restored agent health");
    let ready = started.elapsed();
    let handle = SandboxHandle { id, pid: tree.pid, socket };
    Copy { handle, tree, client, ready }
}

async fn destroy(env: &Env, copy: Copy) {
    drop(copy.client);
    env.rt.destroy(&copy.handle.id).await.expect("destroy a restored copy");
    reap(&copy.tree.pidfd);
}

async fn counter(client: &AgentClient) -> u64 {
    let text = sh_ok(client, "cat /tmp/c").await;
    text.parse().unwrap_or_else(|_| panic!("counter {text:?}"))
}

/// Waits until the counter exceeds `above`; returns it.
async fn rising(client: &AgentClient, above: u64) -> u64 {
    eventually("the counter rises", async || Some(counter(client).await).filter(|n| *n > above)).await
}

/// Waits until more than `above` lines came over the TCP connection.
async fn tcp_rising(client: &AgentClient, above: u64) {
    eventually("lines keep coming over TCP", async || {
        let lines: u64 = sh_ok(client, "wc -l < /tmp/tcp").await.parse().ok()?;
        (lines > above).then_some(())
    })
    .await
}

fn ns(pid: u32, kind: &str) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).unwrap()
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dump_restore_and_fork_a_running_sandbox() {
    let Some(criu) = criu_or_skip("dump_restore_and_fork_a_running_sandbox") else { return };
    let _serial = SERIAL.lock().await;
    let env = Env::new("fork");
    let (handle, rootfs) = start(&env, |_| {}).await;
    let client = AgentClient::connect_unix(&handle.socket).await.expect("connect");
    let loop_pid = spawn_detached(&client, COUNTER).await;
    spawn_detached(&client, TCP_SERVER).await;
    spawn_detached(&client, TCP_CLIENT).await;
    rising(&client, 5).await;
    tcp_rising(&client, 3).await;
    drop(client);

    let (snap, stats) = dump(&env, &criu, handle.pid, &rootfs, "s1", false).await;
    eprintln!("dump of a small sandbox: {} ms, image {} KiB", ms(stats.wall), stats.image_bytes >> 10);
    env.rt.wait_exit(&handle).await; // the dump killed it
    env.rt.destroy(&handle.id).await.expect("destroy the dumped sandbox");
    let frozen: u64 = std::fs::read_to_string(snap.join("rootfs/tmp/c")).unwrap().trim().parse().unwrap();

    // The restored copy carries on: same process, counter continuing from the frozen value.
    let a = restore(&env, &criu, &snap).await;
    assert!(env.rt.is_alive(&a.handle), "the runtime does not recognise the restored sandbox");
    let first = counter(&a.client).await;
    assert!(first >= frozen, "counter restarted: {first} < {frozen}");
    rising(&a.client, first).await;
    // So does the established TCP connection.
    let frozen_tcp = std::fs::read_to_string(snap.join("rootfs/tmp/tcp")).unwrap().lines().count() as u64;
    tcp_rising(&a.client, frozen_tcp + 3).await;
    let cmdline = sh_ok(&a.client, &format!("tr '\\0' ' ' < /proc/{loop_pid}/cmdline")).await;
    assert!(cmdline.contains("while"), "pid {loop_pid} is {cmdline:?}");
    assert_eq!(sh_ok(&a.client, "hostname").await, "criu-test");
    assert_eq!(env.rt.stats(&a.handle.id).unwrap().memory_limit_bytes, limits().memory_mib << 20);
    eprintln!("restore: {} ms, agent answering after {} ms", ms(a.tree.wall), ms(a.ready));

    // Restoring the same image again forks it.
    let b = restore(&env, &criu, &snap).await;
    eprintln!("fork (second restore): {} ms, agent answering after {} ms", ms(b.tree.wall), ms(b.ready));
    assert!(counter(&b.client).await >= frozen);
    tcp_rising(&b.client, frozen_tcp + 3).await;
    for kind in ["pid", "net", "mnt", "user", "cgroup"] {
        assert_ne!(ns(a.tree.pid, kind), ns(b.tree.pid, kind), "copies share their {kind} namespace");
    }
    assert_ne!(env.rt.cgroup_dirs(&a.handle.id), env.rt.cgroup_dirs(&b.handle.id));
    sh_ok(&a.client, "echo a > /tmp/who").await;
    assert_eq!(sh_ok(&b.client, "cat /tmp/who 2>/dev/null || echo none").await, "none");
    sh_ok(&a.client, &format!("kill {loop_pid}")).await;
    let stopped = counter(&a.client).await;
    let b_now = counter(&b.client).await;
    rising(&b.client, b_now + 3).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(counter(&a.client).await, stopped, "a's counter still runs after its loop was killed");

    // A restored copy can be checkpointed again, and keeps running after a leave-running dump.
    let Copy { handle: b_handle, tree: b_tree, client: b_client, .. } = b;
    drop(b_client);
    let (_, again) = dump(&env, &criu, b_tree.pid, &env.pool().sandbox_root_path(&b_handle.id), "s2", true).await;
    eprintln!("dump of a restored copy (leave running): {} ms", ms(again.wall));
    let b_client = AgentClient::connect_unix(&b_handle.socket).await.expect("reconnect after the dump");
    rising(&b_client, counter(&b_client).await).await;

    destroy(&env, a).await;
    destroy(&env, Copy { handle: b_handle, tree: b_tree, client: b_client, ready: Duration::ZERO }).await;
}

/// Dump, restore and fork times of a sandbox holding 100 MiB of touched memory (printed, not
/// asserted: they depend on the host).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timings_with_100_mib() {
    let Some(criu) = criu_or_skip("timings_with_100_mib") else { return };
    let _serial = SERIAL.lock().await;
    let work = tempfile::tempdir().unwrap();
    let Some(hog) = build_hog(work.path()) else {
        eprintln!("SKIPPED timings_with_100_mib: cannot build a static C program (gcc -static)");
        return;
    };
    let env = Env::new("hog");
    let (handle, rootfs) = start(&env, |root| {
        std::fs::copy(&hog, root.join("tmp/hog")).unwrap();
    })
    .await;
    let client = AgentClient::connect_unix(&handle.socket).await.expect("connect");
    spawn_detached(&client, "exec /tmp/hog 100").await;
    eventually("the hog touched its memory", async || rootfs.join("tmp/hog.ready").exists().then_some(())).await;
    drop(client);

    let (snap, stats) = dump(&env, &criu, handle.pid, &rootfs, "hog", true).await;
    let a = restore(&env, &criu, &snap).await;
    let b = restore(&env, &criu, &snap).await;
    assert_eq!(sh_ok(&b.client, "cat /tmp/hog.ready").await, "ready");
    eprintln!(
        "100 MiB sandbox: dump (leave running) {} ms, image {} MiB; restore {} ms (agent answering after {} ms); \
         fork {} ms (agent after {} ms)",
        ms(stats.wall),
        stats.image_bytes >> 20,
        ms(a.tree.wall),
        ms(a.ready),
        ms(b.tree.wall),
        ms(b.ready),
    );
    destroy(&env, a).await;
    destroy(&env, b).await;
}

/// A static program that fills `argv[1]` MiB with pseudo-random bytes (no zero pages to skip),
/// writes /tmp/hog.ready and sleeps.
fn build_hog(dir: &Path) -> Option<PathBuf> {
    let source = dir.join("hog.c");
    std::fs::write(
        &source,
        "#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\n\
         int main(int argc, char **argv) {\n\
           size_t n = (size_t)atol(argc > 1 ? argv[1] : \"100\") << 20;\n\
           unsigned char *p = malloc(n); unsigned x = 12345;\n\
           if (!p) return 1;\n\
           for (size_t i = 0; i < n; i++) { x = x * 1103515245u + 12345u; p[i] = x >> 16; }\n\
           FILE *f = fopen(\"/tmp/hog.ready\", \"w\"); if (!f) return 1; fputs(\"ready\\n\", f); fclose(f);\n\
           for (;;) pause();\n\
         }\n",
    )
    .ok()?;
    let binary = dir.join("hog");
    let status = std::process::Command::new("gcc").args(["-static", "-O2", "-o"]).arg(&binary).arg(&source).status();
    status.ok()?.success().then_some(binary)
}
