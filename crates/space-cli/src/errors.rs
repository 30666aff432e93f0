//! How `space` reports a failed command: `error: …` for people, or under `--json` one line of
//! `{"error":{"code","message","status"}}` on stderr (stdout carries only results, so a
//! script can parse each stream on its own).

use serde_json::json;

use crate::client::ApiFailure;

/// The code of failures that never reached the API.
const CONNECTION: &str = "connection_failed";
const CLI: &str = "cli_error";

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

fn is_connect(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<reqwest::Error>().is_some_and(|r| r.is_connect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

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
