//! An OAuth 2.0 provider for the OAuth tests, served by the test upstream's HTTPS server under
//! `/oauth/`: `/oauth/authorize` (redirects back with a code, remembering the PKCE challenge)
//! and `/oauth/token` (client credentials, refresh tokens that rotate, authorization codes
//! whose PKCE verifier it checks), with one registered client. A test can make it fail or
//! answer garbage, and read what it issued and how often it was asked.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use sha2::{Digest, Sha256};

use super::upstream::random_hex;

pub struct Provider {
    pub client_id: String,
    pub client_secret: String,
    state: Mutex<State>,
}

struct State {
    expires_in: u64,
    rotate: bool,
    /// An answer every token request gets instead: (status, body).
    failure: Option<(u16, String)>,
    refresh_tokens: HashSet<String>,
    /// Code → (redirect_uri, PKCE challenge).
    codes: HashMap<String, (String, String)>,
    issued: Vec<String>,
    /// Refresh tokens handed out, in order.
    issued_refresh: Vec<String>,
    token_requests: usize,
}

/// A response: status, headers, body.
pub type Answer = (u16, Vec<(String, String)>, String);

impl Default for Provider {
    fn default() -> Self {
        Provider {
            client_id: format!("space-test-client-{}", random_hex(4)),
            client_secret: format!("cs-{}", random_hex(16)),
            state: Mutex::new(State {
                expires_in: 3600,
                rotate: true,
                failure: None,
                refresh_tokens: HashSet::new(),
                codes: HashMap::new(),
                issued: Vec::new(),
                issued_refresh: Vec::new(),
                token_requests: 0,
            }),
        }
    }
}

fn json(status: u16, body: serde_json::Value) -> Answer {
    (status, vec![("content-type".into(), "application/json".into())], body.to_string())
}

fn oauth_error(status: u16, error: &str) -> Answer {
    json(status, serde_json::json!({ "error": error }))
}

fn pairs(query: &str) -> HashMap<String, String> {
    let url = reqwest::Url::parse(&format!("http://x/?{query}")).unwrap();
    url.query_pairs().map(|(k, v)| (k.into_owned(), v.into_owned())).collect()
}

impl Provider {
    pub fn set_expires_in(&self, secs: u64) {
        self.state.lock().unwrap().expires_in = secs;
    }

    /// Every token request gets `(status, body)` from now on; `None` ends that.
    pub fn set_failure(&self, failure: Option<(u16, &str)>) {
        self.state.lock().unwrap().failure = failure.map(|(s, b)| (s, b.to_owned()));
    }

    /// A refresh token the provider accepts.
    pub fn add_refresh_token(&self, token: &str) {
        self.state.lock().unwrap().refresh_tokens.insert(token.to_owned());
    }

    pub fn accepts_refresh_token(&self, token: &str) -> bool {
        self.state.lock().unwrap().refresh_tokens.contains(token)
    }

    /// Access tokens issued, oldest first.
    pub fn issued(&self) -> Vec<String> {
        self.state.lock().unwrap().issued.clone()
    }

    pub fn issued_refresh(&self) -> Vec<String> {
        self.state.lock().unwrap().issued_refresh.clone()
    }

    pub fn token_requests(&self) -> usize {
        self.state.lock().unwrap().token_requests
    }

    pub fn handle(&self, method: &str, path: &str, headers: &[(String, String)], body: &[u8]) -> Answer {
        let (route, query) = path.split_once('?').unwrap_or((path, ""));
        match (method, route) {
            ("GET", "/oauth/authorize") => self.authorize(&pairs(query)),
            ("POST", "/oauth/token") => self.token(headers, &pairs(&String::from_utf8_lossy(body))),
            _ => oauth_error(404, "not_found"),
        }
    }

    fn authorize(&self, q: &HashMap<String, String>) -> Answer {
        let get = |k: &str| q.get(k).cloned().unwrap_or_default();
        if get("response_type") != "code"
            || get("client_id") != self.client_id
            || get("code_challenge_method") != "S256"
        {
            return oauth_error(400, "invalid_request");
        }
        let code = format!("code-{}", random_hex(8));
        self.state.lock().unwrap().codes.insert(code.clone(), (get("redirect_uri"), get("code_challenge")));
        let location = format!("{}?code={code}&state={}", get("redirect_uri"), get("state"));
        (302, vec![("location".into(), location)], String::new())
    }

    /// The client the request authenticates as: HTTP Basic or the form.
    fn client_ok(&self, headers: &[(String, String)], form: &HashMap<String, String>) -> bool {
        let basic = headers.iter().find(|(n, _)| n == "authorization").and_then(|(_, v)| v.strip_prefix("Basic "));
        let (id, secret) = match basic {
            Some(b64) => {
                let decoded = String::from_utf8(STANDARD.decode(b64).unwrap_or_default()).unwrap_or_default();
                let (id, secret) = decoded.split_once(':').unwrap_or_default();
                (id.to_owned(), secret.to_owned())
            }
            None => (
                form.get("client_id").cloned().unwrap_or_default(),
                form.get("client_secret").cloned().unwrap_or_default(),
            ),
        };
        id == self.client_id && secret == self.client_secret
    }

    fn token(&self, headers: &[(String, String)], form: &HashMap<String, String>) -> Answer {
        let mut state = self.state.lock().unwrap();
        state.token_requests += 1;
        if let Some((status, body)) = &state.failure {
            return (*status, vec![("content-type".into(), "application/json".into())], body.clone());
        }
        if !self.client_ok(headers, form) {
            return oauth_error(401, "invalid_client");
        }
        let get = |k: &str| form.get(k).cloned().unwrap_or_default();
        let with_refresh = match get("grant_type").as_str() {
            "client_credentials" => false,
            "refresh_token" => {
                let token = get("refresh_token");
                if !state.refresh_tokens.contains(&token) {
                    return oauth_error(400, "invalid_grant");
                }
                if state.rotate {
                    state.refresh_tokens.remove(&token);
                }
                state.rotate
            }
            "authorization_code" => {
                let Some((redirect, challenge)) = state.codes.remove(&get("code")) else {
                    return oauth_error(400, "invalid_grant");
                };
                let verified = URL_SAFE_NO_PAD.encode(Sha256::digest(get("code_verifier").as_bytes())) == challenge;
                if !verified || redirect != get("redirect_uri") {
                    return oauth_error(400, "invalid_grant");
                }
                true
            }
            _ => return oauth_error(400, "unsupported_grant_type"),
        };
        let access = format!("at-{}-{}", state.issued.len() + 1, random_hex(12));
        state.issued.push(access.clone());
        let mut body =
            serde_json::json!({ "access_token": access, "token_type": "Bearer", "expires_in": state.expires_in });
        if with_refresh {
            let refresh = format!("rt-{}", random_hex(12));
            state.refresh_tokens.insert(refresh.clone());
            state.issued_refresh.push(refresh.clone());
            body["refresh_token"] = refresh.into();
        }
        json(200, body)
    }
}
