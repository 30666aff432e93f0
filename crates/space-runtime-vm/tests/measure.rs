//! Measurements (printed, never asserted: timings depend on the host): boot to the agent's
//! first reply, exec round trip, pause/resume, memory of an idle VMM. Run with
//! `--nocapture` to see them.

mod common;

use std::time::{Duration, Instant};

use common::*;

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
