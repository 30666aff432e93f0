//! Warm pods from a template (root only; see tests/common): the template's RAM in a sealed
//! memfd, pods mapping it private. The guest's spaced must know `Request::Reseed`.

mod common;

use std::io::Read;
use std::os::fd::AsRawFd;
use std::time::Instant;

use common::*;
use space_runtime::Limits;
use space_runtime_vm::{STATE_FILE, TemplateState, VmError, VmSpec};

/// A pod's spec: a copy of the template's disk, the template's memory.
fn pod_spec(t: &TestRuntime, template_disk: &std::path::Path) -> VmSpec {
    VmSpec {
        hostname: String::new(),
        limits: Limits { memory_mib: 0, millicpus: 1000, pids: 0 },
        ..t.spec(template_disk, 0)
    }
}

/// A digest of the template's memory (FNV-1a over every byte).
fn digest(template: &TemplateState) -> u64 {
    let path = format!("/proc/self/fd/{}", template.memory().as_raw_fd());
    let mut file = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    loop {
        let n = file.read(&mut buf).unwrap();
        if n == 0 {
            return hash;
        }
        for b in &buf[..n] {
            hash = (hash ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
}

#[tokio::test]
async fn pods_start_from_a_template_and_never_change_it() {
    let t = TestRuntime::new("pods_start_from_a_template_and_never_change_it");
    let image = busybox_image(t.dir.path());
    let spec = t.spec(&image, 256);
    let dir = t.dir.path().join("template");
    let template = t.rt.make_template_state(&spec, &dir).await.expect("template");
    assert_gone(&t.rt, &spec.id, None);
    assert_eq!(template.memory_mib(), 256);
    let state = std::fs::metadata(dir.join(STATE_FILE)).unwrap().len();
    assert!(state < 16 << 20, "the template's state holds its RAM: {state} bytes");
    let before = digest(&template);
    // Its state alone is no checkpoint.
    let err = t.rt.restore(&pod_spec(&t, &spec.disk), &dir, None).await.unwrap_err();
    assert!(matches!(err, VmError::StateMismatch { what: "memory", .. }), "{err}");

    let pods = [pod_spec(&t, &spec.disk), VmSpec { hostname: "pod-1".into(), ..pod_spec(&t, &spec.disk) }];
    let (a, b) = tokio::join!(
        t.rt.start_from_template_state(&pods[0], &template),
        t.rt.start_from_template_state(&pods[1], &template)
    );
    let (a, b) = (a.expect("pod 0"), b.expect("pod 1"));
    assert_ne!(t.rt.vmm_uid(&a.id), t.rt.vmm_uid(&b.id));
    let clients = [t.rt.agent(&a.id).await.expect("agent 0"), t.rt.agent(&b.id).await.expect("agent 1")];
    assert_eq!(sh(&clients[0], "cat /proc/sys/kernel/hostname").await, "vmbox");
    assert_eq!(sh(&clients[1], "cat /proc/sys/kernel/hostname").await, "pod-1");
    // Each pod writes its own memory (a tmpfs) and disk.
    for (i, client) in clients.iter().enumerate() {
        sh(
            client,
            &format!("dd if=/dev/urandom of=/tmp/blob bs=1M count=32 2>/dev/null && echo pod-{i} > /root/who && sync"),
        )
        .await;
    }
    let sums = [sh(&clients[0], "md5sum /tmp/blob").await, sh(&clients[1], "md5sum /tmp/blob").await];
    assert_ne!(sums[0], sums[1]);
    assert_eq!(sh(&clients[0], "cat /root/who").await, "pod-0");
    assert_eq!(sh(&clients[1], "cat /root/who").await, "pod-1");
    assert_eq!(digest(&template), before, "a pod changed the template's memory");

    // A pod's own checkpoint holds all its RAM and restores without the template.
    let pod_state = t.dir.path().join("pod-state");
    checkpoint_as_the_node(&t.rt, &a.id, &pod_state).await;
    let copy = pod_spec(&t, &pods[0].disk);
    t.rt.destroy(&a.id).await.expect("destroy pod 0");
    t.rt.restore(&copy, &pod_state, None).await.expect("restore of a pod's checkpoint");
    let client = t.rt.agent(&copy.id).await.expect("agent");
    assert_eq!(sh(&client, "md5sum /tmp/blob").await, sums[0]);
    assert_eq!(sh(&client, "cat /root/who").await, "pod-0");
    assert_eq!(digest(&template), before);
}

/// Printed, never asserted: template creation, a pod until its agent answered (reseeded),
/// and four pods at once.
#[tokio::test]
async fn measure_template_pods() {
    let t = TestRuntime::new("measure_template_pods");
    let image = busybox_image(t.dir.path());
    let spec = t.spec(&image, 256);
    let started = Instant::now();
    let template = t.rt.make_template_state(&spec, &t.dir.path().join("template")).await.expect("template");
    let made = started.elapsed();
    let (mut pods, mut fours) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        let pod = pod_spec(&t, &spec.disk);
        let started = Instant::now();
        t.rt.start_from_template_state(&pod, &template).await.expect("pod");
        t.rt.agent(&pod.id).await.expect("agent").health().await.expect("health");
        pods.push(started.elapsed());
        t.rt.destroy(&pod.id).await.expect("destroy");
    }
    for _ in 0..5 {
        let four: Vec<VmSpec> = (0..4).map(|_| pod_spec(&t, &spec.disk)).collect();
        let started = Instant::now();
        futures::future::join_all(four.iter().map(|pod| async {
            t.rt.start_from_template_state(pod, &template).await.expect("pod");
            t.rt.agent(&pod.id).await.expect("agent").health().await.expect("health");
        }))
        .await;
        fours.push(started.elapsed());
        for pod in &four {
            t.rt.destroy(&pod.id).await.expect("destroy");
        }
    }
    let p50 = |mut v: Vec<std::time::Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    eprintln!(
        "template (boot + save, 256 MiB guest): {made:?}, device state {} KiB (saved in {:?})",
        template.stats().image_bytes >> 10,
        template.stats().wall
    );
    eprintln!("pod to the first agent reply: n={} p50 {:?} (all {:?})", pods.len(), p50(pods.clone()), pods);
    eprintln!("four pods at once, until all answer: n={} p50 {:?} (all {:?})", fours.len(), p50(fours.clone()), fours);
}
