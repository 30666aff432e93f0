//! Human tables and JSON output.

use serde::Serialize;
use serde_json::Value;
use space_api::{PoolStatus, ProcessList, Session, SessionStats, Status};

/// Prints `value` as the API has it, except that its times are RFC 3339 (see [`rfc3339_times`]).
pub fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let mut value = serde_json::to_value(value)?;
    rfc3339_times(&mut value);
    println!("{}", serde_json::to_string_pretty(&value)?);
    Ok(())
}

/// Fields whose name ends in `_ms` but which hold a time, not a duration: the CLI's JSON
/// names them without the unit it no longer has.
const TIME_MS_FIELDS: [(&str, &str); 2] = [("modified_ms", "modified"), ("created_at_ms", "created_at")];

/// Turns the API's times (Unix milliseconds in fields named `at`, `time` or `*_at`, and the
/// [`TIME_MS_FIELDS`]) into RFC 3339 strings in UTC, at every depth. Everything else,
/// durations (`*_ms`, `*_secs`) and user data (labels, metadata: strings) among it, is left.
fn rfc3339_times(value: &mut Value) {
    match value {
        Value::Array(items) => items.iter_mut().for_each(rfc3339_times),
        Value::Object(map) => {
            for (key, field) in map.iter_mut() {
                match field.as_i64().filter(|_| is_time_field(key)) {
                    Some(ms) => *field = Value::String(rfc3339(ms)),
                    None => rfc3339_times(field),
                }
            }
            for (from, to) in TIME_MS_FIELDS {
                if let Some(ms) = map.get(from).and_then(Value::as_i64) {
                    map.remove(from);
                    map.insert(to.to_owned(), Value::String(rfc3339(ms)));
                }
            }
        }
        _ => {}
    }
}

fn is_time_field(key: &str) -> bool {
    key == "at" || key == "time" || key.ends_with("_at")
}

/// `1732900000123` → `2024-11-29T17:06:40.123Z`.
pub fn rfc3339(ms: i64) -> String {
    let at = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000);
    at.ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| ms.to_string())
}

/// Prints rows as aligned columns under a header.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        line(row.clone());
    }
}

/// `1732900000000` → `2024-11-29 17:06:40` (UTC).
pub fn time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", rem / 3600, (rem / 60) % 60, rem % 60)
}

/// A time as tables show it, relative to now: `3m ago`, `in 2d` (detail views and `--json`
/// keep exact times).
pub fn ago(ms: i64) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    crate::units::relative(ms, now)
}

// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

fn template_of(s: &Session) -> String {
    match s.template_version {
        Some(v) => format!("{}@{v}", s.template),
        None => s.template.clone(),
    }
}

/// Sessions as a table; with the tenant of each when `tenants` (an admin's `--all-tenants`).
pub fn print_sessions(sessions: &[Session], tenants: bool) {
    let rows: Vec<Vec<String>> = sessions
        .iter()
        .map(|s| {
            let mut row = vec![
                s.id.to_string(),
                s.name.clone().unwrap_or_default(),
                s.state.as_str().to_owned(),
                template_of(s),
                format!("{}", s.resources.cpus),
                format!("{} MiB", s.resources.memory_mib),
                ago(s.created_at),
            ];
            if tenants {
                row.insert(1, s.tenant.clone());
            }
            row
        })
        .collect();
    let mut header = vec!["ID", "NAME", "STATE", "TEMPLATE", "CPUS", "MEMORY", "CREATED"];
    if tenants {
        header.insert(1, "TENANT");
    }
    print_table(&header, &rows);
}

pub fn print_session(s: &Session, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(s);
    }
    let fields = [
        ("id", s.id.to_string()),
        ("state", s.state.as_str().to_owned()),
        ("name", s.name.clone().unwrap_or_default()),
        ("tenant", s.tenant.clone()),
        ("template", template_of(s)),
        ("cpus", s.resources.cpus.to_string()),
        ("memory", format!("{} MiB", s.resources.memory_mib)),
        ("pids", s.resources.pids.to_string()),
        ("disk", s.resources.disk_limit_bytes().map(bytes).unwrap_or_else(|| "no limit".into())),
        ("env", pairs(&s.env)),
        ("labels", pairs(&s.labels)),
        ("metadata", pairs(&s.metadata)),
        ("auto-resume", if s.auto_resume { "yes".into() } else { String::new() }),
        ("snapshots", s.snapshot_policy.to_string()),
        ("created", time(s.created_at)),
        ("error", s.error.clone().unwrap_or_default()),
    ];
    for (name, value) in fields {
        if !value.is_empty() {
            println!("{name:<11} {value}");
        }
    }
    Ok(())
}

