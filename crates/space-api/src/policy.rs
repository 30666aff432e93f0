//! A session's snapshot policy: how often a running session is snapshotted and which
//! snapshots are kept.
//!
//! Pure logic, no I/O and no clock: the node's scheduler asks [`next_due`] when to take the
//! next snapshot and [`prune`] which ones to delete, passing the current time in.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::types::SnapshotKind;

const MINUTE: u64 = 60;
const HOUR: u64 = 3600;
const DAY: u64 = 86_400;

/// Longest interval between two snapshots of a kind; a longer one is almost certainly a typo
/// and would leave a session without a recent restore point.
pub const MAX_INTERVAL_S: u64 = 30 * DAY;
/// Longest retention age (ten years); keeps the millisecond arithmetic far from overflow.
pub const MAX_AGE_S: u64 = 3650 * DAY;
/// Most retention tiers; each one is a linear scan per snapshot in [`prune`].
pub const MAX_TIERS: usize = 16;

/// When a running session is snapshotted and how long its snapshots are kept. Nothing is
/// taken while a session is paused or suspended.
///
/// In JSON, missing fields take their defaults and `null` turns a kind of snapshot off.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SnapshotPolicy {
    /// Seconds between disk (filesystem-only) snapshots; `null` = off.
    pub disk_every_s: Option<u64>,
    /// Seconds between full (filesystem and memory) snapshots; `null` = off.
    pub full_every_s: Option<u64>,
    pub retention: Retention,
}

impl Default for SnapshotPolicy {
    fn default() -> Self {
        SnapshotPolicy { disk_every_s: Some(MINUTE), full_every_s: Some(15 * MINUTE), retention: Retention::default() }
    }
}

impl SnapshotPolicy {
    /// No automatic snapshots. Retention still applies, so existing snapshots age out.
    pub fn off() -> Self {
        SnapshotPolicy { disk_every_s: None, full_every_s: None, retention: Retention::default() }
    }

    /// Checks the intervals and the retention; the error says what to change.
    pub fn validate(&self) -> Result<(), String> {
        check_interval(SnapshotKind::Disk, self.disk_every_s)?;
        check_interval(SnapshotKind::Full, self.full_every_s)?;
        self.retention.validate()
    }

    fn every_s(&self, kind: SnapshotKind) -> Option<u64> {
        match kind {
            SnapshotKind::Disk => self.disk_every_s,
            SnapshotKind::Full => self.full_every_s,
        }
    }
}

fn check_interval(kind: SnapshotKind, every_s: Option<u64>) -> Result<(), String> {
    match every_s {
        Some(s) if !(1..=MAX_INTERVAL_S).contains(&s) => Err(format!(
            "the {name} snapshot interval must be between 1s and {max}, not {got} (use {name}=off to turn {name} \
             snapshots off)",
            name = kind.as_str(),
            max = fmt_duration(MAX_INTERVAL_S),
            got = fmt_duration(s),
        )),
        _ => Ok(()),
    }
}

/// Which snapshots survive as they age: all of them for `keep_all_s`, then thinner and
/// thinner by tier, then none. Named and pinned snapshots are exempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Retention {
    /// Every snapshot younger than this (seconds) is kept.
    pub keep_all_s: u64,
    /// Sorted from the finest and shortest to the coarsest and longest.
    pub tiers: Vec<RetentionTier>,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            keep_all_s: HOUR,
            tiers: vec![RetentionTier { every_s: HOUR, for_s: DAY }, RetentionTier { every_s: DAY, for_s: 7 * DAY }],
        }
    }
}

impl Retention {
    /// Checks that ages grow tier by tier and buckets get coarser; the error says what to
    /// change.
    pub fn validate(&self) -> Result<(), String> {
        if self.keep_all_s > MAX_AGE_S {
            return Err(format!(
                "keep must be at most {}, not {}",
                fmt_duration(MAX_AGE_S),
                fmt_duration(self.keep_all_s)
            ));
        }
        if self.tiers.len() > MAX_TIERS {
            return Err(format!("at most {MAX_TIERS} retention tiers are allowed, not {}", self.tiers.len()));
        }
        let mut previous = None;
        for (i, tier) in self.tiers.iter().enumerate() {
            check_tier(i + 1, tier, previous, self.keep_all_s)?;
            previous = Some(tier);
        }
        Ok(())
    }
}

