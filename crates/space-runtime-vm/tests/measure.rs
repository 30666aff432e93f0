//! Measurements (printed, never asserted: timings depend on the host): boot to the agent's
//! first reply, exec round trip, pause/resume, memory of an idle VMM, checkpoint, restore
//! and fork. Run with
//! `--nocapture` to see them.

mod common;

use std::time::{Duration, Instant};

use common::*;
use space_runtime_vm::VmSpec;

fn p50(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

#[tokio::test]
async fn measure_boot_exec_pause_and_memory() {
    let t = TestRuntime::new("measure_boot_exec_pause_and_memory");
    let image = busybox_image(t.dir.path());
    let (mut boots, mut execs, mut pauses, mut resumes) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..5 {
        let spec = t.spec(&image, 256);
        let started = Instant::now();
        let handle = t.rt.start(&spec).await.expect("start");
        boots.push(started.elapsed());
        let client = t.rt.agent(&spec.id).await.expect("agent");
        for _ in 0..20 {
            let started = Instant::now();
            assert_eq!(run(&client, &["true"]).await.1, 0);
            execs.push(started.elapsed());
        }
        for _ in 0..4 {
            let started = Instant::now();
            t.rt.pause(&spec.id).await.expect("pause");
            pauses.push(started.elapsed());
            let started = Instant::now();
            t.rt.resume(&spec.id).await.expect("resume");
            resumes.push(started.elapsed());
        }
        if round == 0 {
            tokio::time::sleep(Duration::from_secs(3)).await;
            let stats = t.rt.stats(&spec.id).expect("stats");
            let rss = t.rt.vmm_rss_bytes(&spec.id).expect("rss");
            eprintln!(
                "idle VMM (256 MiB guest): RSS {} MiB, cgroup memory {} MiB (limit {} MiB), {} tasks",
                rss >> 20,
                stats.memory_bytes >> 20,
                stats.memory_limit_bytes >> 20,
                stats.pids
            );
        }
        t.rt.destroy(&handle.id).await.expect("destroy");
    }
    eprintln!("{}", t.rt.support().unwrap());
    eprintln!("boot to first agent reply: n={} p50 {:?} (all {:?})", boots.len(), p50(boots.clone()), boots);
    eprintln!("exec `true` round trip: n={} p50 {:?}", execs.len(), p50(execs));
    eprintln!("pause (QMP stop + query-status): n={} p50 {:?}", pauses.len(), p50(pauses));
    eprintln!("resume (QMP cont): n={} p50 {:?}", resumes.len(), p50(resumes));
}

/// Full snapshots of a 256 MiB guest: checkpoint (wall, state size) of an idle guest and of
/// one holding 100 MiB in a tmpfs, restore until the agent has answered (and the guest was
/// reseeded), and four restores of one state at once until all four have.
#[tokio::test]
async fn measure_checkpoint_restore_and_fork() {
    let t = TestRuntime::new("measure_checkpoint_restore_and_fork");
    let image = busybox_image(t.dir.path());
    let (mut releases, mut checkpoints, mut sizes, mut restores, mut forks) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut loaded_checkpoints, mut loaded_sizes, mut loaded_restores) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..8 {
        let spec = t.spec(&image, 256);
        t.rt.start(&spec).await.expect("start");
        let loaded = round >= 5;
        if loaded {
            let client = t.rt.agent(&spec.id).await.expect("agent");
            let fill = "mkdir -p /mnt/mem && mount -t tmpfs -o size=110m tmpfs /mnt/mem && \
                        dd if=/dev/urandom of=/mnt/mem/blob bs=1M count=100 2>/dev/null";
            sh(&client, fill).await;
        }
        let started = Instant::now();
        t.rt.release_agent(&spec.id, Duration::from_secs(5)).await.expect("release");
        releases.push(started.elapsed());
        t.rt.pause(&spec.id).await.expect("pause");
        let state = t.dir.path().join(format!("state-{round}"));
        let stats = t.rt.checkpoint(&spec.id, &state).await.expect("checkpoint");
        if loaded {
            loaded_checkpoints.push(stats.wall);
            loaded_sizes.push(stats.image_bytes);
        } else {
            checkpoints.push(stats.wall);
            sizes.push(stats.image_bytes);
        }
        t.rt.destroy(&spec.id).await.expect("destroy the source");

        for _ in 0..3 {
            let fork = VmSpec { hostname: String::new(), ..t.spec(&spec.disk, 0) };
            let started = Instant::now();
            t.rt.restore(&fork, &state, None).await.expect("restore");
            let client = t.rt.agent(&fork.id).await.expect("agent");
            client.health().await.expect("health");
            if loaded {
                loaded_restores.push(started.elapsed())
            } else {
                restores.push(started.elapsed())
            }
            t.rt.destroy(&fork.id).await.expect("destroy");
        }

        if !loaded {
            let four: Vec<VmSpec> =
                (0..4).map(|_| VmSpec { hostname: String::new(), ..t.spec(&spec.disk, 0) }).collect();
            let started = Instant::now();
            let restored = futures::future::join_all(four.iter().map(|fork| async {
                t.rt.restore(fork, &state, None).await.expect("fork");
                t.rt.agent(&fork.id).await.expect("agent").health().await.expect("health");
            }));
            restored.await;
            forks.push(started.elapsed());
            for fork in &four {
                t.rt.destroy(&fork.id).await.expect("destroy");
            }
        }
    }
    let mib =
        |bytes: &[u64]| bytes.iter().map(|b| format!("{:.1}", *b as f64 / f64::from(1 << 20))).collect::<Vec<_>>();
    eprintln!("{}", t.rt.support().unwrap());
    eprintln!("release the agent before a checkpoint: n={} p50 {:?}", releases.len(), p50(releases));
    eprintln!(
        "checkpoint, idle 256 MiB guest: n={} p50 {:?} (all {:?}), state MiB {:?}",
        checkpoints.len(),
        p50(checkpoints.clone()),
        checkpoints,
        mib(&sizes)
    );
    eprintln!(
        "checkpoint, 256 MiB guest with 100 MiB in a tmpfs: n={} p50 {:?} (all {:?}), state MiB {:?}",
        loaded_checkpoints.len(),
        p50(loaded_checkpoints.clone()),
        loaded_checkpoints,
        mib(&loaded_sizes)
    );
    eprintln!(
        "restore to the first agent reply (idle state): n={} p50 {:?} (all {:?})",
        restores.len(),
        p50(restores.clone()),
        restores
    );
    eprintln!(
        "restore to the first agent reply (100 MiB tmpfs): n={} p50 {:?} (all {:?})",
        loaded_restores.len(),
        p50(loaded_restores.clone()),
        loaded_restores
    );
    eprintln!(
        "fork x4 (four restores at once, until all answer): n={} p50 {:?} (all {:?})",
        forks.len(),
        p50(forks.clone()),
        forks
    );
}
