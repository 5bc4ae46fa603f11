//! What became of a message: its log row (allowed or refused, sent, failed, unknown)
//! joined with the provider's reports (`message_status`: when it was delivered, read or
//! failed). One definition of each state, used twice: [`DeliveryState::of`] for a row
//! the dashboard shows, and [`DeliveryState::condition`] for the filter and the CSV
//! export, so a row is always listed under the state it shows.

use super::{Cols, LogEntry, StoreError};

/// The provider's reports (`s`) joined to the message log `m`: `message_log m {STATUS_JOIN}`.
pub(super) const STATUS_JOIN: &str = "LEFT JOIN message_status s \
     ON s.instance_id = m.instance_id AND s.external_message_id = m.provider_message_id";

/// The report columns selected beside a log row.
pub(super) const STATUS_COLUMNS: &str =
    "s.status AS delivery_status, s.delivered_at, s.read_at, s.failed_at, m.ack_checked_at";

/// A message's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeliveryState {
    /// The attempt is waiting for the provider's answer.
    Pending,
    /// Allowed and accepted by the provider; no report yet.
    Sent,
    Delivered,
    Read,
    /// The provider refused it, or reported a failure, or never acknowledged it.
    Failed,
    /// The provider may have taken it; nothing settled it.
    Unknown,
    /// A check or a policy refused it.
    Refused,
}

impl DeliveryState {
    pub const ALL: [DeliveryState; 7] = [
        DeliveryState::Sent,
        DeliveryState::Delivered,
        DeliveryState::Read,
        DeliveryState::Failed,
        DeliveryState::Unknown,
        DeliveryState::Pending,
        DeliveryState::Refused,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Sent => "sent",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Read => "read",
            DeliveryState::Failed => "failed",
            DeliveryState::Unknown => "unknown",
            DeliveryState::Refused => "refused",
        }
    }

    pub fn parse(s: &str) -> Option<DeliveryState> {
        DeliveryState::ALL.into_iter().find(|d| d.as_str() == s)
    }

    /// The partial index of the rows in this state, which its condition implies: few
    /// rows, whatever the customer's log holds. A statement on SQLite, which has no
    /// statistics of a gateway's store, names it (`INDEXED BY`); without the name the
    /// pending filter reads the customer's whole log by `message_log_customer`, and the
    /// unknown filter with an instance that instance's log by `message_log_instance`.
    pub fn index(self) -> Option<&'static str> {
        match self {
            DeliveryState::Pending => Some("message_log_pending"),
            DeliveryState::Unknown => Some("message_log_customer_unknown"),
            _ => None,
        }
    }

    /// The SQL condition (on `message_log m {STATUS_JOIN}`) of the rows in this state.
    pub fn condition(self) -> &'static str {
        match self {
            DeliveryState::Refused => "m.decision = 'refused'",
            DeliveryState::Pending => "m.decision = 'allowed' AND m.status = 'pending'",
            DeliveryState::Unknown => "m.decision = 'allowed' AND m.status = 'unknown'",
            DeliveryState::Failed => {
                "m.decision = 'allowed' AND (m.status = 'failed' OR (m.status = 'sent' AND \
                 (s.failed_at IS NOT NULL OR (m.ack_checked_at IS NOT NULL AND s.delivered_at IS NULL))))"
            }
            DeliveryState::Read => {
                "m.decision = 'allowed' AND m.status = 'sent' AND s.read_at IS NOT NULL AND s.failed_at IS NULL"
            }
            DeliveryState::Delivered => {
                "m.decision = 'allowed' AND m.status = 'sent' AND s.delivered_at IS NOT NULL AND s.read_at IS NULL \
                 AND s.failed_at IS NULL"
            }
            // "No report of delivery or failure" as an anti-join, not as the left join's
            // `s.delivered_at IS NULL AND s.failed_at IS NULL` (the same rows: one report
            // row a message, by its primary key). PostgreSQL estimates that filter from
            // the reports' own nulls, not the messages without a report: one row where a
            // large customer has 184,058, so it hashed every report and sorted the
            // customer's log (1.2 to 1.3 s at a million rows) instead of reading the log
            // backward until the page was full (1.3 to 2.1 ms). BENCHMARKS.md, issue 22.
            DeliveryState::Sent => {
                "m.decision = 'allowed' AND m.status = 'sent' AND m.ack_checked_at IS NULL AND NOT EXISTS \
                 (SELECT 1 FROM message_status x WHERE x.instance_id = m.instance_id \
                 AND x.external_message_id = m.provider_message_id \
                 AND (x.delivered_at IS NOT NULL OR x.failed_at IS NOT NULL))"
            }
        }
    }
}

/// The provider's reports on a message, and the watchdog's verdict.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delivery {
    /// The provider's latest status word (`DELIVERY_ACK`, `READ`, `ERROR`, ...).
    pub status: Option<String>,
    pub delivered_at: Option<i64>,
    pub read_at: Option<i64>,
    pub failed_at: Option<i64>,
    /// When the watchdog found no delivery acknowledgement (`no_delivery_ack`).
    pub ack_checked_at: Option<i64>,
}

impl Delivery {
    pub(super) fn from_cols(r: &impl Cols) -> Result<Delivery, StoreError> {
        Ok(Delivery {
            status: r.col("delivery_status")?,
            delivered_at: r.col("delivered_at")?,
            read_at: r.col("read_at")?,
            failed_at: r.col("failed_at")?,
            ack_checked_at: r.col("ack_checked_at")?,
        })
    }
}

impl DeliveryState {
    /// The state of a log row with its reports, and the error a failure had. Agrees
    /// with [`DeliveryState::condition`].
    pub fn of(entry: &LogEntry, d: &Delivery) -> (DeliveryState, Option<String>) {
        if entry.decision == "refused" {
            return (DeliveryState::Refused, entry.error_code.clone());
        }
        match entry.status.as_str() {
            "pending" => (DeliveryState::Pending, None),
            "unknown" => (DeliveryState::Unknown, entry.error_code.clone()),
            "failed" => (DeliveryState::Failed, entry.error_code.clone()),
            _ if d.failed_at.is_some() => (DeliveryState::Failed, Some("provider_error".into())),
            _ if d.ack_checked_at.is_some() && d.delivered_at.is_none() => {
                (DeliveryState::Failed, Some("no_delivery_ack".into()))
            }
            _ if d.read_at.is_some() => (DeliveryState::Read, None),
            _ if d.delivered_at.is_some() => (DeliveryState::Delivered, None),
            _ => (DeliveryState::Sent, None),
        }
    }
}