/// One step of thinning: among snapshots whose age is in (the previous tier's `for_s`, or
/// `keep_all_s` for the first tier, up to this `for_s`], one per `every_s` bucket is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetentionTier {
    /// Bucket width in seconds; buckets are aligned to Unix time, not to the session.
    pub every_s: u64,
    /// Age in seconds up to which this tier applies.
    pub for_s: u64,
}

fn check_tier(n: usize, tier: &RetentionTier, previous: Option<&RetentionTier>, keep_all_s: u64) -> Result<(), String> {
    let name = format!("retention tier {n} ({})", fmt_tier(tier));
    if tier.every_s == 0 {
        return Err(format!("{name}: its bucket width must be at least 1s"));
    }
    if tier.every_s > tier.for_s {
        return Err(format!("{name}: its bucket width must not exceed its age limit"));
    }
    if tier.for_s > MAX_AGE_S {
        return Err(format!("{name}: its age limit must be at most {}", fmt_duration(MAX_AGE_S)));
    }
    match previous {
        None if tier.for_s <= keep_all_s => {
            Err(format!("{name}: its age limit must be longer than keep ({})", fmt_duration(keep_all_s)))
        }
        Some(p) if tier.for_s <= p.for_s => Err(format!(
            "{name}: tiers must be sorted by age; its age limit must be longer than {}",
            fmt_duration(p.for_s)
        )),
        Some(p) if tier.every_s <= p.every_s => Err(format!(
            "{name}: older tiers must keep fewer snapshots; its bucket width must be longer than {}",
            fmt_duration(p.every_s)
        )),
        _ => Ok(()),
    }
}

/// A snapshot as the policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate<'a> {
    pub id: &'a str,
    /// Unix time in milliseconds.
    pub created_at_ms: i64,
    pub kind: SnapshotKind,
    /// Named or pinned: never deleted.
    pub keep: bool,
}

/// Which snapshots to delete now, oldest first.
///
/// Everything younger than `keep_all_s` stays. In each tier the OLDEST snapshot of each
/// bucket (`floor(created_at / every)`) stays, separately per kind, so a full snapshot is
/// never deleted because a disk one shares its bucket. Keeping the oldest makes the choice
/// stable: later snapshots landing in the bucket never displace it, and with nested buckets
/// (hours in days) the oldest of a day was also the oldest of its hour. Beyond the last tier everything
/// goes, except that `keep` snapshots and the newest snapshot of each kind (what a resume
/// or restore needs) are never deleted. `keep` snapshots still count as their bucket's
/// oldest, so pinning one costs nothing extra.
pub fn prune<'a>(policy: &Retention, now_ms: i64, snapshots: &[Candidate<'a>]) -> Vec<&'a str> {
    let mut sorted: Vec<&Candidate<'a>> = snapshots.iter().collect();
    // Oldest first, so the first snapshot that claims a bucket is its oldest; ids break ties
    // so the answer does not depend on the input order.
    sorted.sort_by_key(|c| (c.created_at_ms, c.id));
    let newest = newest_per_kind(&sorted);
    let mut claimed = HashSet::new();
    let mut doomed = Vec::new();
    for (i, c) in sorted.iter().enumerate() {
        let retained = match slot(policy, now_ms, c.created_at_ms) {
            Slot::KeepAll => true,
            Slot::Bucket(tier, bucket) => claimed.insert((c.kind, tier, bucket)),
            Slot::Expired => false,
        };
        if !retained && !c.keep && newest.get(&c.kind) != Some(&i) {
            doomed.push(c.id);
        }
    }
    doomed
}

/// Index in `sorted` (oldest first) of the newest snapshot of each kind.
fn newest_per_kind(sorted: &[&Candidate<'_>]) -> HashMap<SnapshotKind, usize> {
    sorted.iter().enumerate().map(|(i, c)| (c.kind, i)).collect()
}

/// Where a snapshot of a given creation time falls in the retention schedule.
enum Slot {
    KeepAll,
    /// (tier index, bucket number)
    Bucket(usize, i64),
    Expired,
}

fn slot(policy: &Retention, now_ms: i64, created_at_ms: i64) -> Slot {
    // A snapshot from the future (clock skew) has a negative age and is kept.
    let age_ms = now_ms.saturating_sub(created_at_ms);
    if age_ms <= secs_to_ms(policy.keep_all_s) {
        return Slot::KeepAll;
    }
    match policy.tiers.iter().position(|t| age_ms <= secs_to_ms(t.for_s)) {
        // `max(1)`: an unvalidated zero-width tier must not divide by zero.
        Some(i) => Slot::Bucket(i, created_at_ms.div_euclid(secs_to_ms(policy.tiers[i].every_s).max(1))),
        None => Slot::Expired,
    }
}

fn secs_to_ms(s: u64) -> i64 {
    i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX)
}