fn pairs(map: &std::collections::BTreeMap<String, String>) -> String {
    map.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
}

pub fn print_stats(stats: &SessionStats, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(stats);
    }
    if let Some(s) = &stats.sandbox {
        let peak = s.memory_peak_bytes.map(|p| format!(", peak {}", bytes(p))).unwrap_or_default();
        println!(
            "memory    {} of {}{peak} ({} OOM kills)",
            bytes(s.memory_bytes),
            bytes(s.memory_limit_bytes),
            s.oom_kills
        );
        println!("cpu       {:.3} s\npids      {}", s.cpu_usage_ns as f64 / 1e9, s.pids);
    }
    let d = &stats.disk;
    let limit = match (d.limit_bytes, d.enforced) {
        (Some(limit), true) => format!(" of {}", bytes(limit)),
        (Some(limit), false) => format!(" (limit {} not enforced on this node)", bytes(limit)),
        (None, _) => " (no limit)".into(),
    };
    println!("disk      {}{limit}", bytes(d.used_bytes));
    println!("snapshots {} ({} in all, shared data counted in each)", d.snapshots, bytes(d.snapshot_bytes));
    let n = &stats.network;
    println!("network   {} out, {} in (through the gateway)", bytes(n.bytes_out), bytes(n.bytes_in));
    Ok(())
}

pub fn print_status(status: &Status, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(status);
    }
    println!("version   {}", status.version);
    println!("node      {}", status.node_id);
    let sessions: Vec<String> = status.sessions.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("sessions  {}", if sessions.is_empty() { "none".into() } else { sessions.join(" ") });
    let templates: Vec<String> = status.templates.iter().map(|t| format!("{}@{}", t.name, t.version)).collect();
    println!("templates {}", if templates.is_empty() { "none".into() } else { templates.join(" ") });
    for r in &status.runtimes {
        let state = if r.available { r.detail.clone() } else { format!("OFF: {}", r.detail) };
        println!("runtime {:<5} {state}", r.runtime.as_str());
    }
    let full = &status.full_snapshots;
    println!("full snapshots {}", if full.available { full.detail.clone() } else { format!("OFF: {}", full.detail) });
    println!(
        "pool      filling {}/{} at most, {} deletions pending",
        status.pool.filling, status.pool.max_filling, status.pool.pending_deletions
    );
    print_pool_table(&status.pool);
    Ok(())
}

/// The nodes: state, capacity, sessions, each template pool's ready/size, last heartbeat.
pub fn print_nodes(list: &space_api::NodeList, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(list);
    }
    let rows: Vec<Vec<String>> = list
        .nodes
        .iter()
        .map(|n| {
            let pools: Vec<String> =
                n.pool.iter().map(|p| format!("{}:{} {}/{}", p.template, p.runtime, p.ready, p.size)).collect();
            vec![
                n.id.clone(),
                node_state(n),
                n.address.clone().unwrap_or_else(|| "(in process)".into()),
                n.capacity.cpus.to_string(),
                format!("{} MiB", n.capacity.memory_mib),
                n.sessions.to_string(),
                pools.join(", "),
                rfc3339(n.heartbeat_at),
            ]
        })
        .collect();
    print_table(&["ID", "STATE", "ADDRESS", "CPUS", "MEMORY", "SESSIONS", "POOL (READY/SIZE)", "HEARTBEAT"], &rows);
    Ok(())
}

/// `ready` or `lost`, with `,cordoned` when it takes no new sessions.
fn node_state(node: &space_api::Node) -> String {
    let state = serde_json::to_value(node.state).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
    if node.cordoned { format!("{state},cordoned") } else { state }
}

/// One node after a cordon or uncordon.
pub fn print_node(node: &space_api::Node, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(node);
    }
    println!("node {} is {}", node.id, node_state(node));
    Ok(())
}

/// What a drain moved, and the sessions it left on the node with why.
pub fn print_drain(report: &space_api::DrainReport, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(report);
    }
    let node = &report.node;
    println!(
        "node {} ({}): {} moved, {} suspended durably, {} left on it",
        node.id,
        node_state(node),
        report.moved.len(),
        report.durable.len(),
        report.failed.len()
    );
    let mut rows: Vec<Vec<String>> = Vec::new();
    rows.extend(report.moved.iter().map(|s| vec![s.to_string(), "moved".into(), String::new()]));
    rows.extend(report.durable.iter().map(|s| vec![s.to_string(), "durable".into(), String::new()]));
    rows.extend(report.failed.iter().map(|f| vec![f.session.to_string(), "left".into(), f.message.clone()]));
    print_table(&["SESSION", "RESULT", "WHY"], &rows);
    Ok(())
}

