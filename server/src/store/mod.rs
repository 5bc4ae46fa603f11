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

mod attempts;
mod cache;
mod counters;
mod customer_days;
mod customers;
mod dashboard;
mod dashboard_lists;
pub mod delivery;
mod fleet;
mod idempotency;
mod ingress;
pub mod insight;
mod invalidation;
mod keys;
pub mod leases;
mod log_pages;
mod messages;
mod modules;
mod pbx;
mod policies;
mod policy_inputs;
mod privacy;
pub mod retention;
mod rows;
#[cfg(test)]
mod schema_tests;
mod send_context;
mod sqlite;
#[cfg(test)]
mod test_postgres;
mod webhooks;
mod writer;
pub use writer::stats as write_stats;
pub use writer::{BATCH_BOUNDS_US as WRITE_BATCH_BOUNDS_US, batch_durations as write_batch_durations};
/// Statements whose plans the tests check: each must find its rows by key, however few
/// rows the tables hold (the batch ones name their rows in a JSON list).
pub mod keyed_statements {
    pub use super::counters::RELEASE_SQL;
    pub use super::policy_inputs::{KEEP_BATCH_POSTGRES, KEEP_SQL};
    pub use super::webhooks::{SKIP_POSTGRES, SKIP_SQLITE};
}

use rows::Named;
pub(crate) use rows::{Cols, Forget, FromCols};
use sqlite::SqliteReaders;
pub(crate) use sqlite::{
    Bound, SQLITE_STATEMENTS_KEPT, bind_dollar, bound_int, bound_opt, bound_text, is_sqlite_busy, owned, sqlite_insert,
};

pub use attempts::{Began, Begin, Finish, ORPHAN_REASON};
pub use cache::TTL as CACHE_TTL;
pub use counters::{LimitHit, Reservation};
pub use customer_days::{Activity, CLOSED_AFTER_MS as DAY_KEPT_AFTER_MS};
pub use customers::{Customer, Instance, LimitOverrides, PlanStatus};
pub use dashboard::{DashSession, DashUser, Invitation, THROTTLE_WINDOW_MS, Throttled};
pub use dashboard_lists::{InboundRow, Suppression, Usage};
pub use delivery::{Delivery, DeliveryState};
pub use idempotency::{Answer, CLAIM_LEASE_MS, Claim, IdemOwner, KEY_TTL_MS, KeyFate, KeySnapshot};
pub use ingress::Applied;
pub use keys::ApiKeyRecord;
pub use log_pages::{LogFilter, LogRow, MessageEvent};
pub use messages::{LogEntry, OutboxEvent, Recorded, ReviewItem};
pub use modules::{Mode as RolloutMode, NewModule, Rollout, StoredModule};
pub use pbx::{
    Admission, PbxAdmit, PbxEvent, PbxIntegration, PbxSettingsUpdate, PbxTemplate, RateCheck, SIGNATURE_MEMORY_SECONDS,
};
pub use policies::{PolicyGateway, ReviewEntry};
pub use policy_inputs::{KeptInput, PolicyInputQuery};
pub use send_context::{PacingScopes, SendContext, read_stats as send_read_stats};
pub use webhooks::{ClaimedEvent, EndpointChange, EventState, WebhookAttempt, WebhookEndpoint};

use rusqlite::types::Value as SqlValue;
use sqlx::any::{AnyPoolOptions, install_default_drivers};
use sqlx::{Any, AnyPool, Executor, Row};
use std::path::PathBuf;
use std::sync::Arc;
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
    /// The database did not answer in time, or is locked or unreachable: a request may
    /// succeed later (503).
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    #[error("the plan allows {cap} instance(s) and the customer has {count}")]
    InstanceCap { cap: i64, count: i64 },
}

impl StoreError {
    /// Whether the failure is the database being out of reach for now (timed out,
    /// locked, connection lost), not a fault of the request: answered 503.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Unavailable(_) => true,
            StoreError::Database(e) => {
                matches!(
                    e,
                    sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) | sqlx::Error::Tls(_)
                ) || e.as_database_error().and_then(|d| d.code()).is_some_and(|c| unavailable_code(&c))
            }
            StoreError::Sqlite(e) => is_sqlite_busy(e),
            _ => false,
        }
    }
}

/// A database's error code for "not now": SQLite's SQLITE_BUSY (5) and SQLITE_LOCKED
/// (6) as sqlx names them, or a PostgreSQL connection lost. PostgreSQL rolls back the
/// open transaction of a connection it ends, and a send's own rows settle one that had
/// committed (`Exactly once` in docs/architecture.md), so 503 is the answer: it was a
/// 500 before.
fn unavailable_code(code: &str) -> bool {
    matches!(code, "5" | "6") || connection_lost_code(code)
}

