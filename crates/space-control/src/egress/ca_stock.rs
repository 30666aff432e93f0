//! Session CAs made ahead of time. A session's gateway CA (an ECDSA P-256 key and a
//! certificate naming the session) is a key generation and a signature; made on the create's
//! path, they delayed every create. A background task keeps a few made, each with the id of
//! the session it will belong to, and a create takes one, or makes its own when none is left
//! (in a burst). The keys are in clear only in this process's memory, as every session's CA
//! key is once the gateway holds it; a create seals its key for its tenant as before.

use std::sync::{Arc, Mutex};

use space_api::SessionId;
use space_gateway::SessionCa;
use tokio::sync::Notify;

use crate::error::{AppError, AppResult};

/// How many are kept made: a burst takes the rest on its path.
const STOCK: usize = 4;

/// The CAs made ahead, with their sessions' ids.
#[derive(Default)]
pub struct CaStock {
    made: Mutex<Vec<(SessionId, SessionCa)>>,
    /// Wakes the maker when one is taken.
    taken: Notify,
}

impl CaStock {
    /// A new session's id and CA: one made ahead if any is left, else made now.
    pub fn take(&self) -> AppResult<(SessionId, SessionCa)> {
        let made = self.made.lock().unwrap_or_else(|e| e.into_inner()).pop();
        self.taken.notify_one();
        made.map_or_else(make, Ok)
    }

    fn len(&self) -> usize {
        self.made.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Keeps [`STOCK`] made, on the blocking threads, for as long as the process runs.
    pub fn spawn_maker(self: &Arc<Self>) {
        let stock = self.clone();
        tokio::spawn(async move {
            loop {
                while stock.len() < STOCK {
                    match tokio::task::spawn_blocking(make).await {
                        Ok(Ok(made)) => stock.made.lock().unwrap_or_else(|e| e.into_inner()).push(made),
                        // A create makes its own, and says why it cannot.
                        Ok(Err(e)) => {
                            tracing::warn!(error = %e.0.message, "cannot make a session CA ahead of time");
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot make a session CA ahead of time");
                            break;
                        }
                    }
                }
                stock.taken.notified().await;
            }
        });
    }
}

/// A new session id and its CA.
fn make() -> AppResult<(SessionId, SessionCa)> {
    let id = SessionId::generate();
    let ca = make_for(&id)?;
    Ok((id, ca))
}

/// A CA for session `id`, made now (a session that has none yet).
pub fn make_for(id: &SessionId) -> AppResult<SessionCa> {
    SessionCa::generate(id)
        .map_err(|e| AppError::internal(format!("cannot create the session's certificate authority: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_ca_is_handed_out_once_with_or_without_the_maker() {
        let idle = CaStock::default();
        let (id, ca) = idle.take().unwrap();
        assert!(ca.cert_pem.contains("BEGIN CERTIFICATE") && !id.as_str().is_empty());
        let stock = Arc::new(CaStock::default());
        stock.spawn_maker();
        let (mut ids, mut certs) = (std::collections::HashSet::new(), std::collections::HashSet::new());
        for _ in 0..3 * STOCK {
            let (id, ca) = stock.take().unwrap();
            assert!(ids.insert(id), "an id was handed out twice");
            assert!(certs.insert(ca.cert_pem), "a CA was handed out twice");
            tokio::task::yield_now().await;
        }
    }
}
