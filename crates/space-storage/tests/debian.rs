//! The debian built-in. Downloads (~40 s) unless the cache exists, so it only runs with
//! SPACE_TEST_DEBIAN=1 (and as root).

mod common;

use std::cell::RefCell;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use common::{TestPool, owner, percentiles};
use space_api::SandboxId;
use space_storage::{DEFAULT_TEMPLATE_CACHE_DIR, Progress, SandboxIdentity, no_progress};

#[test]
fn debian_template_builds_caches_and_runs() {
    if std::env::var("SPACE_TEST_DEBIAN").as_deref() != Ok("1") {
        eprintln!("SKIPPED debian: set SPACE_TEST_DEBIAN=1 to run (downloads from deb.debian.org)");
        return;
    }
    let Some(t) = TestPool::new("debian") else {
        return;
    };
    let store = t.pool().templates();
    let cache = Path::new(DEFAULT_TEMPLATE_CACHE_DIR).join(space_storage::debian_cache_file());
    let cached = cache.exists();
    let reports = RefCell::new(Vec::<Progress>::new());
    let start = Instant::now();
    let info = store.build_builtin("debian", None, &|p| reports.borrow_mut().push(p)).unwrap();
    eprintln!(
        "debian build ({}): {:?}, {} MB",
        if cached { "from cache" } else { "debootstrap" },
        start.elapsed(),
        info.size_bytes >> 20
    );
    let phases: Vec<String> = reports.borrow().iter().map(|p| p.phase.clone()).collect();
    let expected = if cached { "extracting" } else { "configuring packages" };
    assert!(phases.iter().any(|p| p == expected), "{phases:?}");
    assert!(cache.is_file(), "cache written");

    let root = store.path(&info).unwrap();
    assert_eq!(owner(&root.join("usr/bin/bash")), (100_000, 100_000));
    assert!(root.join("usr/bin/python3").exists());
    assert!(!root.join("etc/hostname").exists());
    let out =
        Command::new("chroot").arg(&root).args(["/usr/bin/python3", "-c", "import ssl; print('ok')"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n", "{}", String::from_utf8_lossy(&out.stderr));

    // Snapshots of a 400 MB tree are as fast as of busybox.
    let ids: Vec<SandboxId> = (0..20).map(|_| SandboxId::generate()).collect();
    let mut times = Vec::new();
    for id in &ids {
        let start = Instant::now();
        let identity = SandboxIdentity { hostname: "deb".into(), nameserver: None };
        t.pool().create_sandbox_root(id, &info, identity).unwrap();
        times.push(start.elapsed().as_micros());
    }
    let (p50, p90) = percentiles(times);
    eprintln!("create_sandbox_root (debian, 20 runs): p50 {p50} us, p90 {p90} us");
    for id in &ids {
        t.pool().delete_sandbox_root(id).unwrap();
    }

    // A second build comes from the cache in seconds.
    let start = Instant::now();
    let again = store.build_builtin("debian", None, &no_progress).unwrap();
    eprintln!("debian rebuild from cache: {:?}", start.elapsed());
    assert_eq!(again.version, 2);
    assert!(again.source.contains("cache"));
}