/// PostgreSQL's codes for a connection it ended or cannot keep: connection exceptions
/// (class 08) and a server that ended the connection, crashed or is starting (57P01 to
/// 57P03).
fn connection_lost_code(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03")
}

/// Whether a pooled statement met a connection the database had dropped (or lost).
fn dropped_connection(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Io(_))
        || e.as_database_error().and_then(|d| d.code()).is_some_and(|c| connection_lost_code(&c))
}

/// Handle to the database; cheap to clone.
#[derive(Clone)]
pub struct Store {
    read: AnyPool,
    write: AnyPool,
    backend: Backend,
    /// The group-commit writer of the send path (see `writer`): one queue on SQLite,
    /// one per lane on PostgreSQL.
    writer: Arc<[tokio::sync::mpsc::Sender<writer::Queued>]>,
    /// SQLite only: plain connections for the send path's reads (see `read_one`).
    sqlite_readers: Option<Arc<SqliteReaders>>,
    /// PostgreSQL only: the send path's reads of concurrent sends, a batch a statement.
    send_reads: Option<send_context::SendReads>,
    /// API keys, customers and instances the send path read (see `cache`).
    cache: Arc<cache::Cache>,
    /// The database URL (the PostgreSQL cache listener opens its own connection).
    url: Arc<str>,
    /// This process's lease (`leases`), 0 while it holds none.
    lease: Arc<std::sync::atomic::AtomicI64>,
}

/// Binds values to an sqlx query (one list of values serves both drivers).
pub(crate) fn bind_all<'q>(
    mut query: sqlx::query::Query<'q, Any, sqlx::any::AnyArguments<'q>>,
    values: Vec<SqlValue>,
) -> sqlx::query::Query<'q, Any, sqlx::any::AnyArguments<'q>> {
    for value in values {
        query = match value {
            SqlValue::Text(s) => query.bind(s),
            SqlValue::Integer(n) => query.bind(n),
            SqlValue::Null => query.bind(None::<String>),
            SqlValue::Real(f) => query.bind(f),
            SqlValue::Blob(b) => query.bind(b),
        };
    }
    query
}

/// How SQLite commits: `Full` syncs the WAL at every commit (a group commit pays one
/// sync for its whole batch), so an acknowledged write survives an OS crash or power
/// loss; `Normal` syncs only at checkpoints (faster; the last commits may be lost on
/// power loss, the file is never corrupted). PostgreSQL is unaffected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    #[default]
    Full,
    Normal,
}

impl Durability {
    /// From the configuration's `sqlite_synchronous` (`full` or `normal`).
    pub fn parse(setting: &str) -> Option<Durability> {
        match setting {
            "full" => Some(Durability::Full),
            "normal" => Some(Durability::Normal),
            _ => None,
        }
    }
}

/// How the store connects: SQLite's durability, and how long any one database
/// operation may take (a pool that cannot get a connection, a locked SQLite file, a
/// write batch PostgreSQL does not answer) before it fails as `Unavailable`.
#[derive(Clone, Copy, Debug)]
pub struct StoreOptions {
    pub durability: Durability,
    pub timeout: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions { durability: Durability::Full, timeout: Duration::from_secs(10) }
    }
}

impl StoreOptions {
    /// The pragmas every SQLite connection starts with (the writer's then paces its
    /// checkpoints itself: `writer::checkpoints`).
    pub(crate) fn sqlite_pragmas(self) -> String {
        let synchronous = match self.durability {
            Durability::Full => "FULL",
            Durability::Normal => "NORMAL",
        };
        format!(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = {synchronous}; PRAGMA busy_timeout = {}; \
             PRAGMA foreign_keys = ON; PRAGMA wal_autocheckpoint = {};",
            self.timeout.as_millis(),
            writer::checkpoints::BUSY_FRAMES
        )
    }
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
    pub async fn open(url: &str, max_connections: u32, log: Option<slog::Logger>) -> Result<Store, StoreError> {
        Store::open_with(url, max_connections, log, StoreOptions::default()).await
    }

    /// `open` with SQLite's durability chosen (`sqlite_synchronous`).
    pub async fn open_with(
        url: &str,
        max_connections: u32,
        log: Option<slog::Logger>,
        options: StoreOptions,
    ) -> Result<Store, StoreError> {
        let store = Store::connect_with(url, max_connections, log, options).await?;
        store.migrate().await?;
        Ok(store)
    }

    /// Connects without migrating.
    pub async fn connect(url: &str, max_connections: u32, log: Option<slog::Logger>) -> Result<Store, StoreError> {
        Store::connect_with(url, max_connections, log, StoreOptions::default()).await
    }

