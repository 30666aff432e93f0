//! The transit key provider against a real OpenBao server (scripts/with-openbao.sh starts
//! one; scripts/test.sh runs this under it). Without the server this test fails.

use std::time::Duration;

use space_keys::{KeyError, KeyProvider, Sealer, TransitConfig, TransitKey, Zeroizing};

/// The server and a root token for it; set up by scripts/with-openbao.sh.
fn server() -> (String, String) {
    let var = |name: &str| {
        std::env::var(name).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| {
            panic!("{name} is not set: run this test under scripts/with-openbao.sh (scripts/test.sh does)")
        })
    };
    (var("SPACE_TEST_OPENBAO_ADDR"), var("SPACE_TEST_OPENBAO_TOKEN"))
}

/// Calls the OpenBao API as root.
async fn bao(method: reqwest::Method, path: &str, body: serde_json::Value) -> reqwest::StatusCode {
    let (address, root) = server();
    let response = reqwest::Client::new()
        .request(method, format!("{address}/v1/{path}"))
        .header("X-Vault-Token", root)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status();
    assert!(status.is_success(), "{path}: {status} {}", response.text().await.unwrap());
    status
}

/// A transit key of its own, a policy that allows space to use it, and a token with only
/// that policy: what a customer hands to space.
async fn customer_key(name: &str) -> TransitConfig {
    bao(reqwest::Method::POST, &format!("transit/keys/{name}"), serde_json::json!({})).await;
    allow(name, true).await;
    let (address, root) = server();
    let response = reqwest::Client::new()
        .post(format!("{address}/v1/auth/token/create"))
        .header("X-Vault-Token", root)
        .body(serde_json::json!({ "policies": [name], "ttl": "1h" }).to_string())
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let response: serde_json::Value = serde_json::from_slice(&response).unwrap();
    let token = response["auth"]["client_token"].as_str().unwrap().to_owned();
    TransitConfig {
        address,
        mount: "transit".into(),
        key: name.into(),
        token: Zeroizing::new(token),
        refused_addresses: None,
    }
}

/// Grants (or revokes) the key's policy: revoking is how a customer cuts space off.
async fn allow(name: &str, allowed: bool) {
    let rules = if allowed {
        ["encrypt", "decrypt", "rewrap"]
            .map(|op| format!("path \"transit/{op}/{name}\" {{ capabilities = [\"update\"] }}\n"))
            .concat()
    } else {
        "path \"nothing\" { capabilities = [\"deny\"] }".into()
    };
    bao(reqwest::Method::PUT, &format!("sys/policies/acl/{name}"), serde_json::json!({ "policy": rules })).await;
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
    )
}

#[tokio::test]
async fn revoke_restore_rotate_and_delete_a_customer_key() {
    let name = unique("space-test");
    let config = customer_key(&name).await;
    let key = std::sync::Arc::new(TransitKey::new(config.clone()).unwrap());
    let sealer = Sealer::new("tk_test", key.clone(), Duration::ZERO).unwrap();
    sealer.check().await.unwrap();
    let sealed = sealer.seal(b"marker-7f3a", "credential/t/c").await.unwrap();
    assert!(!sealed.windows(11).any(|w| w == b"marker-7f3a"));
    assert_eq!(&sealer.open(&sealed, "credential/t/c").await.unwrap()[..], b"marker-7f3a");

    // Revoked: opening and sealing fail as unavailable, naming the key.
    allow(&name, false).await;
    for err in [sealer.open(&sealed, "credential/t/c").await.unwrap_err(), sealer.seal(b"x", "o").await.unwrap_err()] {
        assert!(matches!(err, KeyError::Unavailable { .. }), "{err}");
        let message = err.to_string();
        assert!(message.contains(&name) && message.contains("403") && message.contains("re-enable"), "{message}");
    }
    // Restored: everything opens again.
    allow(&name, true).await;
    assert_eq!(&sealer.open(&sealed, "credential/t/c").await.unwrap()[..], b"marker-7f3a");

    // Rotated in the KMS: old data opens, rewrapping moves it to the new version.
    bao(reqwest::Method::POST, &format!("transit/keys/{name}/rotate"), serde_json::json!({})).await;
    assert_eq!(&sealer.open(&sealed, "credential/t/c").await.unwrap()[..], b"marker-7f3a");
    let rewrapped = sealer.rewrap(&sealed, &sealer).await.unwrap();
    assert!(String::from_utf8_lossy(&rewrapped).contains("vault:v2:"), "rewrapped to the new version");
    assert!(String::from_utf8_lossy(&sealer.seal(b"y", "o").await.unwrap()).contains("vault:v2:"));
    // Old versions retired: what still names v1 is unavailable, the rewrapped value opens.
    bao(
        reqwest::Method::POST,
        &format!("transit/keys/{name}/config"),
        serde_json::json!({ "min_decryption_version": 2 }),
    )
    .await;
    let err = sealer.open(&sealed, "credential/t/c").await.unwrap_err();
    assert!(matches!(err, KeyError::Unavailable { .. }), "{err}");
    assert_eq!(&sealer.open(&rewrapped, "credential/t/c").await.unwrap()[..], b"marker-7f3a");

    // A data key wrapped by another customer's key is refused as the wrong key.
    let other_name = unique("space-test-other");
    let other = Sealer::new(
        "tk_test",
        std::sync::Arc::new(TransitKey::new(customer_key(&other_name).await).unwrap()),
        Duration::ZERO,
    )
    .unwrap();
    let foreign = other.seal(b"z", "o").await.unwrap();
    let err = sealer.open(&foreign, "o").await.unwrap_err();
    assert!(matches!(err, KeyError::WrongKey { .. } | KeyError::Unavailable { .. }), "{err}");
    assert!(!matches!(err, KeyError::Corrupt { .. }));

    // Deleted: unavailable, not garbage.
    bao(reqwest::Method::POST, &format!("transit/keys/{name}/config"), serde_json::json!({ "deletion_allowed": true }))
        .await;
    bao(reqwest::Method::DELETE, &format!("transit/keys/{name}"), serde_json::json!({})).await;
    allow(&name, true).await;
    let err = key.unwrap(b"vault:v2:AAAA").await.unwrap_err();
    assert!(matches!(err, KeyError::Unavailable { .. }), "{err}");
    let err = sealer.open(&rewrapped, "credential/t/c").await.unwrap_err();
    assert!(matches!(err, KeyError::Unavailable { .. }), "{err}");
}