/// What a sweep of the blob store deleted, or why it was put off.
pub fn print_blob_sweep(report: &space_api::durable::BlobSweepReport, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(report);
    }
    match &report.put_off {
        Some(why) => println!("blob store not swept: {why}"),
        None => println!(
            "blob store swept: {} objects ({} bytes) deleted, {} kept",
            report.objects.deleted_objects, report.objects.deleted_bytes, report.objects.kept_objects
        ),
    }
    Ok(())
}

pub fn print_pool(pool: &PoolStatus, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(pool);
    }
    print_pool_table(pool);
    Ok(())
}

fn print_pool_table(pool: &PoolStatus) {
    let rows: Vec<Vec<String>> = pool
        .templates
        .iter()
        .map(|t| {
            vec![
                t.template.clone(),
                t.runtime.to_string(),
                t.size.to_string(),
                t.ready.to_string(),
                t.filling.to_string(),
                t.hits.to_string(),
                t.misses.to_string(),
                t.failures.to_string(),
                t.last_error.clone().unwrap_or_default(),
            ]
        })
        .collect();
    print_table(
        &["TEMPLATE", "RUNTIME", "SIZE", "READY", "FILLING", "HITS", "MISSES", "FAILURES", "LAST ERROR"],
        &rows,
    );
}

pub fn print_processes(list: &ProcessList, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(list);
    }
    let rows: Vec<Vec<String>> = list
        .processes
        .iter()
        .map(|p| {
            let state = match (p.running, p.exit_code, p.signal) {
                (true, _, _) => "running".to_owned(),
                (false, Some(code), _) => format!("exited {code}"),
                (false, None, Some(signal)) => format!("killed {signal}"),
                (false, None, None) => "exited".to_owned(),
            };
            vec![p.pid.to_string(), state, if p.background { "yes" } else { "no" }.into(), p.cmd.join(" ")]
        })
        .collect();
    print_table(&["PID", "STATE", "BACKGROUND", "COMMAND"], &rows);
    Ok(())
}

pub fn print_port_access(access: &space_api::PortAccess, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(access);
    }
    let who = if access.public { "anyone" } else { "the API key or the token" };
    println!("port {} is reachable by {who}", access.port);
    println!("url:     {}", access.url);
    if let Some(preview) = &access.preview_url {
        println!("preview: {preview}");
    }
    if let Some(token) = &access.token {
        println!("token:   {token}  (header X-Space-Port-Token, or ?space_token=; shown once)");
    }
    Ok(())
}

pub fn print_ports(list: &space_api::PortList, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(list);
    }
    let rows: Vec<Vec<String>> = list
        .ports
        .iter()
        .map(|p| {
            let access = if p.public { "public" } else { "token" };
            vec![p.port.to_string(), access.into(), p.preview_url.clone().unwrap_or_else(|| p.url.clone())]
        })
        .collect();
    print_table(&["PORT", "ACCESS", "URL"], &rows);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_times_are_rfc3339_and_durations_and_user_data_are_not() {
        let mut v = serde_json::json!({
            "created_at": 1732900000123_i64, "expires_at": null, "timeout_ms": 5000,
            "labels": { "deployed_at": "1732900000123" },
            "events": [{ "at": 0, "seq": 7 }],
            "entries": [{ "modified_ms": 1732900000000_i64, "size": 3 }],
        });
        rfc3339_times(&mut v);
        assert_eq!(
            v,
            serde_json::json!({
                "created_at": "2024-11-29T17:06:40.123Z", "expires_at": null, "timeout_ms": 5000,
                "labels": { "deployed_at": "1732900000123" },
                "events": [{ "at": "1970-01-01T00:00:00Z", "seq": 7 }],
                "entries": [{ "modified": "2024-11-29T17:06:40Z", "size": 3 }],
            })
        );
    }

    #[test]
    fn formats_times_and_sizes() {
        assert_eq!(time(0), "1970-01-01 00:00:00");
        assert_eq!(time(1_732_900_000_000), "2024-11-29 17:06:40");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
    }
}
