//! Summaries of samples, the human table and the JSON lines saved under `bench/results/`.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};

use crate::output::print_table;

/// Latency percentiles of one measure.
#[derive(Debug, Clone, Serialize)]
pub struct Measure {
    pub measure: String,
    pub n: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
}

pub fn summarize(name: &str, mut samples: Vec<Duration>) -> Measure {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let pick = |q: f64| {
        let rank = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len().max(1));
        samples.get(rank - 1).copied().map_or(f64::NAN, ms)
    };
    Measure {
        measure: name.to_owned(),
        n: samples.len(),
        p50_ms: pick(0.50),
        p90_ms: pick(0.90),
        p99_ms: pick(0.99),
        mean_ms: samples.iter().map(|d| ms(*d)).sum::<f64>() / samples.len().max(1) as f64,
    }
}

/// Everything one run measured, in the order it was measured.
#[derive(Default)]
pub struct Report {
    lines: Vec<Value>,
    measures: Vec<Measure>,
}

impl Report {
    pub fn add(&mut self, measure: Measure) -> &Measure {
        eprintln!(
            "  {:<32} p50 {:>8.2} ms  p90 {:>8.2} ms  (n={})",
            measure.measure, measure.p50_ms, measure.p90_ms, measure.n
        );
        self.lines.push(serde_json::to_value(&measure).unwrap_or_default());
        self.measures.push(measure);
        self.measures.last().expect("just pushed")
    }

    /// A measure that is not a latency distribution (burst totals, memory).
    pub fn add_value(&mut self, value: Value) {
        eprintln!("  {value}");
        self.lines.push(value);
    }

    pub fn get(&self, name: &str) -> Option<&Measure> {
        self.measures.iter().find(|m| m.measure == name)
    }

    /// `peer / ours` at p50 and p90: how many times faster we are.
    pub fn add_ratio(&mut self, peer: &str, ours: &str) {
        let (Some(p), Some(o)) = (self.get(peer), self.get(ours)) else { return };
        let value = json!({
            "measure": format!("ratio:{peer}/{ours}"),
            "p50": round(p.p50_ms / o.p50_ms),
            "p90": round(p.p90_ms / o.p90_ms),
        });
        self.add_value(value);
    }

    /// Whether `name` stays within the goal `goal_ms` at p50 and p90.
    pub fn add_goal(&mut self, name: &str, goal_ms: f64) {
        let Some(m) = self.get(name) else { return };
        let value = json!({
            "measure": format!("goal:{name}"),
            "goal_ms": goal_ms,
            "met_p50": m.p50_ms <= goal_ms,
            "met_p90": m.p90_ms <= goal_ms,
        });
        self.add_value(value);
    }

    pub fn print(&self) {
        let rows: Vec<Vec<String>> = self
            .measures
            .iter()
            .map(|m| {
                let f = |v: f64| format!("{v:.2}");
                vec![m.measure.clone(), m.n.to_string(), f(m.p50_ms), f(m.p90_ms), f(m.p99_ms)]
            })
            .collect();
        print_table(&["MEASURE", "N", "P50 MS", "P90 MS", "P99 MS"], &rows);
        for line in self.lines.iter().filter(|l| l.get("p50_ms").is_none()) {
            println!("{line}");
        }
    }

    /// Prints one JSON object per line and saves them with the machine description.
    pub fn save(&self, dir: &Path) -> anyhow::Result<()> {
        let mut text = String::new();
        for line in &self.lines {
            let line = serde_json::to_string(line)?;
            println!("{line}");
            text.push_str(&line);
            text.push('\n');
        }
        std::fs::create_dir_all(dir)?;
        let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
        let path = dir.join(format!("{stamp}.jsonl"));
        let header = json!({ "machine": machine(), "at": stamp });
        std::fs::write(&path, format!("{header}\n{text}"))?;
        eprintln!("saved {}", path.display());
        Ok(())
    }
}

pub fn round(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn machine() -> Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let memory = read("/proc/meminfo").lines().next().unwrap_or_default().to_owned();
    let model = read("/proc/cpuinfo").lines().find(|l| l.starts_with("model name")).unwrap_or_default().to_owned();
    json!({ "cpus": cpus, "kernel": read("/proc/sys/kernel/osrelease").trim(), "memory": memory, "cpu": model })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_ranks() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let m = summarize("x", samples);
        assert_eq!((m.p50_ms, m.p90_ms, m.p99_ms), (50.0, 90.0, 99.0));
        assert_eq!(m.n, 100);
        let one = summarize("y", vec![Duration::from_millis(7)]);
        assert_eq!((one.p50_ms, one.p99_ms), (7.0, 7.0));
    }
}
