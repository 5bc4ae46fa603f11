//! Keeps the send path's cache (`cache`) true: follows the announcements of changes
//! to API keys, customers and instances and evicts what they name. On PostgreSQL it
//! LISTENs on `gateway_cache` (a trigger NOTIFYs at commit); on SQLite it polls the
//! `cache_changes` rows triggers add, which also hears other processes on the file
//! (`gateway key revoke` from the CLI). While the listener is away, entries still
//! expire after `cache::TTL`; when it is back, everything is forgotten once. The
//! follower is a job of the server's task runner (`crate::tasks`).

use super::{Backend, Store};
use crate::tasks::{Shutdown, Tasks};
use slog::{Logger, info, warn};
use sqlx::Row;
use std::time::Duration;

/// How often SQLite's change rows are read.
const POLL: Duration = Duration::from_millis(200);
/// How long change rows are kept (every gateway reads them within `POLL`).
const KEEP_MS: i64 = 60_000;

impl Store {
    /// Starts following changes as the job `cache invalidation` of `tasks`, until
    /// shutdown. SQLite's poll finishes the read (and prune) in progress; PostgreSQL's
    /// listener only ever waits (to connect, for a notification), and stops at once.
    pub fn spawn_cache_invalidation(&self, tasks: &mut Tasks, log: Logger) {
        let store = self.clone();
        tasks.spawn("cache invalidation", move |mut stop| async move {
            match store.backend {
                Backend::Postgres => tokio::select! {
                    biased;
                    _ = stop.stopped() => {}
                    _ = store.listen(log) => {}
                },
                Backend::Sqlite => store.poll_changes(log, stop).await,
            }
        });
    }

    async fn listen(&self, log: Logger) {
        loop {
            match sqlx::postgres::PgListener::connect(&self.url).await {
                Ok(mut listener) => match listener.listen("gateway_cache").await {
                    Ok(()) => {
                        info!(log, "following cache invalidations"; "channel" => "gateway_cache");
                        self.cache.evict("*", "");
                        loop {
                            match listener.try_recv().await {
                                Ok(Some(note)) => {
                                    let (table, key) = note.payload().split_once(':').unwrap_or(("*", ""));
                                    self.cache.evict(table, key);
                                }
                                // The connection was lost; the next call reconnects, and
                                // whatever was announced meanwhile is lost: forget all.
                                Ok(None) => self.cache.evict("*", ""),
                                Err(e) => {
                                    warn!(log, "the cache listener failed"; "error" => %e);
                                    break;
                                }
                            }
                        }
                    }
                    Err(e) => warn!(log, "LISTEN gateway_cache failed"; "error" => %e),
                },
                Err(e) => warn!(log, "the cache listener cannot connect"; "error" => %e),
            }
            self.cache.evict("*", "");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    async fn poll_changes(&self, log: Logger, mut stop: Shutdown) {
        let mut seen = match sqlx::query("SELECT COALESCE(MAX(id), 0) AS id FROM cache_changes")
            .fetch_one(&self.read)
            .await
            .and_then(|r| r.try_get::<i64, _>("id"))
        {
            Ok(id) => id,
            Err(e) => {
                warn!(log, "reading cache changes failed"; "error" => %e);
                0
            }
        };
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut polls = 0u64;
        while stop.tick(&mut tick).await {
            let rows = sqlx::query("SELECT id, tbl, key FROM cache_changes WHERE id > $1 ORDER BY id")
                .bind(seen)
                .fetch_all(&self.read)
                .await;
            match rows {
                Ok(rows) => {
                    for row in rows {
                        let (Ok(id), Ok(table), Ok(key)) = (
                            row.try_get::<i64, _>("id"),
                            row.try_get::<String, _>("tbl"),
                            row.try_get::<String, _>("key"),
                        ) else {
                            self.cache.evict("*", "");
                            continue;
                        };
                        self.cache.evict(&table, &key);
                        seen = seen.max(id);
                    }
                }
                Err(e) => {
                    warn!(log, "reading cache changes failed"; "error" => %e);
                    self.cache.evict("*", "");
                }
            }
            polls += 1;
            if polls.is_multiple_of(300) {
                let before = super::now_ms() - KEEP_MS;
                let pruned = sqlx::query("DELETE FROM cache_changes WHERE at < $1").bind(before).execute(&self.write);
                if let Err(e) = pruned.await {
                    warn!(log, "pruning cache changes failed"; "error" => %e);
                }
            }
        }
    }
}
