//! The sandbox's DNS responder: an allowed name resolves to the gateway's address (so the
//! connection reaches the transparent interception, which checks it again), anything else is
//! NXDOMAIN. Packets are hostile: malformed ones are dropped, never answered with a panic.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};
use space_api::egress::{AuditDecision, normalize_host};

use crate::{GATEWAY_ADDR, SandboxContext, SessionEgress};

/// How long a client may cache an answer: short, so policy changes apply soon.
const TTL: u32 = 5;
/// Largest datagram read (EDNS payloads beyond it are not needed for our answers).
const MAX_PACKET: usize = 4096;

pub(crate) async fn serve(socket: tokio::net::UdpSocket, context: Arc<SandboxContext>) {
    let mut packet = vec![0u8; MAX_PACKET];
    loop {
        let (len, peer) = match socket.recv_from(&mut packet).await {
            Ok(received) => received,
            Err(e) => {
                tracing::debug!(sandbox = %context.sandbox, "dns receive: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // The reply leaves the socket the query came in on. Inside the sandbox every address
        // is local, and the kernel is expected to pick the queried address as the reply's
        // source, which resolvers that check it (glibc) need; if not, IP_PKTINFO would do it
        // (to be verified in a real sandbox).
        if let Some(reply) = handle(&context, &packet[..len], peer)
            && let Err(e) = socket.send_to(&reply, peer).await
        {
            tracing::debug!(sandbox = %context.sandbox, "dns reply to {peer}: {e}");
        }
    }
}

/// The reply to one datagram (none for garbage), auditing the lookup.
fn handle(context: &SandboxContext, packet: &[u8], peer: SocketAddr) -> Option<Vec<u8>> {
    let current = context.current();
    let (reply, lookup) = answer(packet, current.as_ref().map(|(_, egress)| egress.as_ref()))?;
    if let (Some((session, _)), Some(lookup)) = (current, lookup) {
        let mut event = crate::proxy::audit_event(&session, "dns", &lookup.name, 53);
        event.method = Some(lookup.record_type);
        if !lookup.allowed {
            event.decision = AuditDecision::Denied;
            event.reason = Some("name not allowed".into());
        }
        context.audit(event);
    } else {
        tracing::trace!(%peer, "dns query without a session");
    }
    Some(reply)
}

/// What was asked, and whether it was allowed.
#[derive(Debug, PartialEq, Eq)]
struct Lookup {
    name: String,
    record_type: String,
    allowed: bool,
}

/// The reply to `packet` given the session's egress (`None`: deny everything).
fn answer(packet: &[u8], egress: Option<&SessionEgress>) -> Option<(Vec<u8>, Option<Lookup>)> {
    let query = Message::from_vec(packet).ok()?;
    if query.message_type() != MessageType::Query {
        return None;
    }
    let mut reply = Message::new();
    reply
        .set_id(query.id())
        .set_message_type(MessageType::Response)
        .set_op_code(query.op_code())
        .set_recursion_desired(query.recursion_desired())
        .set_recursion_available(true)
        .set_authoritative(true);
    if query.op_code() != OpCode::Query {
        reply.set_response_code(ResponseCode::NotImp);
        return Some((reply.to_vec().ok()?, None));
    }
    let [question] = query.queries() else {
        reply.set_response_code(ResponseCode::FormErr);
        return Some((reply.to_vec().ok()?, None));
    };
    reply.add_query(question.clone());
    let name = normalize_host(&question.name().to_ascii());
    let allowed = egress.is_some_and(|egress| !name.is_empty() && egress.allows_host(&name));
    if !allowed {
        reply.set_response_code(ResponseCode::NXDomain);
    } else if question.query_type() == RecordType::A && question.query_class() == DNSClass::IN {
        reply.add_answer(Record::from_rdata(question.name().clone(), TTL, RData::A(A(GATEWAY_ADDR))));
    }
    // Allowed, other types (AAAA, ...): no data, so clients fall back to the IPv4 address.
    let lookup = Lookup { name, record_type: question.query_type().to_string(), allowed };
    Some((reply.to_vec().ok()?, Some(lookup)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use hickory_proto::rr::Name;
    use space_api::egress::NetworkPolicy;
    use std::str::FromStr;

    fn egress() -> SessionEgress {
        SessionEgress {
            policy: NetworkPolicy { allow: vec!["*.pypi.org".into()], ..Default::default() },
            ca: crate::SessionCa { cert_pem: String::new(), key_pem: String::new() },
            grants: vec![crate::Grant {
                credential_id: space_api::CredentialId::generate(),
                credential: "gh".into(),
                hosts: vec!["api.github.com".into()],
                header_name: "Authorization".into(),
                header_value: "Bearer x".into(),
                secret: "x".into(),
                placeholder: None,
                expires_at: None,
                rate_limit_per_min: None,
                unavailable: None,
            }],
        }
    }

    fn query(name: &str, record_type: RecordType) -> Vec<u8> {
        let mut message = Message::new();
        message.set_id(4242).set_recursion_desired(true);
        message.add_query(Query::query(Name::from_str(name).unwrap(), record_type));
        message.to_vec().unwrap()
    }

    fn reply(packet: &[u8], egress: Option<&SessionEgress>) -> (Message, Option<Lookup>) {
        let (bytes, lookup) = answer(packet, egress).unwrap();
        (Message::from_vec(&bytes).unwrap(), lookup)
    }

    #[test]
    fn allowed_names_resolve_to_the_gateway() {
        let egress = egress();
        let (message, lookup) = reply(&query("Files.PyPI.org.", RecordType::A), Some(&egress));
        assert_eq!(message.id(), 4242);
        assert_eq!(message.response_code(), ResponseCode::NoError);
        assert_eq!(message.answers().len(), 1);
        assert_eq!(message.answers()[0].data(), &RData::A(A(GATEWAY_ADDR)));
        assert_eq!(message.answers()[0].ttl(), TTL);
        assert_eq!(lookup.unwrap(), Lookup { name: "files.pypi.org".into(), record_type: "A".into(), allowed: true });
        // Granted hosts count as allowed.
        let (message, _) = reply(&query("api.github.com.", RecordType::A), Some(&egress));
        assert_eq!(message.answers().len(), 1);
        // AAAA: no data, no error.
        let (message, _) = reply(&query("files.pypi.org.", RecordType::AAAA), Some(&egress));
        assert_eq!(message.response_code(), ResponseCode::NoError);
        assert!(message.answers().is_empty());
    }

    #[test]
    fn other_names_do_not_exist() {
        let egress = egress();
        let (message, lookup) = reply(&query("pypi.org.", RecordType::A), Some(&egress));
        assert_eq!(message.response_code(), ResponseCode::NXDomain);
        assert!(message.answers().is_empty());
        assert!(!lookup.unwrap().allowed);
        // No session: nothing resolves.
        let (message, _) = reply(&query("files.pypi.org.", RecordType::A), None);
        assert_eq!(message.response_code(), ResponseCode::NXDomain);
    }

    #[test]
    fn garbage_is_ignored() {
        assert!(answer(&[], None).is_none());
        assert!(answer(&[1, 2, 3, 4, 5], None).is_none());
        let mut packet = query("files.pypi.org.", RecordType::A);
        packet.truncate(packet.len() - 3);
        assert!(answer(&packet, Some(&egress())).is_none());
        for seed in 0..2000u32 {
            let junk: Vec<u8> =
                (0..(seed % 64)).map(|i| (seed.wrapping_mul(2654435761).wrapping_add(i * 40503) >> 7) as u8).collect();
            let _ = answer(&junk, Some(&egress()));
        }
        // A response is not answered.
        let mut message = Message::from_vec(&query("a.pypi.org.", RecordType::A)).unwrap();
        message.set_message_type(MessageType::Response);
        assert!(answer(&message.to_vec().unwrap(), Some(&egress())).is_none());
    }
}
