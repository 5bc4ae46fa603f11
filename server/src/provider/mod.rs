//! Providers: what actually delivers a message to the messaging network.
//!
//! The send pipeline talks to a `Provider` only after every check has passed. The
//! built-in simulator is the default, so the gateway runs with no external service; the
//! Evolution-compatible adapter (`evolution`) implements the same trait.

pub mod evolution;
pub mod simulator;

pub use simulator::Simulator;

use crate::media::Media;
use async_trait::async_trait;

/// The providers an instance can be created with (its `provider`).
pub const NAMES: &[&str] = &["simulator", "evolution"];

/// What to deliver.
#[derive(Clone, Debug)]
pub struct OutboundMessage {
    /// Recipient, E.164.
    pub to: String,
    /// Text body (text sends) or caption (media sends).
    pub text: Option<String>,
    /// Media, for media sends.
    pub media: Option<Media>,
    /// The gateway request that sends it (`x-request-id`), passed to the provider as
    /// `X-Request-Id` so a message can be followed into the provider's logs.
    pub request_id: Option<String>,
}

/// The instance a message goes out through.
#[derive(Clone, Debug)]
pub struct SendingInstance {
    pub id: String,
    pub name: String,
    pub connection_state: String,
    /// The provider the instance was created with (`simulator`, `evolution`).
    pub provider: String,
}

/// The provider accepted the message.
#[derive(Clone, Debug)]
pub struct ProviderReceipt {
    /// The messaging network's message id.
    pub message_id: String,
    /// Status reported by the provider, e.g. `sent`.
    pub status: String,
}

/// The provider did not accept the message.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("the instance is not connected (state {0})")]
    NotConnected(String),
    #[error("the provider refused the message: {0}")]
    Rejected(String),
    #[error("the provider did not answer within {0} ms")]
    Timeout(u64),
    #[error("the provider could not be reached: {0}")]
    Unavailable(String),
    #[error("the recipient is not on the messaging network: {0}")]
    NotOnNetwork(String),
    #[error("the provider failed after receiving the message; it may have been sent: {0}")]
    OutcomeUnknown(String),
}

impl ProviderError {
    /// Short code for the log and the `message.failed` event.
    pub fn code(&self) -> &'static str {
        match self {
            ProviderError::NotConnected(_) => "instance_not_connected",
            ProviderError::Rejected(_) => "provider_rejected",
            ProviderError::Timeout(_) => "provider_timeout",
            ProviderError::Unavailable(_) => "provider_unavailable",
            ProviderError::NotOnNetwork(_) => "recipient_not_on_network",
            ProviderError::OutcomeUnknown(_) => "provider_outcome_unknown",
        }
    }

    /// Whether the message may have gone out anyway (a timeout, or a provider failure
    /// after it took the request): such a send is recorded as `unknown`, keeps its
    /// quota, and writes no `message.failed`, until the provider's own event for it
    /// settles it.
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, ProviderError::Timeout(_) | ProviderError::OutcomeUnknown(_))
    }
}

/// Delivers messages through connected instances.
#[async_trait]
pub trait Provider: Send + Sync + 'static {
    /// Name stored on instances created with this provider.
    fn name(&self) -> &'static str;

    /// Sends one message. The pipeline bounds the call with the provider timeout.
    async fn send(
        &self,
        instance: &SendingInstance,
        message: &OutboundMessage,
    ) -> Result<ProviderReceipt, ProviderError>;
}

/// The providers of a gateway: each instance's sends go to the provider it was
/// created with.
pub struct Router {
    pub simulator: Simulator,
    pub evolution: Option<evolution::Evolution>,
}

#[async_trait]
impl Provider for Router {
    fn name(&self) -> &'static str {
        "router"
    }

    async fn send(
        &self,
        instance: &SendingInstance,
        message: &OutboundMessage,
    ) -> Result<ProviderReceipt, ProviderError> {
        match (instance.provider.as_str(), &self.evolution) {
            ("evolution", Some(evolution)) => Provider::send(evolution, instance, message).await,
            ("evolution", None) => {
                Err(ProviderError::Unavailable("the evolution provider is not configured on this gateway".into()))
            }
            _ => self.simulator.send(instance, message).await,
        }
    }
}
