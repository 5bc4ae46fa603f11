//! Liveness of serving processes: crash detection by lease, not by the provider timeout.
//!
//! A serving process takes a lease (a row of `process_leases`) when it starts and renews
//! it every `RENEW_EVERY`; the lease lapses `TTL_MS` after its last renewal. Everything
//! the process has in flight names its lease: a pending attempt row
//! (`message_log.owner_lease`), an idempotency key taken before its attempt, a PBX event
//! claimed by its `external_message_id`. Whatever names a lapsed lease belonged to a
//! process that stopped, and is orphaned at once (`attempts::sweep_orphans`, the retry
//! paths); whatever names a live lease is never swept, however long its provider call
//! runs.
//!
//! Times are the store's clock: PostgreSQL's (`gateway_now_ms()`, migration 0012), so no
//! replica's clock decides for another; on SQLite every process shares one machine's
//! clock. A process whose renewals failed for `TTL_MS` (the store was out of its reach)
//! has a lapsed lease: another process may sweep its attempts meanwhile (their settles
//! then change nothing: `Finish` applies to a pending row only). Its next renewal revives
//! the same lease, and its own sweep never takes its own attempts.
//!
//! A process that holds no lease (the CLI, a test's bare store) writes rows without
//! one; those keep the clock rule they had (`deadline_at`, `lease_until`).

use super::{Backend, Store, StoreError, now_ms};
use slog::{Logger, info, warn};
use sqlx::Row;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::task::JoinHandle;

/// How long a lease holds after its last renewal.
pub const TTL_MS: i64 = 5_000;
/// How often a serving process renews its lease.
pub const RENEW_EVERY: Duration = Duration::from_secs(1);

impl Store {
    /// The lease this process holds, if it took one.
    pub fn lease(&self) -> Option<i64> {
        Some(self.lease.load(Ordering::Acquire)).filter(|id| *id > 0)
    }

    /// The store's clock now (milliseconds since the epoch): PostgreSQL's, or this
    /// machine's on SQLite.
    pub async fn store_now(&self) -> Result<i64, StoreError> {
        match self.backend {
            Backend::Sqlite => Ok(now_ms()),
            Backend::Postgres => {
                let row = sqlx::query("SELECT gateway_now_ms() AS now").fetch_one(&self.read).await?;
                Ok(row.try_get("now")?)
            }
        }
    }

    /// Takes a new lease for this process; its id.
    pub async fn take_lease(&self) -> Result<i64, StoreError> {
        let host = hostname();
        let pid = i64::from(std::process::id());
        let query = match self.backend {
            Backend::Sqlite => sqlx::query(
                "INSERT INTO process_leases (host, pid, started_at, expires_at) \
                 VALUES ($1, $2, $3, $3 + $4) RETURNING id",
            )
            .bind(host)
            .bind(pid)
            .bind(now_ms())
            .bind(TTL_MS),
            Backend::Postgres => sqlx::query(
                "INSERT INTO process_leases (host, pid, started_at, expires_at) \
                 VALUES ($1, $2, gateway_now_ms(), gateway_now_ms() + $3) RETURNING id",
            )
            .bind(host)
            .bind(pid)
            .bind(TTL_MS),
        };
        let row = query.fetch_one(&self.write).await?;
        let id: i64 = row.try_get("id")?;
        self.lease.store(id, Ordering::Release);
        Ok(id)
    }

    /// Renews this process's lease: it holds for `TTL_MS` from now. A lease that had
    /// lapsed (renewals failed for `TTL_MS`: the store was out of reach) is revived
    /// under the same id, so this process never takes its own attempts for orphans;
    /// another process may have swept them while it was lapsed, and their settles then
    /// change nothing. Nothing to renew before `take_lease`.
    pub async fn renew_lease(&self) -> Result<(), StoreError> {
        let Some(id) = self.lease() else { return Ok(()) };
        let pid = i64::from(std::process::id());
        let query = match self.backend {
            Backend::Sqlite => sqlx::query(
                "INSERT INTO process_leases (id, host, pid, started_at, expires_at) VALUES ($1, $2, $3, $4, $4 + $5) \
                 ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at",
            )
            .bind(id)
            .bind(hostname())
            .bind(pid)
            .bind(now_ms())
            .bind(TTL_MS),
            Backend::Postgres => sqlx::query(
                "INSERT INTO process_leases (id, host, pid, started_at, expires_at) \
                 VALUES ($1, $2, $3, gateway_now_ms(), gateway_now_ms() + $4) \
                 ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at",
            )
            .bind(id)
            .bind(hostname())
            .bind(pid)
            .bind(TTL_MS),
        };
        query.execute(&self.write).await?;
        Ok(())
    }

    /// Gives the lease up (a clean stop, after everything in flight was settled):
    /// whatever still names it is orphaned at once, by whichever process looks first.
    pub async fn release_lease(&self) -> Result<(), StoreError> {
        let Some(id) = self.lease() else { return Ok(()) };
        sqlx::query("DELETE FROM process_leases WHERE id = $1").bind(id).execute(&self.write).await?;
        self.lease.store(0, Ordering::Release);
        Ok(())
    }

    /// Whether the lease `id` holds now, by the store's clock.
    pub async fn lease_alive(&self, id: i64) -> Result<bool, StoreError> {
        let query = match self.backend {
            Backend::Sqlite => {
                sqlx::query("SELECT COUNT(*) AS n FROM process_leases WHERE id = $1 AND expires_at > $2")
                    .bind(id)
                    .bind(now_ms())
            }
            Backend::Postgres => {
                sqlx::query("SELECT COUNT(*) AS n FROM process_leases WHERE id = $1 AND expires_at > gateway_now_ms()")
                    .bind(id)
            }
        };
        let row = query.fetch_one(&self.read).await?;
        Ok(row.try_get::<i64, _>("n")? > 0)
    }

    /// Removes leases that lapsed long ago (an hour), so the table holds about one
    /// row per process alive.
    pub async fn prune_leases(&self) -> Result<u64, StoreError> {
        let cutoff = self.store_now().await? - 3_600_000;
        let done =
            sqlx::query("DELETE FROM process_leases WHERE expires_at < $1").bind(cutoff).execute(&self.write).await?;
        Ok(done.rows_affected())
    }

    /// Takes the lease (now, so that it is held before the first request) and renews
    /// it every `RENEW_EVERY` in the returned task.
    pub async fn hold_lease(&self, log: Logger) -> Result<JoinHandle<()>, StoreError> {
        let id = self.take_lease().await?;
        info!(log, "process lease taken"; "lease" => id, "ttl_ms" => TTL_MS);
        let store = self.clone();
        Ok(tokio::spawn(async move {
            let mut tick = tokio::time::interval(RENEW_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            let mut pruned_at = tokio::time::Instant::now();
            loop {
                tick.tick().await;
                if let Err(e) = store.renew_lease().await {
                    warn!(log, "renewing the process lease failed"; "error" => %e);
                }
                if pruned_at.elapsed() > Duration::from_secs(600) {
                    pruned_at = tokio::time::Instant::now();
                    if let Err(e) = store.prune_leases().await {
                        warn!(log, "pruning lapsed leases failed"; "error" => %e);
                    }
                }
            }
        }))
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().chars().take(255).collect())
        .unwrap_or_else(|_| "unknown".into())
}
