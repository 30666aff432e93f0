//! What a sign-in by a human needs: an unguessable `state`, a PKCE verifier and its S256
//! challenge (RFC 7636), and the authorization URL that carries them.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use sha2::{Digest, Sha256};
use url::Url;
use zeroize::Zeroizing;

/// A PKCE pair: the verifier stays with the control plane, the challenge goes to the
/// authorization server.
pub struct Pkce {
    pub verifier: Zeroizing<String>,
    pub challenge: String,
}

impl Pkce {
    /// 32 random bytes as the verifier (43 characters), S256 as the method.
    pub fn generate() -> Pkce {
        let verifier = Zeroizing::new(random_token(32));
        let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
        Pkce { verifier, challenge }
    }
}

/// 32 random bytes, base64url: what binds a redirect to the sign-in that asked for it.
pub fn random_state() -> String {
    random_token(32)
}

fn random_token(bytes: usize) -> String {
    let mut raw = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut raw);
    URL_SAFE_NO_PAD.encode(raw)
}

/// `authorize` with the authorization-code request's parameters added (RFC 6749 section
/// 4.1.1, RFC 7636 section 4.3).
pub fn authorization_url(
    authorize: &Url,
    client_id: &str,
    redirect_uri: &str,
    scopes: &[String],
    state: &str,
    challenge: &str,
) -> Url {
    let mut url = authorize.clone();
    {
        let mut query = url.query_pairs_mut();
        query
            .append_pair("response_type", "code")
            .append_pair("client_id", client_id)
            .append_pair("redirect_uri", redirect_uri)
            .append_pair("state", state)
            .append_pair("code_challenge", challenge)
            .append_pair("code_challenge_method", "S256");
        if !scopes.is_empty() {
            query.append_pair("scope", &scopes.join(" "));
        }
    }
    url
}
