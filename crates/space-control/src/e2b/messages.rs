//! envd's messages (`process.proto`, `filesystem.proto`) in protobuf's JSON mapping: fields in
//! lowerCamelCase (the proto names are accepted too), `bytes` as base64, 64-bit integers as
//! strings, enums by name (numbers accepted), unknown fields ignored.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::{Engine, alphabet};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A `bytes` field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct B64(pub Vec<u8>);

impl Serialize for B64 {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for B64 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        // The mapping allows either alphabet, with or without padding.
        STANDARD_LENIENT.decode(&text).or_else(|_| URL_LENIENT.decode(&text)).map(B64).map_err(serde::de::Error::custom)
    }
}

const LENIENT: GeneralPurposeConfig =
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
const STANDARD_LENIENT: GeneralPurpose = GeneralPurpose::new(&alphabet::STANDARD, LENIENT);
const URL_LENIENT: GeneralPurpose = GeneralPurpose::new(&alphabet::URL_SAFE, LENIENT);

/// An `int64` field: written as a string, read from a string or a number.
fn int64<S: Serializer>(value: &i64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&value.to_string())
}

// ---- process.proto ----

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProcessConfig {
    pub cmd: String,
    pub args: Vec<String>,
    pub envs: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PtySize {
    pub cols: u32,
    pub rows: u32,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Pty {
    pub size: Option<PtySize>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct StartRequest {
    pub process: ProcessConfig,
    pub pty: Option<Pty>,
    pub tag: Option<String>,
    /// Absent means true (older clients).
    pub stdin: Option<bool>,
}

/// Which process a call is about.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ProcessSelector {
    pub pid: Option<u32>,
    pub tag: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SelectorRequest {
    pub process: ProcessSelector,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct UpdateRequest {
    pub process: ProcessSelector,
    pub pty: Option<Pty>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ProcessInput {
    pub stdin: Option<B64>,
    pub pty: Option<B64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SendInputRequest {
    pub process: ProcessSelector,
    pub input: ProcessInput,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SendSignalRequest {
    pub process: ProcessSelector,
    #[serde(deserialize_with = "signal")]
    pub signal: i32,
}

fn signal<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i32, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Number(i32),
        Name(String),
    }
    Ok(match Option::<Either>::deserialize(deserializer)? {
        Some(Either::Number(n)) => n,
        Some(Either::Name(name)) => match name.as_str() {
            "SIGNAL_SIGKILL" => 9,
            "SIGNAL_SIGTERM" => 15,
            _ => 0,
        },
        None => 0,
    })
}

/// One message of `StreamInput`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct StreamInputRequest {
    pub start: Option<SelectorRequest>,
    pub data: Option<StreamInputData>,
    pub keepalive: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct StreamInputData {
    pub input: ProcessInput,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ProcessEvent {
    Start { pid: u32 },
    Data(DataEvent),
    End(EndEvent),
    Keepalive {},
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum DataEvent {
    Stdout(B64),
    Stderr(B64),
    Pty(B64),
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndEvent {
    pub exit_code: i32,
    pub exited: bool,
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `StartResponse` and `ConnectResponse`.
#[derive(Debug, Clone, Serialize)]
pub struct EventMessage {
    pub event: ProcessEvent,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProcessInfo {
    pub config: ProcessConfig,
    pub pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ListResponse {
    pub processes: Vec<ProcessInfo>,
}

/// The empty message many calls answer.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Empty {}

// ---- filesystem.proto ----

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct PathRequest {
    pub path: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct MoveRequest {
    pub source: String,
    pub destination: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ListDirRequest {
    pub path: String,
    pub depth: u32,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WatchDirRequest {
    pub path: String,
    pub recursive: bool,
    #[serde(alias = "include_entry")]
    pub include_entry: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WatcherRequest {
    #[serde(alias = "watcher_id")]
    pub watcher_id: String,
}

pub const FILE_TYPES: [&str; 4] =
    ["FILE_TYPE_UNSPECIFIED", "FILE_TYPE_FILE", "FILE_TYPE_DIRECTORY", "FILE_TYPE_SYMLINK"];
pub const EVENT_TYPES: [&str; 6] = [
    "EVENT_TYPE_UNSPECIFIED",
    "EVENT_TYPE_CREATE",
    "EVENT_TYPE_WRITE",
    "EVENT_TYPE_REMOVE",
    "EVENT_TYPE_RENAME",
    "EVENT_TYPE_CHMOD",
];

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryInfo {
    pub name: String,
    #[serde(rename = "type")]
    pub file_type: &'static str,
    pub path: String,
    #[serde(serialize_with = "int64")]
    pub size: i64,
    pub mode: u32,
    pub permissions: String,
    pub owner: String,
    pub group: String,
    pub modified_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    #[serde(skip_serializing_if = "space_proto::FileMetadata::is_empty")]
    pub metadata: space_proto::FileMetadata,
}

#[derive(Debug, Clone, Serialize)]
pub struct EntryMessage {
    pub entry: EntryInfo,
}

#[derive(Debug, Clone, Serialize)]
pub struct ListDirResponse {
    pub entries: Vec<EntryInfo>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FilesystemEvent {
    pub name: String,
    #[serde(rename = "type")]
    pub event_type: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum WatchDirResponse {
    Start {},
    Filesystem(Box<FilesystemEvent>),
    Keepalive {},
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateWatcherResponse {
    pub watcher_id: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct WatcherEvents {
    pub events: Vec<FilesystemEvent>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_follow_the_json_mapping() {
        let start: StartRequest = serde_json::from_str(
            r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"}},"stdin":false,"unknown":3}"#,
        )
        .unwrap();
        assert_eq!(start.process.args[2], "echo hi");
        assert_eq!(start.stdin, Some(false));
        let event = EventMessage { event: ProcessEvent::Data(DataEvent::Stdout(B64(b"hi\n".to_vec()))) };
        assert_eq!(serde_json::to_string(&event).unwrap(), r#"{"event":{"data":{"stdout":"aGkK"}}}"#);
        let end =
            ProcessEvent::End(EndEvent { exit_code: 1, exited: true, status: "exit status 1".into(), error: None });
        assert_eq!(
            serde_json::to_string(&end).unwrap(),
            r#"{"end":{"exitCode":1,"exited":true,"status":"exit status 1"}}"#
        );
        let input: SendInputRequest = serde_json::from_str(r#"{"process":{"pid":7},"input":{"stdin":"aGk"}}"#).unwrap();
        assert_eq!(input.input.stdin.unwrap().0, b"hi");
        let kill: SendSignalRequest =
            serde_json::from_str(r#"{"process":{"pid":7},"signal":"SIGNAL_SIGKILL"}"#).unwrap();
        assert_eq!(kill.signal, 9);
    }
}
