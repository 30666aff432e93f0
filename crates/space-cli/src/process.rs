//! `space kill ID PID [--signal TERM]`: signal a process started in a session.

use clap::Args;
use reqwest::Method;
use space_api::SignalRequest;

use crate::client::Client;

#[derive(Args)]
pub struct KillArgs {
    /// Session id.
    id: String,
    /// Process id, as `space exec -d` printed it or `space ps ID` lists it.
    pid: u32,
    /// Signal to send: a name (`TERM`, `SIGKILL`, `int`) or a number 1-31.
    #[arg(short, long, default_value = "TERM", value_parser = parse_signal)]
    signal: i32,
}

pub async fn kill(client: &Client, args: KillArgs) -> anyhow::Result<()> {
    let path = format!("/v1/sessions/{}/processes/{}/signal", args.id, args.pid);
    let request = client.request(Method::POST, &path).json(&SignalRequest { signal: args.signal });
    client.send(request).await?;
    Ok(())
}

/// `TERM`, `SIGTERM`, `term` or `15` → 15.
pub fn parse_signal(text: &str) -> Result<i32, String> {
    let bad = || format!("{text:?} is not a signal: use a name such as TERM, INT or KILL, or a number 1-31");
    if let Ok(n) = text.parse::<i32>() {
        return space_api::signal_name(n).map(|_| n).ok_or_else(bad);
    }
    let upper = text.to_ascii_uppercase();
    let name = upper.strip_prefix("SIG").unwrap_or(&upper);
    (1..=31).find(|&n| space_api::signal_name(n) == Some(name)).ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(parse_signal("TERM"), Ok(15));
        assert_eq!(parse_signal("sigkill"), Ok(9));
        assert_eq!(parse_signal("int"), Ok(2));
        assert_eq!(parse_signal("1"), Ok(1));
        for bad in ["0", "32", "-9", "SIGFOO", "", "SIG"] {
            assert!(parse_signal(bad).is_err(), "{bad:?}");
        }
    }
}
