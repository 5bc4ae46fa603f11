//! The store: customers, instances, API keys, suppression, message log, limit counters
//! and the event outbox, on SQLite (embedded default, WAL) or PostgreSQL.
//!
//! One query text serves both backends through sqlx's `Any` driver: the schema keeps to
//! types both share (TEXT, BIGINT; flags as 0/1; times as Unix milliseconds) and the
//! queries to SQL both accept (`$n` parameters, `ON CONFLICT ... RETURNING`). Writing
//! every query twice for two typed pools was the alternative; it doubles the code that
//! must stay in step for no behaviour we need.
//!
//! SQLite allows one writer at a time, so its writes go through a pool of one
//! connection (no `SQLITE_BUSY` between our own writers) while reads use several; on
//! PostgreSQL both are the same pool. Limit counters are updated with a conditional
//! upsert inside a transaction, so concurrent senders, and several replicas on one
//! PostgreSQL, can never push a counter past its limit.

mod counters;
mod customers;
mod keys;
mod messages;
mod writer;

pub use counters::{LimitHit, Reservation};
pub use customers::{Customer, Instance, LimitOverrides, PlanStatus, SendContext};
pub use keys::ApiKeyRecord;
pub use messages::{LogEntry, OutboxEvent};

use sqlx::any::{AnyPoolOptions, install_default_drivers};
use sqlx::{AnyPool, Executor};
use std::time::Duration;

/// Which database the store runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A store failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("unsupported database URL (use sqlite:// or postgres://): {0}")]
    UnsupportedUrl(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("the store is closed")]
    Closed,
    #[error("the plan allows {cap} instance(s) and the customer has {count}")]
    InstanceCap { cap: i64, count: i64 },
}

/// Handle to the database; cheap to clone.
#[derive(Clone)]
pub struct Store {
    read: AnyPool,
    write: AnyPool,
    backend: Backend,
    /// The group-commit writer of the send path (see `writer`).
    writer: tokio::sync::mpsc::Sender<writer::WriteOp>,
}

/// Current time in Unix milliseconds.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A new opaque identifier with a readable prefix, e.g. `ins_3f2a...`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

impl Store {
    /// Connects to `url` (creating a SQLite file when the URL says `mode=rwc`) and
    /// applies the migrations.
    /// `log` receives the writer's debug lines (batch sizes and times).
    pub async fn open(
        url: &str,
        max_connections: u32,
        log: Option<slog::Logger>,
    ) -> Result<Store, StoreError> {
        let store = Store::connect(url, max_connections, log).await?;
        store.migrate().await?;
        Ok(store)
    }

    /// Connects without migrating.
    pub async fn connect(
        url: &str,
        max_connections: u32,
        log: Option<slog::Logger>,
    ) -> Result<Store, StoreError> {
        install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Postgres
        } else {
            return Err(StoreError::UnsupportedUrl(url.to_string()));
        };
        let max = max_connections.max(1);
        match backend {
            Backend::Sqlite => {
                let options = || {
                    AnyPoolOptions::new()
                        .acquire_timeout(Duration::from_secs(30))
                        .after_connect(|conn, _| {
                            Box::pin(async move {
                                conn.execute(
                                    "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
                                     PRAGMA busy_timeout = 10000; PRAGMA foreign_keys = ON;",
                                )
                                .await?;
                                Ok(())
                            })
                        })
                };
                let write = options().max_connections(1).connect(url).await?;
                let read = options().max_connections(max).connect(url).await?;
                let path = writer::sqlite_path(url)
                    .ok_or_else(|| StoreError::UnsupportedUrl(url.to_string()))?;
                let writer = writer::spawn_sqlite(path, log)?;
                Ok(Store {
                    read,
                    write,
                    backend,
                    writer,
                })
            }
            Backend::Postgres => {
                let pool = AnyPoolOptions::new()
                    .max_connections(max)
                    .acquire_timeout(Duration::from_secs(30))
                    .connect(url)
                    .await?;
                let writer = writer::spawn_sqlx(pool.clone(), log);
                Ok(Store {
                    read: pool.clone(),
                    write: pool,
                    backend,
                    writer,
                })
            }
        }
    }

    /// Applies the migrations of this backend (idempotent).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match self.backend {
            Backend::Sqlite => {
                sqlx::migrate!("./migrations/sqlite")
                    .run(&self.write)
                    .await?
            }
            Backend::Postgres => {
                sqlx::migrate!("./migrations/postgres")
                    .run(&self.write)
                    .await?
            }
        }
        Ok(())
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Queues a write for the group-commit writer and waits for its result.
    async fn write_op<T>(
        &self,
        op: impl FnOnce(tokio::sync::oneshot::Sender<Result<T, StoreError>>) -> writer::WriteOp,
    ) -> Result<T, StoreError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.writer
            .send(op(reply))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Closes every connection.
    pub async fn close(&self) {
        self.write.close().await;
        self.read.close().await;
    }
}

/// Reads a 0/1 flag.
fn flag(n: i64) -> bool {
    n != 0
}