    async fn connect_with(
        url: &str,
        max_connections: u32,
        log: Option<slog::Logger>,
        options: StoreOptions,
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
                let pragmas: &'static str = Box::leak(options.sqlite_pragmas().into_boxed_str());
                let pool = || {
                    pool_options(options.timeout).after_connect(move |conn, _| {
                        Box::pin(async move {
                            conn.execute(pragmas).await?;
                            Ok(())
                        })
                    })
                };
                let write = pool().max_connections(1).connect(url).await?;
                let read = pool().max_connections(max).connect(url).await?;
                let path = writer::sqlite_path(url).ok_or_else(|| StoreError::UnsupportedUrl(url.to_string()))?;
                let writer = Arc::new([writer::spawn_sqlite(path.clone(), options, log)?]);
                let sqlite_readers = Some(Arc::new(SqliteReaders::new(path)));
                let (cache, url) = (Arc::default(), url.into());
                let lease = Arc::default();
                Ok(Store { read, write, backend, writer, sqlite_readers, send_reads: None, cache, url, lease })
            }
            Backend::Postgres => {
                let pool = pool_options(options.timeout).max_connections(max).connect(url).await?;
                let send_reads = send_context::SendReads::spawn(pool.clone(), options.timeout, log.clone());
                let writer = writer::spawn_sqlx(pool.clone(), options.timeout, log).into();
                let (cache, url) = (Arc::default(), url.into());
                Ok(Store {
                    read: pool.clone(),
                    write: pool,
                    backend,
                    writer,
                    sqlite_readers: None,
                    send_reads: Some(send_reads),
                    cache,
                    url,
                    lease: Arc::default(),
                })
            }
        }
    }

    /// After this process changed an API key, customer or instance: its own cache
    /// forgets at once (others hear of it through `invalidation`).
    pub(crate) fn forget_cached(&self) {
        self.cache.evict("*", "");
    }

    /// Applies the migrations of this backend (idempotent).
    ///
    /// On PostgreSQL sqlx serialises migrators with an advisory lock; on SQLite it does
    /// not, so two processes opening one new file at once (a server and a CLI command)
    /// would both apply the first migration. A lock file beside the database (an OS
    /// lock, released when the process ends) makes them take turns.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match self.backend {
            Backend::Sqlite => {
                let _lock = match self.sqlite_readers.as_ref().map(|r| r.path.clone()) {
                    Some(path) => Some(migration_lock(path).await?),
                    None => None,
                };
                // Foreign keys off while migrating (outside the migrations' own
                // transactions, where the pragma would do nothing): SQLite changes a
                // parent table's schema only by rebuilding it. Checked afterwards.
                let mut conn = self.write.acquire().await?;
                sqlx::query("PRAGMA foreign_keys = OFF").execute(&mut *conn).await?;
                let migrated = self.migrator().run(&mut *conn).await;
                sqlx::query("PRAGMA foreign_keys = ON").execute(&mut *conn).await?;
                migrated?;
                let broken = sqlx::query("PRAGMA foreign_key_check").fetch_all(&mut *conn).await?;
                if !broken.is_empty() {
                    return Err(StoreError::Conflict(format!(
                        "the migrations left {} rows whose foreign keys point nowhere",
                        broken.len()
                    )));
                }
            }
            Backend::Postgres => self.migrator().run(&self.write).await?,
        }
        Ok(())
    }

    /// This build's migrations. Migrations another build applied that this one does
    /// not know are left alone: during a rolling upgrade the new build migrates first
    /// (every migration only adds), and a replica of the previous build that restarts
    /// meanwhile still starts and serves on the newer schema.
    fn migrator(&self) -> sqlx::migrate::Migrator {
        let mut migrator = match self.backend {
            Backend::Sqlite => sqlx::migrate!("./migrations/sqlite"),
            Backend::Postgres => sqlx::migrate!("./migrations/postgres"),
        };
        migrator.set_ignore_missing(true);
        migrator
    }

    /// Whether the store answers, and whether every migration this build knows is
    /// applied (none pending, none failed): `Ok(Err(why))` when it answers but is behind.
    pub async fn migrations_current(&self) -> Result<Result<(), String>, StoreError> {
        let migrator = self.migrator();
        let rows = sqlx::query("SELECT version FROM _sqlx_migrations WHERE success").fetch_all(&self.read).await?;
        let applied: std::collections::HashSet<i64> =
            rows.iter().map(|r| r.try_get::<i64, _>("version")).collect::<Result<_, _>>()?;
        let missing: Vec<String> =
            migrator.iter().filter(|m| !applied.contains(&m.version)).map(|m| m.version.to_string()).collect();
        Ok(if missing.is_empty() { Ok(()) } else { Err(format!("migrations not applied: {}", missing.join(", "))) })
    }

    /// Writes a consistent copy of a SQLite store to `to` (which must not exist) while
    /// it serves: `VACUUM INTO` reads one snapshot of the database, so writers go on
    /// and the copy holds every transaction committed before it began. Its size.
    pub async fn backup_to(&self, to: &std::path::Path) -> Result<u64, StoreError> {
        let Some(readers) = &self.sqlite_readers else {
            return Err(StoreError::Conflict(
                "backup copies a SQLite store; for PostgreSQL use pg_dump (see docs/operations.md, Backups)".into(),
            ));
        };
        if to.exists() {
            return Err(StoreError::Conflict(format!("{} exists; a backup never overwrites", to.display())));
        }
        let (from, to) = (readers.path.clone(), to.to_path_buf());
        tokio::task::spawn_blocking(move || -> Result<u64, StoreError> {
            let conn = rusqlite::Connection::open(&from)?;
            conn.busy_timeout(Duration::from_secs(30))?;
            conn.execute("VACUUM INTO ?1", [to.display().to_string()])?;
            Ok(std::fs::metadata(&to).map(|m| m.len()).unwrap_or(0))
        })
        .await
        .map_err(|e| StoreError::Conflict(format!("the backup task failed: {e}")))?
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The first row of a read on the send path, if any.
    async fn read_one<T: FromCols>(&self, sql: &str, params: Vec<SqlValue>) -> Result<Option<T>, StoreError> {
        if let Some(readers) = &self.sqlite_readers {
            return readers.with(|conn| {
                let mut stmt = conn.prepare_cached(sql)?;
                bind_dollar(&mut stmt, &params)?;
                let mut rows = stmt.raw_query();
                rows.next()?.map(|row| T::from_cols(&Named::new(sql, row))).transpose()
            });
        }
        // A read changes nothing, so one that met a connection the database dropped while
        // it sat idle (a restart) is asked again, as often as the pool has connections
        // (each try passes over one dropped connection): see `pool_options`.
        let mut tries = self.read.options().get_max_connections();
        loop {
            match bind_all(sqlx::query(sql), params.clone()).fetch_optional(&self.read).await {
                Err(e) if tries > 0 && dropped_connection(&e) => tries -= 1,
                row => return row?.as_ref().map(T::from_cols).transpose(),
            }
        }
    }

    /// Queues a write for the group-commit writer and waits for its result.
    async fn write<W: writer::Write>(&self, write: W) -> Result<W::Output, StoreError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let queue = &self.writer[write.lane().min(self.writer.len() - 1)];
        let pending = writer::Pending { write, output: None, reply };
        queue.send(Box::new(pending)).await.map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Closes every connection.
    pub async fn close(&self) {
        self.write.close().await;
        self.read.close().await;
    }
}