/// When the next snapshot of `kind` is due: `last_ms + every`, or now if none was ever
/// taken; `None` if that kind is off. A due time in the past means "now".
pub fn next_due(policy: &SnapshotPolicy, kind: SnapshotKind, last_ms: Option<i64>, now_ms: i64) -> Option<i64> {
    let every_ms = secs_to_ms(policy.every_s(kind)?);
    Some(last_ms.map_or(now_ms, |last| last.saturating_add(every_ms)))
}

/// Parses the CLI form, e.g. `disk=60s,full=15m,keep=1h,hourly=1d,daily=7d`, or `off`.
///
/// Units are s, m, h and d. `disk` and `full` also take `off`. `hourly=X` keeps one
/// snapshot per hour until age X, `daily=X` one per day; either may be `off` to drop that
/// tier. `tier=EVERY/FOR` adds any other tier. Missing keys keep their defaults, and the
/// result is validated.
impl FromStr for SnapshotPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim() == "off" {
            return Ok(SnapshotPolicy::off());
        }
        let mut policy = SnapshotPolicy::default();
        let mut seen: Vec<(&str, Entry)> = Vec::new();
        for part in s.split(',').map(str::trim) {
            let entry = parse_entry(part).map_err(|e| format!("`{part}`: {e}"))?;
            if let Some((earlier, _)) = seen.iter().find(|(_, e)| e.same_target(&entry)) {
                return Err(format!("`{part}` sets the same thing as `{earlier}`; give it once"));
            }
            entry.apply(&mut policy);
            seen.push((part, entry));
        }
        // `tier=` entries are appended; validation wants the finest tier first.
        policy.retention.tiers.sort_by_key(|t| t.every_s);
        policy.validate()?;
        Ok(policy)
    }
}

/// One `key=value` of the CLI form.
#[derive(Clone, Copy)]
enum Entry {
    Interval(SnapshotKind, Option<u64>),
    Keep(u64),
    /// Sets (`Some(for_s)`) or removes (`None`) the tier of a bucket width.
    Tier(u64, Option<u64>),
}

impl Entry {
    fn same_target(&self, other: &Entry) -> bool {
        match (self, other) {
            (Entry::Interval(a, _), Entry::Interval(b, _)) => a == b,
            (Entry::Keep(_), Entry::Keep(_)) => true,
            (Entry::Tier(a, _), Entry::Tier(b, _)) => a == b,
            _ => false,
        }
    }

    fn apply(self, policy: &mut SnapshotPolicy) {
        match self {
            Entry::Interval(SnapshotKind::Disk, every) => policy.disk_every_s = every,
            Entry::Interval(SnapshotKind::Full, every) => policy.full_every_s = every,
            Entry::Keep(s) => policy.retention.keep_all_s = s,
            Entry::Tier(every_s, for_s) => {
                let tiers = &mut policy.retention.tiers;
                tiers.retain(|t| t.every_s != every_s);
                tiers.extend(for_s.map(|for_s| RetentionTier { every_s, for_s }));
            }
        }
    }
}

fn parse_entry(part: &str) -> Result<Entry, String> {
    let Some((key, value)) = part.split_once('=') else {
        return Err("expected key=value, such as disk=60s, or just `off`".to_owned());
    };
    let value = value.trim();
    match key.trim() {
        "disk" => Ok(Entry::Interval(SnapshotKind::Disk, parse_optional(value)?)),
        "full" => Ok(Entry::Interval(SnapshotKind::Full, parse_optional(value)?)),
        "keep" => Ok(Entry::Keep(parse_duration(value)?)),
        "hourly" => Ok(Entry::Tier(HOUR, parse_optional(value)?)),
        "daily" => Ok(Entry::Tier(DAY, parse_optional(value)?)),
        "tier" => parse_tier(value),
        other => Err(format!("unknown key `{other}`; use disk, full, keep, hourly, daily or tier")),
    }
}

fn parse_tier(value: &str) -> Result<Entry, String> {
    let Some((every, for_s)) = value.split_once('/') else {
        return Err("expected tier=EVERY/FOR, such as tier=6h/30d".to_owned());
    };
    Ok(Entry::Tier(parse_duration(every.trim())?, Some(parse_duration(for_s.trim())?)))
}

/// A duration, or `off` for `None`.
fn parse_optional(value: &str) -> Result<Option<u64>, String> {
    if value == "off" { Ok(None) } else { parse_duration(value).map(Some) }
}

