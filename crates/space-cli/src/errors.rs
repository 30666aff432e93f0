//! How `space` reports a failed command: `error: …` for people, or under `--json` one line of
//! `{"error":{"code","message","status"}}` on stderr (stdout carries only results, so a
//! script can parse each stream on its own).

use serde_json::json;

use crate::client::ApiFailure;

/// The code of failures that never reached the API.
const CONNECTION: &str = "connection_failed";
const CLI: &str = "cli_error";
/// The code of a command line that clap refused (unknown flag, bad value, missing argument).
const USAGE: &str = "usage_error";

pub fn report(e: &anyhow::Error, json: bool) {
    if json {
        eprintln!("{}", to_json(e));
    } else {
        eprintln!("error: {e:#}");
    }
}

fn to_json(e: &anyhow::Error) -> serde_json::Value {
    let api = e.chain().find_map(|c| c.downcast_ref::<ApiFailure>());
    // The chain's contexts ("uploading /x") then the API's own message, without the
    // "(code, HTTP n)" suffix that `code` and `status` already carry.
    let message = e
        .chain()
        .map(|c| c.downcast_ref::<ApiFailure>().map_or_else(|| c.to_string(), |a| a.message.clone()))
        .collect::<Vec<_>>()
        .join(": ");
    let code = match api {
        Some(a) => a.code.as_str(),
        None if e.chain().any(is_connect) => CONNECTION,
        None => CLI,
    };
    json!({ "error": { "code": code, "message": message, "status": api.map(|a| a.status) } })
}

/// Whether the command line asks for `--json` (before any `--`: what follows is a command's).
pub fn json_requested(args: &[String]) -> bool {
    args.iter().take_while(|a| *a != "--").any(|a| a == "--json")
}

/// The JSON error line of a command line clap refused: its first line, without clap's
/// `error: ` and usage, and the hint if there is one.
pub fn usage_json(rendered: &str, hint: Option<&str>) -> serde_json::Value {
    let first = rendered.lines().next().unwrap_or_default();
    let mut message = first.strip_prefix("error: ").unwrap_or(first).to_owned();
    if let Some(hint) = hint {
        message = format!("{message}; {hint}");
    }
    json!({ "error": { "code": USAGE, "message": message, "status": null } })
}

fn is_connect(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<reqwest::Error>().is_some_and(|r| r.is_connect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn usage_errors_are_one_json_line_with_the_hint() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(json_requested(&args(&["session", "create", "--json", "--memory", "1x"])));
        assert!(!json_requested(&args(&["exec", "sbx_1", "--", "jq", "--json"])));
        let rendered = "error: unexpected argument '-la' found\n\nUsage: space exec [OPTIONS] <ID> <COMMAND>...\n";
        assert_eq!(
            usage_json(rendered, Some("put `--` before the command: space exec sbx_1 -- ls -la")),
            json!({ "error": { "code": "usage_error", "status": null,
                "message": "unexpected argument '-la' found; put `--` before the command: space exec sbx_1 -- ls -la" } })
        );
    }

    #[test]
    fn api_errors_keep_code_status_and_context() {
        let failure = ApiFailure { code: "file_not_found".into(), message: "no such file /x".into(), status: 404 };
        let e = Err::<(), _>(failure).context("uploading /x").unwrap_err();
        assert_eq!(
            to_json(&e),
            json!({ "error": { "code": "file_not_found", "message": "uploading /x: no such file /x", "status": 404 } })
        );
        let local = anyhow::anyhow!("--env takes K=V");
        assert_eq!(
            to_json(&local),
            json!({ "error": { "code": "cli_error", "message": "--env takes K=V", "status": null } })
        );
    }
}