/// How long a pooled connection may have been idle and still be handed out without
/// asking the database first (see `pool_options`).
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// The pools' options. sqlx asks the database (a `ping`, one round trip) before it hands
/// out a pooled connection, and again when the connection is given back: the two were
/// 19.6 % of the gateway's CPU under send load on PostgreSQL (BENCHMARKS.md, issue 22).
/// The check on the way back stays (sqlx has no switch for it); before one is handed out
/// a connection is asked only when it has been idle `PING_AFTER_IDLE` or longer. What
/// that gives up: a connection the database dropped less than a second after it was
/// last used (a restart under load) now fails the statement that meets it. A read is
/// then asked again (`read_one`); the writer's batch is run again unless its receipt
/// says it committed (`writer::postgres::run_batch`); other writes (a dashboard's, the kept policy
/// inputs) answer 503 or are retried by their loop
/// (`sends_after_the_database_dropped_the_connections_answer_200`).
fn pool_options(timeout: Duration) -> AnyPoolOptions {
    AnyPoolOptions::new().acquire_timeout(timeout).test_before_acquire(false).before_acquire(|conn, meta| {
        Box::pin(async move {
            if meta.idle_for >= PING_AFTER_IDLE {
                sqlx::Connection::ping(conn).await?;
            }
            Ok(true)
        })
    })
}

/// Takes the exclusive lock of `{database}-migrate.lock` (blocking, off the async
/// threads); held until the returned file is dropped.
async fn migration_lock(database: PathBuf) -> Result<std::fs::File, StoreError> {
    let mut name = database.into_os_string();
    name.push("-migrate.lock");
    tokio::task::spawn_blocking(move || {
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&name)?;
        file.lock()?;
        Ok::<_, std::io::Error>(file)
    })
    .await
    .map_err(|e| StoreError::Conflict(format!("taking the migration lock: {e}")))?
    .map_err(|e| StoreError::Conflict(format!("taking the migration lock: {e}")))
}

/// Reads a 0/1 flag.
fn flag(n: i64) -> bool {
    n != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn two_processes_opening_a_new_sqlite_file_at_once_take_turns_migrating() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("race.db").display());
        let opens: Vec<_> = (0..4).map(|_| Store::open(&url, 2, None)).collect();
        for result in futures::future::join_all(opens).await {
            result.expect("every opener migrates or finds it done");
        }
    }
}
