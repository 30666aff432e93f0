//! When a session ends or sleeps on its own: its idle timeout and maximum age.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::types::UpdateSessionRequest;

/// When a session ends or sleeps on its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SessionLifetime {
    /// Suspended after this many idle seconds.
    pub idle_timeout_secs: Option<u64>,
    /// Destroyed (or, with `on_max_age: suspend`, suspended) this many seconds after creation.
    pub max_age_secs: Option<u64>,
    /// What reaching `max_age_secs` does (default `destroy`).
    #[serde(default, skip_serializing_if = "MaxAgeAction::is_destroy")]
    pub on_max_age: MaxAgeAction,
    /// When a call resumes the suspended session (`auto_resume`), its maximum age is set to
    /// end this many seconds after that resume (E2B's timeout after an auto-resume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_resume_max_age_secs: Option<u64>,
}

/// What a session's maximum age does to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MaxAgeAction {
    /// The session is destroyed.
    #[default]
    Destroy,
    /// The session is suspended (memory and files kept) and its maximum age cleared; it
    /// resumes as any suspended session does. Needs full snapshots (CRIU or the vm runtime).
    Suspend,
}

impl MaxAgeAction {
    pub fn is_destroy(&self) -> bool {
        *self == MaxAgeAction::Destroy
    }
}

impl SessionLifetime {
    /// Longest accepted value of any: a year.
    pub const MAX_SECS: u64 = 366 * 24 * 3600;

    /// Applies an update's lifetime settings, where `Some(0)` turns one off.
    pub fn updated(self, update: &UpdateSessionRequest) -> SessionLifetime {
        let pick = |new: Option<u64>, old| match new {
            Some(0) => None,
            Some(n) => Some(n),
            None => old,
        };
        SessionLifetime {
            idle_timeout_secs: pick(update.idle_timeout_secs, self.idle_timeout_secs),
            max_age_secs: pick(update.max_age_secs, self.max_age_secs),
            on_max_age: update.on_max_age.unwrap_or(self.on_max_age),
            auto_resume_max_age_secs: pick(update.auto_resume_max_age_secs, self.auto_resume_max_age_secs),
        }
    }

    /// The maximum age that ends a session created at `created_at_ms` (Unix milliseconds)
    /// `secs` seconds after `now_ms`.
    pub fn max_age_ending_in(created_at_ms: i64, now_ms: i64, secs: u64) -> u64 {
        let lived = (now_ms.saturating_sub(created_at_ms)).max(0) as u64 / 1000;
        lived.saturating_add(secs)
    }

    pub fn validate(&self) -> Result<(), String> {
        let settings = [
            ("idle_timeout_secs", self.idle_timeout_secs),
            ("max_age_secs", self.max_age_secs),
            ("auto_resume_max_age_secs", self.auto_resume_max_age_secs),
        ];
        for (name, value) in settings {
            if value.is_some_and(|v| v == 0 || v > Self::MAX_SECS) {
                return Err(format!("{name} must be between 1 and {} seconds", Self::MAX_SECS));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_changes_what_it_names_and_zero_turns_a_setting_off() {
        let lifetime = SessionLifetime {
            idle_timeout_secs: Some(60),
            max_age_secs: Some(600),
            on_max_age: MaxAgeAction::Suspend,
            auto_resume_max_age_secs: Some(300),
        };
        let update =
            UpdateSessionRequest { max_age_secs: Some(0), auto_resume_max_age_secs: Some(900), ..Default::default() };
        let updated = lifetime.updated(&update);
        assert_eq!(updated.idle_timeout_secs, Some(60));
        assert_eq!(updated.max_age_secs, None);
        assert_eq!(updated.on_max_age, MaxAgeAction::Suspend);
        assert_eq!(updated.auto_resume_max_age_secs, Some(900));
        let off = updated.updated(&UpdateSessionRequest { auto_resume_max_age_secs: Some(0), ..Default::default() });
        assert_eq!(off.auto_resume_max_age_secs, None);
    }

    #[test]
    fn an_end_from_now_counts_the_age_already_lived() {
        assert_eq!(SessionLifetime::max_age_ending_in(1_000, 61_500, 300), 360);
        assert_eq!(SessionLifetime::max_age_ending_in(5_000, 1_000, 300), 300, "a clock behind creation");
    }

    #[test]
    fn validation_names_the_setting_out_of_range() {
        let lifetime =
            SessionLifetime { auto_resume_max_age_secs: Some(SessionLifetime::MAX_SECS + 1), ..Default::default() };
        assert!(lifetime.validate().unwrap_err().starts_with("auto_resume_max_age_secs must be between 1 and"));
        let json = serde_json::to_value(SessionLifetime::default()).unwrap();
        assert!(json.get("auto_resume_max_age_secs").is_none(), "unset, it is not sent: {json}");
    }
}
