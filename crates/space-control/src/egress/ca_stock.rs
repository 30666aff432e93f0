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
    taken: Arc<Notify>,
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

    /// Keeps [`STOCK`] made, on the blocking threads, for as long as the stock is held by
    /// anyone else: between fills the maker holds only its wake-up.
    pub fn spawn_maker(self: &Arc<Self>) {
        let stock = Arc::downgrade(self);
        tokio::spawn(async move {
            while let Some(held) = stock.upgrade() {
                held.fill().await;
                let taken = held.taken.clone();
                drop(held);
                taken.notified().await;
            }
        });
    }

    async fn fill(&self) {
        while self.len() < STOCK {
            let made = tokio::task::spawn_blocking(make).await.map_err(|e| e.to_string());
            match made.and_then(|made| made.map_err(|e| e.0.message)) {
                Ok(made) => self.made.lock().unwrap_or_else(|e| e.into_inner()).push(made),
                // A create makes its own, and says why it cannot.
                Err(why) => {
                    tracing::warn!(error = %why, "cannot make a session CA ahead of time");
                    return;
                }
            }
        }
    }
}

impl Drop for CaStock {
    /// Wakes the maker, which finds the stock gone and ends.
    fn drop(&mut self) {
        self.taken.notify_one();
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

    /// Waits (a generous bound only keeps a broken maker from hanging the test) until the
    /// stock holds `n`.
    async fn filled_to(stock: &CaStock, n: usize) {
        for _ in 0..3000 {
            if stock.len() == n {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the stock holds {} after 30 s, not {n}", stock.len());
    }

    #[tokio::test]
    async fn the_maker_keeps_the_stock_full_and_a_take_without_it_makes_one() {
        let idle = CaStock::default();
        let (id, ca) = idle.take().unwrap();
        assert!(ca.cert_pem.contains("BEGIN CERTIFICATE") && !id.as_str().is_empty());
        assert_eq!(idle.len(), 0, "nothing makes ahead without the maker");
        let stock = Arc::new(CaStock::default());
        stock.spawn_maker();
        filled_to(&stock, STOCK).await;
        let made: Vec<_> = stock.made.lock().unwrap().iter().map(|(id, _)| id.clone()).collect();
        let (taken, _) = stock.take().unwrap();
        assert_eq!(Some(&taken), made.last(), "a take hands out one made ahead");
        filled_to(&stock, STOCK).await;
        assert!(stock.made.lock().unwrap().iter().all(|(id, _)| *id != taken), "handed out twice");
        // Once the maker is between fills, it does not keep the stock alive.
        let gone = Arc::downgrade(&stock);
        drop(stock);
        for _ in 0..3000 {
            if gone.upgrade().is_none() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the maker keeps the stock alive");
    }
}