/// `<digits><unit>` with unit s, m, h or d, in seconds.
pub fn parse_duration(value: &str) -> Result<u64, String> {
    let split = value.find(|c: char| !c.is_ascii_digit()).unwrap_or(value.len());
    let (digits, unit) = value.split_at(split);
    let scale = match unit {
        "s" => 1,
        "m" => MINUTE,
        "h" => HOUR,
        "d" => DAY,
        _ => return Err(format!("`{value}` is not a duration; use a number and a unit (s, m, h or d), such as 90s")),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{value}` is not a duration; use a number and a unit (s, m, h or d), such as 90s"))?;
    n.checked_mul(scale).ok_or_else(|| format!("`{value}` is too long"))
}

/// The CLI form, which [`FromStr`] parses back to an equal policy if it is valid.
impl fmt::Display for SnapshotPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let optional = |every: Option<u64>| every.map_or_else(|| "off".to_owned(), fmt_duration);
        write!(f, "disk={},full={},", optional(self.disk_every_s), optional(self.full_every_s))?;
        write!(f, "keep={}", fmt_duration(self.retention.keep_all_s))?;
        let for_s = |every_s| self.retention.tiers.iter().find(|t| t.every_s == every_s).map(|t| t.for_s);
        write!(f, ",hourly={},daily={}", optional(for_s(HOUR)), optional(for_s(DAY)))?;
        for tier in self.retention.tiers.iter().filter(|t| t.every_s != HOUR && t.every_s != DAY) {
            write!(f, ",tier={}", fmt_tier(tier))?;
        }
        Ok(())
    }
}

fn fmt_tier(tier: &RetentionTier) -> String {
    format!("{}/{}", fmt_duration(tier.every_s), fmt_duration(tier.for_s))
}

/// Seconds in the largest unit that divides them exactly: 86400 -> `1d`, 90 -> `90s`.
fn fmt_duration(s: u64) -> String {
    for (scale, unit) in [(DAY, "d"), (HOUR, "h"), (MINUTE, "m")] {
        if s != 0 && s.is_multiple_of(scale) {
            return format!("{}{unit}", s / scale);
        }
    }
    format!("{s}s")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN_MS: i64 = 60_000;
    const HOUR_MS: i64 = 3_600_000;
    const DAY_MS: i64 = 86_400_000;
    /// A Unix time on a day boundary (2024-10-04), so tier boundaries line up with buckets.
    const EPOCH: i64 = 20_000 * DAY_MS;

    struct Snap {
        id: String,
        at: i64,
        kind: SnapshotKind,
        keep: bool,
    }

    impl Snap {
        fn new(kind: SnapshotKind, at: i64) -> Self {
            Snap { id: format!("{}-{at}", kind.as_str()), at, kind, keep: false }
        }

        fn candidate(&self) -> Candidate<'_> {
            Candidate { id: &self.id, created_at_ms: self.at, kind: self.kind, keep: self.keep }
        }
    }

    fn prune_snaps(policy: &Retention, now: i64, snaps: &[Snap]) -> Vec<String> {
        let candidates: Vec<_> = snaps.iter().map(Snap::candidate).collect();
        prune(policy, now, &candidates).into_iter().map(str::to_owned).collect()
    }

    /// Applies `prune` and returns the creation times of the survivors, oldest first.
    fn survivors(policy: &Retention, now: i64, snaps: &mut Vec<Snap>) -> Vec<i64> {
        let doomed = prune_snaps(policy, now, snaps);
        snaps.retain(|s| !doomed.contains(&s.id));
        let mut at: Vec<i64> = snaps.iter().map(|s| s.at).collect();
        at.sort();
        at
    }

    /// A session running from `start` to `end` snapshots `kind` every `every` ms and prunes
    /// after each one, like the node does; returns the survivors and the largest count seen.
    fn simulate(policy: &Retention, kind: SnapshotKind, start: i64, end: i64, every: i64) -> (Vec<Snap>, usize) {
        let mut snaps = Vec::new();
        let mut peak = 0;
        for at in (start..=end).step_by(usize::try_from(every).unwrap()) {
            snaps.push(Snap::new(kind, at));
            peak = peak.max(survivors(policy, at, &mut snaps).len());
        }
        (snaps, peak)
    }

    /// Checks that the survivors cover every tier: everything within keep-all, exactly the
    /// oldest snapshot of each bucket lying wholly inside a tier, nothing expired but the
    /// newest.
    fn assert_covers(policy: &Retention, now: i64, taken: &[i64], kept: &[i64]) {
        let keep_all = secs_to_ms(policy.keep_all_s);
        for at in taken.iter().filter(|&&at| now - at <= keep_all) {
            assert!(kept.contains(at), "{at} is within keep-all but was deleted");
        }
        let mut younger = keep_all;
        for tier in &policy.tiers {
            let (every, older) = (secs_to_ms(tier.every_s), secs_to_ms(tier.for_s));
            // Buckets whose every instant has an age in (younger, older].
            let first = (now - older + every - 1).div_euclid(every);
            let last = (now - younger).div_euclid(every) - 1;
            for bucket in first..=last {
                let range = bucket * every..(bucket + 1) * every;
                let oldest = taken.iter().copied().filter(|at| range.contains(at)).min();
                let in_bucket: Vec<i64> = kept.iter().copied().filter(|at| range.contains(at)).collect();
                assert_eq!(in_bucket, Vec::from_iter(oldest), "bucket {bucket} of tier {tier:?}");
            }
            younger = older;
        }
        let newest = taken.iter().max();
        for at in kept.iter().filter(|&&at| now - at > younger) {
            assert_eq!(Some(at), newest, "{at} is older than the last tier but was kept");
        }
    }

    fn taken(start: i64, end: i64, every: i64) -> Vec<i64> {
        (start..=end).step_by(usize::try_from(every).unwrap()).collect()
    }

    #[test]
    fn defaults_follow_the_spec() {
        let policy = SnapshotPolicy::default();
        assert_eq!(policy.disk_every_s, Some(60));
        assert_eq!(policy.full_every_s, Some(900));
        assert_eq!(policy.retention.keep_all_s, 3600);
        assert_eq!(
            policy.retention.tiers,
            [RetentionTier { every_s: 3600, for_s: 86_400 }, RetentionTier { every_s: 86_400, for_s: 7 * 86_400 }]
        );
        assert_eq!(policy.validate(), Ok(()));
        assert_eq!(SnapshotPolicy::off().validate(), Ok(()));
        assert_eq!(SnapshotPolicy::off().retention, Retention::default());
    }

    /// Ten days of a disk snapshot a minute, pruned after each one. At a day-aligned `now`
    /// the survivors are exactly: ages 0..=60 min every minute (61), hour buckets wholly in
    /// ages (1h, 1d] (23), day buckets wholly in (1d, 7d] (6) = 90.
    #[test]
    fn ten_days_of_disk_snapshots_stay_bounded_and_cover_each_tier() {
        let policy = Retention::default();
        let end = EPOCH + 10 * DAY_MS;
        let (snaps, peak) = simulate(&policy, SnapshotKind::Disk, EPOCH, end, MIN_MS);
        let kept: Vec<i64> = snaps.iter().map(|s| s.at).collect();
        assert_eq!(kept.len(), 61 + 23 + 6);
        // At any `now`: 61 in keep-all; a 23 h age window meets at most 24 hour buckets and
        // a 6 d one at most 7 day buckets; the newest is inside keep-all.
        assert!(peak <= 61 + 24 + 7, "peak {peak}");
        assert_covers(&policy, end, &taken(EPOCH, end, MIN_MS), &kept);
    }

    /// The same at an unaligned start and end, where buckets straddle tier boundaries.
    #[test]
    fn unaligned_session_stays_within_the_bound() {
        let policy = Retention::default();
        let (start, end) = (EPOCH + 13 * MIN_MS + 37_000, EPOCH + 10 * DAY_MS + 5 * HOUR_MS + 29 * MIN_MS + 37_000);
        let (snaps, peak) = simulate(&policy, SnapshotKind::Disk, start, end, MIN_MS);
        assert!(peak <= 61 + 24 + 7, "peak {peak}");
        let kept: Vec<i64> = snaps.iter().map(|s| s.at).collect();
        assert_covers(&policy, end, &taken(start, end, MIN_MS), &kept);
        // Pruning once, without the history, keeps the same plus at most the oldest snapshot
        // of the two buckets straddling tier boundaries, and stays within the bound.
        let mut all: Vec<Snap> =
            taken(start, end, MIN_MS).into_iter().map(|at| Snap::new(SnapshotKind::Disk, at)).collect();
        let at_once = survivors(&policy, end, &mut all);
        assert!(kept.iter().all(|at| at_once.contains(at)));
        assert!(at_once.len() <= kept.len() + 2 && at_once.len() <= 61 + 24 + 7, "{}", at_once.len());
        assert_covers(&policy, end, &taken(start, end, MIN_MS), &at_once);
    }

    /// At a day-aligned `now`, pruning once over everything gives the same answer as pruning
    /// every minute, so a node that missed prunes (it was down) catches up to the same state.
    /// (At other times a bucket straddling a tier boundary may keep one extra snapshot until
    /// it crosses; see the unaligned test.)
    #[test]
    fn one_prune_matches_pruning_every_minute() {
        let policy = Retention::default();
        let end = EPOCH + 10 * DAY_MS;
        let (incremental, _) = simulate(&policy, SnapshotKind::Disk, EPOCH, end, MIN_MS);
        let mut all: Vec<Snap> =
            taken(EPOCH, end, MIN_MS).into_iter().map(|at| Snap::new(SnapshotKind::Disk, at)).collect();
        let at_once = survivors(&policy, end, &mut all);
        assert_eq!(at_once, incremental.iter().map(|s| s.at).collect::<Vec<_>>());
    }

    /// Full snapshots every 15 min: 5 within the hour, 23 hourly, 6 daily, like disk ones.
    #[test]
    fn full_snapshots_are_bounded_too() {
        let policy = Retention::default();
        let end = EPOCH + 10 * DAY_MS;
        let (snaps, peak) = simulate(&policy, SnapshotKind::Full, EPOCH, end, 15 * MIN_MS);
        assert_eq!(snaps.len(), 5 + 23 + 6);
        assert!(peak <= 5 + 24 + 7, "peak {peak}");
        let kept: Vec<i64> = snaps.iter().map(|s| s.at).collect();
        assert_covers(&policy, end, &taken(EPOCH, end, 15 * MIN_MS), &kept);
    }

    #[test]
    fn kinds_are_bucketed_separately() {
        let policy = Retention::default();
        let now = EPOCH + DAY_MS / 2;
        // Both in the hour bucket starting at EPOCH; the disk one is older.
        let snaps = [Snap::new(SnapshotKind::Disk, EPOCH), Snap::new(SnapshotKind::Full, EPOCH + MIN_MS)];
        assert!(prune_snaps(&policy, now, &snaps).is_empty());
    }

    #[test]
    fn keeps_the_oldest_of_each_bucket() {
        let policy = Retention::default();
        let now = EPOCH + 12 * HOUR_MS;
        let mut snaps: Vec<Snap> =
            [0, 10, 59, 60, 61].iter().map(|m| Snap::new(SnapshotKind::Disk, EPOCH + m * MIN_MS)).collect();
        snaps.push(Snap::new(SnapshotKind::Disk, now));
        assert_eq!(
            prune_snaps(&policy, now, &snaps),
            ["disk-1728000600000", "disk-1728003540000", "disk-1728003660000"]
        );
    }

    #[test]
    fn keep_flag_snapshots_are_never_pruned() {
        let policy = Retention::default();
        let now = EPOCH + 100 * DAY_MS;
        let mut snaps: Vec<Snap> = (0..50).map(|i| Snap::new(SnapshotKind::Disk, EPOCH + i * HOUR_MS)).collect();
        for s in snaps.iter_mut().filter(|s| (s.at / HOUR_MS) % 7 == 0) {
            s.keep = true;
        }
        snaps.push(Snap::new(SnapshotKind::Disk, now));
        let doomed = prune_snaps(&policy, now, &snaps);
        assert_eq!(doomed.len(), 50 - snaps.iter().filter(|s| s.keep).count());
        assert!(snaps.iter().filter(|s| s.keep).all(|s| !doomed.contains(&s.id)));
    }

    /// A pinned snapshot still is its bucket's oldest, so it does not cost an extra one.
    #[test]
    fn a_kept_snapshot_fills_its_bucket() {
        let policy = Retention::default();
        let now = EPOCH + 12 * HOUR_MS;
        let mut snaps = vec![Snap::new(SnapshotKind::Disk, EPOCH), Snap::new(SnapshotKind::Disk, EPOCH + MIN_MS)];
        snaps[0].keep = true;
        snaps.push(Snap::new(SnapshotKind::Disk, now));
        assert_eq!(prune_snaps(&policy, now, &snaps), [snaps[1].id.clone()]);
    }

    /// A session paused for a month: its snapshots are all past the last tier, but the
    /// newest of each kind is what resuming it needs.
    #[test]
    fn newest_of_each_kind_survives_however_old() {
        let policy = Retention::default();
        let now = EPOCH + 40 * DAY_MS;
        let snaps: Vec<Snap> = (0..4)
            .flat_map(|i| [SnapshotKind::Disk, SnapshotKind::Full].map(|k| Snap::new(k, EPOCH + i * MIN_MS)))
            .collect();
        let mut doomed = prune_snaps(&policy, now, &snaps);
        doomed.sort();
        let mut expected: Vec<String> =
            snaps.iter().filter(|s| s.at != EPOCH + 3 * MIN_MS).map(|s| s.id.clone()).collect();
        expected.sort();
        assert_eq!(doomed, expected);
    }

    #[test]
    fn input_order_does_not_matter() {
        let policy = Retention::default();
        let now = EPOCH + 3 * DAY_MS;
        let mut snaps: Vec<Snap> =
            taken(EPOCH, now, 7 * MIN_MS).into_iter().map(|at| Snap::new(SnapshotKind::Disk, at)).collect();
        let mut forward = prune_snaps(&policy, now, &snaps);
        snaps.reverse();
        let mut backward = prune_snaps(&policy, now, &snaps);
        forward.sort();
        backward.sort();
        assert_eq!(forward, backward);
    }

    #[test]
    fn snapshots_from_the_future_are_kept() {
        let policy = Retention { keep_all_s: 0, tiers: vec![] };
        let snaps = [Snap::new(SnapshotKind::Disk, EPOCH + MIN_MS), Snap::new(SnapshotKind::Disk, EPOCH + 2 * MIN_MS)];
        assert!(prune_snaps(&policy, EPOCH, &snaps).is_empty());
    }

    #[test]
    fn without_tiers_everything_past_keep_all_goes() {
        let policy = Retention { keep_all_s: 3600, tiers: vec![] };
        let now = EPOCH + 2 * HOUR_MS;
        let mut snaps: Vec<Snap> = taken(EPOCH, now - 30 * MIN_MS, 30 * MIN_MS)
            .into_iter()
            .map(|at| Snap::new(SnapshotKind::Full, at))
            .collect();
        assert_eq!(survivors(&policy, now, &mut snaps), [now - HOUR_MS, now - 30 * MIN_MS]);
    }

    #[test]
    fn next_due_follows_the_interval() {
        let policy = SnapshotPolicy::default();
        assert_eq!(next_due(&policy, SnapshotKind::Disk, None, EPOCH), Some(EPOCH));
        assert_eq!(next_due(&policy, SnapshotKind::Disk, Some(EPOCH), EPOCH + 1), Some(EPOCH + MIN_MS));
        assert_eq!(next_due(&policy, SnapshotKind::Full, Some(EPOCH), EPOCH), Some(EPOCH + 15 * MIN_MS));
        // Overdue stays in the past: the caller takes one now.
        assert_eq!(next_due(&policy, SnapshotKind::Full, Some(EPOCH), EPOCH + DAY_MS), Some(EPOCH + 15 * MIN_MS));
        let off = SnapshotPolicy::off();
        assert_eq!(next_due(&off, SnapshotKind::Disk, None, EPOCH), None);
        assert_eq!(next_due(&off, SnapshotKind::Full, Some(EPOCH), EPOCH), None);
    }

    #[test]
    fn parses_the_cli_form() {
        let spec: SnapshotPolicy = "disk=60s,full=15m,keep=1h,hourly=1d,daily=7d".parse().unwrap();
        assert_eq!(spec, SnapshotPolicy::default());
        assert_eq!("off".parse(), Ok(SnapshotPolicy::off()));
        assert_eq!("disk=off,full=off".parse(), Ok(SnapshotPolicy::off()));
        let partial: SnapshotPolicy = " full = 5m , daily=30d ".parse().unwrap();
        assert_eq!(partial.full_every_s, Some(300));
        assert_eq!(partial.disk_every_s, Some(60));
        assert_eq!(partial.retention.tiers[1], RetentionTier { every_s: DAY, for_s: 30 * DAY });
        let custom: SnapshotPolicy = "hourly=off,tier=6h/14d,daily=90d,keep=2h".parse().unwrap();
        assert_eq!(custom.retention.keep_all_s, 2 * HOUR);
        assert_eq!(
            custom.retention.tiers,
            [RetentionTier { every_s: 6 * HOUR, for_s: 14 * DAY }, RetentionTier { every_s: DAY, for_s: 90 * DAY }]
        );
    }

    #[test]
    fn display_round_trips() {
        let policies = [
            SnapshotPolicy::default(),
            SnapshotPolicy::off(),
            "disk=90s,full=off,keep=0s,hourly=off,daily=off".parse().unwrap(),
            "disk=2h,keep=30m,tier=15m/6h,hourly=2d,tier=7d/365d".parse().unwrap(),
        ];
        for policy in policies {
            let text = policy.to_string();
            assert_eq!(text.parse(), Ok(policy.clone()), "{text}");
        }
        assert_eq!(SnapshotPolicy::default().to_string(), "disk=1m,full=15m,keep=1h,hourly=1d,daily=7d");
    }

    #[test]
    fn parse_errors_say_what_is_wrong() {
        let err = |s: &str| s.parse::<SnapshotPolicy>().unwrap_err();
        assert!(err("disk=abc").contains("`abc` is not a duration"), "{}", err("disk=abc"));
        assert!(err("disk=60").contains("unit"), "{}", err("disk=60"));
        assert!(err("full=0s").contains("full snapshot interval must be between 1s and 30d"), "{}", err("full=0s"));
        assert!(err("unknown=1h").contains("unknown key `unknown`"), "{}", err("unknown=1h"));
        assert!(err("disk").contains("key=value"));
        assert!(err("").contains("key=value"));
        assert!(err("disk=1m,").contains("key=value"));
        assert!(err("disk=1m,disk=2m").contains("give it once"));
        assert!(err("hourly=2d,tier=1h/3d").contains("give it once"));
        assert!(err("keep=99999999999999999d").contains("too long"));
        assert!(err("disk=31d").contains("between 1s and 30d"));
        assert!(err("tier=6h").contains("EVERY/FOR"));
        // Ages must grow: daily ending before hourly does is rejected.
        assert!(err("hourly=3d,daily=2d").contains("sorted by age"), "{}", err("hourly=3d,daily=2d"));
        assert!(err("daily=12h").contains("tier 2 (1d/12h): its bucket width must not exceed"));
        assert!(err("keep=2d").contains("longer than keep (2d)"), "{}", err("keep=2d"));
    }

    #[test]
    fn validate_rejects_bad_policies() {
        let with = |f: fn(&mut SnapshotPolicy)| {
            let mut policy = SnapshotPolicy::default();
            f(&mut policy);
            policy.validate().unwrap_err()
        };
        assert!(with(|p| p.disk_every_s = Some(0)).contains("disk=off"));
        assert!(with(|p| p.full_every_s = Some(MAX_INTERVAL_S + 1)).contains("full snapshot interval"));
        assert!(with(|p| p.retention.keep_all_s = MAX_AGE_S + 1).contains("keep must be at most 3650d"));
        assert!(
            with(|p| p.retention.tiers[0].every_s = 0).contains("tier 1 (0s/1d): its bucket width must be at least")
        );
        assert!(with(|p| p.retention.tiers[0].every_s = 2 * DAY).contains("must not exceed its age limit"));
        assert!(with(|p| p.retention.tiers[1].for_s = MAX_AGE_S + DAY).contains("at most 3650d"));
        assert!(with(|p| p.retention.tiers.reverse()).contains("sorted by age"));
        assert!(with(|p| p.retention.tiers[1].every_s = HOUR).contains("bucket width must be longer than 1h"));
        assert!(with(|p| p.retention.tiers[0].for_s = HOUR).contains("longer than keep (1h)"));
        let many = |p: &mut SnapshotPolicy| {
            p.retention.tiers = (1..=17).map(|i| RetentionTier { every_s: i * HOUR, for_s: i * 30 * DAY }).collect();
        };
        assert!(with(many).contains("at most 16 retention tiers"));
    }

    #[test]
    fn json_fills_defaults_and_rejects_unknown_fields() {
        let policy = SnapshotPolicy::default();
        let json = serde_json::to_string(&policy).unwrap();
        assert_eq!(serde_json::from_str::<SnapshotPolicy>(&json).unwrap(), policy);
        assert_eq!(serde_json::from_str::<SnapshotPolicy>("{}").unwrap(), policy);
        let off: SnapshotPolicy = serde_json::from_str(r#"{"disk_every_s":null,"full_every_s":null}"#).unwrap();
        assert_eq!(off, SnapshotPolicy::off());
        let partial: SnapshotPolicy = serde_json::from_str(r#"{"retention":{"keep_all_s":60}}"#).unwrap();
        assert_eq!(partial.retention.tiers, Retention::default().tiers);
        assert!(serde_json::from_str::<SnapshotPolicy>(r#"{"disk":60}"#).is_err());
        assert!(serde_json::from_str::<RetentionTier>(r#"{"every_s":60}"#).is_err());
        assert_eq!(serde_json::to_string(&SnapshotKind::Full).unwrap(), r#""full""#);
    }
}
