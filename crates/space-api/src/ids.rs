//! Typed identifiers: a fixed prefix and 20 random lowercase base-36 characters.
//! They are safe as file, cgroup and socket names (validated on parse), so node-side
//! resources can be named deterministically after them.

use std::fmt;
use std::str::FromStr;

use rand::Rng;

const RANDOM_LEN: usize = 20;
const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "'{value}' is not a valid {kind} id (expected '{prefix}' followed by {RANDOM_LEN} lowercase letters or digits)"
)]
pub struct IdError {
    pub kind: &'static str,
    pub prefix: &'static str,
    pub value: String,
}

macro_rules! typed_id {
    ($name:ident, $prefix:literal, $kind:literal) => {
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            pub const PREFIX: &'static str = $prefix;

            /// A fresh random id.
            pub fn generate() -> Self {
                let mut rng = rand::rng();
                let mut s = String::with_capacity($prefix.len() + RANDOM_LEN);
                s.push_str($prefix);
                for _ in 0..RANDOM_LEN {
                    s.push(ALPHABET[rng.random_range(0..ALPHABET.len())] as char);
                }
                Self(s)
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(value: &str) -> Result<Self, IdError> {
                let valid = value
                    .strip_prefix($prefix)
                    .is_some_and(|rest| rest.len() == RANDOM_LEN && rest.bytes().all(|b| ALPHABET.contains(&b)));
                if valid {
                    Ok(Self(value.to_owned()))
                } else {
                    Err(IdError { kind: $kind, prefix: $prefix, value: value.chars().take(64).collect() })
                }
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(value: String) -> Result<Self, IdError> {
                value.parse()
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .pattern(Some(concat!("^", $prefix, "[0-9a-z]{20}$")))
                    .description(Some(concat!("A ", $kind, " id.")))
                    .into()
            }
        }

        impl utoipa::ToSchema for $name {}
    };
}

typed_id!(SessionId, "ses_", "session");
typed_id!(SandboxId, "sbx_", "sandbox");
typed_id!(OperationId, "op_", "operation");
typed_id!(TenantId, "ten_", "tenant");
typed_id!(NodeId, "node_", "node");
typed_id!(SnapshotId, "snap_", "snapshot");
typed_id!(CredentialId, "cred_", "credential");
typed_id!(KeyId, "key_", "API key");
typed_id!(TenantKeyId, "tk_", "tenant key");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_parse_back() {
        let id = SessionId::generate();
        assert_eq!(id.as_str().parse::<SessionId>().unwrap(), id);
    }

    #[test]
    fn hostile_ids_are_rejected() {
        for bad in ["", "ses_", "ses_../../etc/passwd", "sbx_abcdefghijabcdefghij", "ses_ABCDEFGHIJABCDEFGHIJ"] {
            assert!(bad.parse::<SessionId>().is_err(), "{bad}");
        }
    }
}
