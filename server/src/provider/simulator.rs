//! The built-in simulator: accepts every send on a connected instance and returns a
//! fresh message id, except for two reserved numbers that exercise failure paths:
//!
//! * `+15005550001`: the provider refuses the message (the send answers 502);
//! * `+15005550002`: the provider never answers (502 after the provider timeout);
//! * `+15005550003`: the provider takes the message and the connection breaks before
//!   its answer (502 at once; the outcome is unknown, as after a timeout);
//! * `+15005550004`: the provider takes the message and answers after 2 s (a slow
//!   provider; 200 if the provider timeout is longer).

use super::{OutboundMessage, Provider, ProviderError, ProviderReceipt, SendingInstance};
use async_trait::async_trait;

/// Recipient the simulator refuses.
pub const REFUSED_NUMBER: &str = "+15005550001";
/// Recipient for which the simulator never answers.
pub const TIMEOUT_NUMBER: &str = "+15005550002";
/// Recipient for which the connection breaks after the provider took the message.
pub const DROPPED_NUMBER: &str = "+15005550003";
/// Recipient the simulator takes a message for after `SLOW_ANSWER`.
pub const SLOW_NUMBER: &str = "+15005550004";
/// How long the simulator takes to answer for `SLOW_NUMBER`.
pub const SLOW_ANSWER: std::time::Duration = std::time::Duration::from_secs(2);

/// The simulator provider.
#[derive(Clone, Debug, Default)]
pub struct Simulator;

#[async_trait]
impl Provider for Simulator {
    fn name(&self) -> &'static str {
        "simulator"
    }

    async fn send(
        &self,
        instance: &SendingInstance,
        message: &OutboundMessage,
    ) -> Result<ProviderReceipt, ProviderError> {
        if instance.connection_state != "open" {
            return Err(ProviderError::NotConnected(instance.connection_state.clone()));
        }
        match message.to.as_str() {
            REFUSED_NUMBER => Err(ProviderError::Rejected("recipient refused by the simulator".to_string())),
            DROPPED_NUMBER => {
                Err(ProviderError::OutcomeUnknown("the connection closed before the provider answered".to_string()))
            }
            SLOW_NUMBER => {
                tokio::time::sleep(SLOW_ANSWER).await;
                Ok(receipt())
            }
            TIMEOUT_NUMBER => {
                std::future::pending::<()>().await;
                unreachable!("a pending future never completes")
            }
            _ => Ok(receipt()),
        }
    }
}

/// A taken message's receipt, with a fresh id.
fn receipt() -> ProviderReceipt {
    ProviderReceipt {
        message_id: format!("SIM{}", uuid::Uuid::new_v4().simple().to_string().to_ascii_uppercase()),
        status: "sent".to_string(),
    }
}
