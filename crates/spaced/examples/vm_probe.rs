//! Checks a `vm` sandbox's agent by hand, through QEMU's socket for the virtio-serial port:
//!
//! ```text
//! vm_probe AGENT_SOCK                 # exec, files, tty, network view, pid 1, timings
//! vm_probe AGENT_SOCK exec ARGV..     # runs one command, prints its output and status
//! vm_probe AGENT_SOCK rapid N GAP_MS  # N connections one after another, GAP_MS apart
//! vm_probe AGENT_SOCK boot CMD ARGS.. # runs CMD (QEMU), times its first health reply,
//!                                     # then powers the guest off (busybox in /usr/local/bin)
//! ```
//!
//! The guest side is `spaced guest --port agent` (see crates/spaced/src/port.rs and
//! scripts/vm-guest/init); no part of the product uses this program.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use space_proto::{AgentClient, ExecSpec, PtySize};

fn spec(argv: &[&str]) -> ExecSpec {
    ExecSpec { argv: argv.iter().map(|s| s.to_string()).collect(), ..Default::default() }
}

async fn run(client: &AgentClient, spec: ExecSpec) -> String {
    let out = client.exec(spec).await.expect("exec").wait_with_output(1 << 20).await.expect("output");
    let status = out.status;
    format!("{}{}[{status:?}]", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

async fn check(sock: &str) {
    let start = Instant::now();
    let client = AgentClient::connect_unix(sock).await.expect("connect");
    println!("connected to {} in {:?}", client.peer().agent, start.elapsed());
    println!("health: {:?}", client.health().await.expect("health"));
    println!("uname -r: {}", run(&client, spec(&["uname", "-r"])).await);

    let data = Bytes::from((0..3u32 << 20).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    let chunks = futures::stream::iter([Ok(data.clone())]);
    let written = client.write_file("/root/probe.bin", None, chunks).await.expect("write");
    let (size, mut chunks) = client.read_file("/root/probe.bin").await.expect("read");
    let mut back = Vec::new();
    while let Some(chunk) = chunks.next().await {
        back.extend_from_slice(&chunk.expect("chunk"));
    }
    assert_eq!(back, data, "file round trip");
    println!("file: wrote {written} bytes, read {size}, identical");

    let mut tty = spec(&["tty"]);
    tty.tty = Some(PtySize { rows: 24, cols: 80 });
    println!("tty: {}", run(&client, tty).await);
    let net = "cat /etc/hostname /etc/resolv.conf; busybox ip -4 addr show eth0; busybox ip route";
    let mut net = spec(&["sh", "-c", net]);
    net.env.insert("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into());
    println!("network: {}", run(&client, net).await);
    println!("pid 1: {}", run(&client, spec(&["sh", "-c", "tr '\\0' ' ' </proc/1/cmdline"])).await);

    let start = Instant::now();
    for _ in 0..20 {
        client.health().await.expect("health");
    }
    println!("health round trip: {:?}", start.elapsed() / 20);
    let start = Instant::now();
    for _ in 0..10 {
        run(&client, spec(&["true"])).await;
    }
    println!("exec true: {:?}", start.elapsed() / 10);
    client.close();
}

async fn rapid(sock: &str, tries: usize, gap: Duration) {
    let mut failures = 0;
    let mut times = Vec::new();
    for _ in 0..tries {
        let start = Instant::now();
        let attempt = async {
            let client = AgentClient::connect_unix(sock).await.map_err(|e| println!("  connect: {e}")).ok()?;
            client.health().await.map_err(|e| println!("  health: {e}")).ok()?;
            Some(client)
        };
        match tokio::time::timeout(Duration::from_secs(3), attempt).await {
            Ok(Some(client)) => {
                times.push(start.elapsed());
                client.close();
            }
            Ok(None) => failures += 1,
            Err(_) => {
                println!("  no answer within 3 s");
                failures += 1;
            }
        }
        tokio::time::sleep(gap).await;
    }
    times.sort();
    println!(
        "{tries} connections {gap:?} apart: {failures} failed; median connect + health {:?}",
        times.get(times.len() / 2)
    );
}

async fn boot(sock: &str, command: &[String]) {
    let start = Instant::now();
    let mut vmm = std::process::Command::new(&command[0]).args(&command[1..]).spawn().expect("start the VMM");
    let client = loop {
        // QEMU accepts at once; the handshake waits for the guest's agent.
        if let Ok(Ok(client)) = tokio::time::timeout(Duration::from_secs(30), AgentClient::connect_unix(sock)).await {
            break client;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "no agent after 60 s");
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    client.health().await.expect("health");
    println!("first reply after {} ms", start.elapsed().as_millis());
    let _ = client.exec(spec(&["/usr/local/bin/busybox", "poweroff", "-f"])).await;
    let _ = vmm.wait();
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(sock) = args.first() else {
        eprintln!("usage: vm_probe AGENT_SOCK [exec ARGV.. | rapid N GAP_MS | boot CMD ARGS..]");
        std::process::exit(2);
    };
    match args.get(1).map(String::as_str) {
        None => check(sock).await,
        Some("rapid") => {
            let tries = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(20);
            let gap = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(0);
            rapid(sock, tries, Duration::from_millis(gap)).await;
        }
        Some("boot") if args.len() > 2 => boot(sock, &args[2..]).await,
        Some("exec") if args.len() > 2 => {
            let client = AgentClient::connect_unix(sock).await.expect("connect");
            let argv: Vec<&str> = args[2..].iter().map(String::as_str).collect();
            println!("{}", run(&client, spec(&argv)).await);
            client.close();
        }
        Some(_) => {
            eprintln!("usage: vm_probe AGENT_SOCK [exec ARGV.. | rapid N GAP_MS | boot CMD ARGS..]");
            std::process::exit(2);
        }
    }
}
