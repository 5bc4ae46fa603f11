//! Idempotency keys of send-message (IETF httpapi idempotency-key draft, Stripe).
//!
//! A key is 1 to 255 printable ASCII characters, scoped to the customer and kept 24
//! hours. The pipeline decides a keyed request by its key's state before any check can
//! refuse it or write anything: read with the send's own read (`Store::send_context`)
//! after the schema check, so a key costs no read of its own; read alone first when the
//! schema check refuses the request, or would fetch its media. The first request takes
//! the key in its attempt's own write (or with its refusal's log row), so a key costs no
//! write of its own; its final answer is kept with its log row (see `store::attempts`).
//! Another request with the same key and the same body gets that answer again and sends
//! nothing; with another body it is refused (`idempotency_key_reused`); while the first
//! runs it is told to wait (`idempotency_request_in_progress`). A first request whose
//! process died is resolved with its attempt as soon as that process's lease has lapsed
//! (a few seconds, whatever the provider timeout; see `store::leases`): before the
//! provider call the key is free again; after it, the retry settles the orphan and gets
//! the answer of an unknown outcome.

use crate::store::{Answer, Claim, IdemOwner, KeySnapshot, Store, StoreError, now_ms};
use gateway_api::SendMessageRequest;
use sha2::{Digest, Sha256};

/// The request header that carries the key.
pub const HEADER: &str = "idempotency-key";
/// The answer header that marks a replay.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// Why a key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("Idempotency-Key must be 1 to 255 printable ASCII characters")]
    Malformed,
    #[error("Idempotency-Key was already used with a different request body")]
    Reused,
}

/// A keyed request answered by its key's state, without running: nothing is written
/// and nothing is counted.
#[derive(Debug)]
pub enum Decided {
    /// Answer this again (the key's first request finished).
    Replay(Answer),
    /// The key's first request is still running.
    InProgress,
    /// The key was used with another request body (`KeyError::Reused`).
    Reused,
}

/// The key of a request, if it sent one: `Ok(None)` without the header.
pub fn key_from(value: Option<&[u8]>) -> Result<Option<String>, KeyError> {
    let Some(bytes) = value else { return Ok(None) };
    if bytes.is_empty() || bytes.len() > 255 || !bytes.iter().all(|b| (0x20..=0x7e).contains(b)) {
        return Err(KeyError::Malformed);
    }
    Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
}

/// The fingerprint of a parsed request: the same for the same fields, whatever the
/// JSON's spacing or key order.
pub fn request_hash(r: &SendMessageRequest) -> String {
    let mut h = Sha256::new();
    for field in [
        &r.instance_id,
        &r.phone,
        &r.message_purpose,
        &r.message,
        &r.media_type,
        &r.mime_type,
        &r.file_name,
        &r.media,
        &r.caption,
    ] {
        match field {
            None => h.update([0u8]),
            Some(value) => {
                h.update([1u8]);
                h.update((value.len() as u64).to_be_bytes());
                h.update(value.as_bytes());
            }
        }
    }
    hex::encode(h.finalize())
}

/// The claim a request of `customer_id` with `key` runs under: a token of its own, and
/// its body's fingerprint.
pub fn owner(customer_id: &str, key: String, request: &SendMessageRequest) -> IdemOwner {
    IdemOwner {
        customer_id: customer_id.to_string(),
        key,
        owner: crate::store::new_id("req"),
        request_hash: request_hash(request),
    }
}

/// Whether the key's state lets `owner`'s request run (`None`) or decides its answer.
/// `snapshot` is the key's state when it was read already (with the send's own read);
/// else it is read here. `orphan_answer` is what an orphaned attempt's key keeps.
pub(super) async fn decide(
    store: &Store,
    owner: &IdemOwner,
    snapshot: Option<KeySnapshot>,
    orphan_answer: &Answer,
) -> Result<Option<Decided>, StoreError> {
    let now = now_ms();
    // A read: the attempt's own write takes the key (one write fewer per send); of
    // concurrent requests with one key, the one whose write lands first has it, the
    // others are told it is in progress.
    let state = match snapshot {
        Some(snapshot) => snapshot.state(owner, now),
        None => store.idempotency_state(owner, now).await?,
    };
    let claim = match state {
        // The first request's process stopped at the provider: settle its attempt as
        // an unknown outcome (the sweep does, for every orphan), and look again.
        Claim::InProgress { log_id: Some(log_id), .. } if store.attempt_orphaned(log_id).await? => {
            store.sweep_orphans(now, orphan_answer).await?;
            store.idempotency_state(owner, now).await?
        }
        // Its process stopped before its attempt row: nothing was sent, and the key is
        // free (the attempt's write takes it only if it still is).
        Claim::InProgress { log_id: None, owner_lease: Some(lease), .. }
            if store.lease() != Some(lease) && !store.lease_alive(lease).await? =>
        {
            Claim::Claimed
        }
        claim => claim,
    };
    Ok(match claim {
        Claim::Claimed => None,
        Claim::Replay(answer) => Some(Decided::Replay(answer)),
        Claim::Mismatch => Some(Decided::Reused),
        Claim::InProgress { .. } => Some(Decided::InProgress),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_one_to_255_printable_ascii() {
        assert_eq!(key_from(None).unwrap(), None);
        assert_eq!(key_from(Some(b"order-42")).unwrap().as_deref(), Some("order-42"));
        assert_eq!(key_from(Some("k".repeat(255).as_bytes())).unwrap().map(|k| k.len()), Some(255));
        for bad in [&b""[..], "k".repeat(256).as_bytes(), b"tab\there", b"caf\xc3\xa9", b"nl\n"] {
            assert!(matches!(key_from(Some(bad)), Err(KeyError::Malformed)), "{bad:?}");
        }
    }

    #[test]
    fn the_fingerprint_tells_fields_apart() {
        let a = SendMessageRequest { message: Some("ab".into()), caption: None, ..Default::default() };
        let b = SendMessageRequest { message: Some("a".into()), caption: Some("b".into()), ..Default::default() };
        let c = SendMessageRequest { message: Some("ab".into()), caption: Some(String::new()), ..Default::default() };
        assert_ne!(request_hash(&a), request_hash(&b));
        assert_ne!(request_hash(&a), request_hash(&c));
        assert_eq!(request_hash(&a), request_hash(&a.clone()));
    }
}
