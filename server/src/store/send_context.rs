//! The send path's one read: the customer, the instance, suppression, the pacing
//! counters, the API key's revocation and the idempotency key's state, as stored now.
//!
//! On PostgreSQL the reads of concurrent sends go together ([`SendReads`]): one
//! statement reads a batch of them (up to 64; a read that resolves an instance by its
//! name runs alone). A read alone is a round trip, and a plan of six
//! subqueries set up for one row: PostgreSQL spent 150 to 310 µs of CPU on each, and
//! about 35 to 65 µs a read in batches of 4 to 16 (BENCHMARKS.md, issue 22,
//! twenty-fifth session). A batch is what queued while the one before it ran, so a
//! lone send waits for nobody, and every read still runs after its send asked: what
//! stops sending (a revoked key, a paused instance) holds from the moment it is written.

use super::customers::{CUSTOMER_COLUMNS, INSTANCE_COLUMNS};
use super::idempotency::KeySnapshot;
use super::writer::timed;
use super::{Cols, Customer, FromCols, Instance, Store, StoreError, bind_all, dropped_connection};
use gateway_policy_model::Counters;
use rusqlite::types::Value as SqlValue;
use sqlx::AnyPool;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// How a form of the read names its inputs: `$n` parameters for one send's read, the
/// columns of the batch's rows `q` for several (`SEND_BATCH_SQL`).
struct Inputs {
    customer: &'static str,
    instance: &'static str,
    phone: &'static str,
    /// The start of the UTC day.
    day_start: &'static str,
    /// The start of the hour 23 hours ago (24 hourly buckets).
    since: &'static str,
    /// The start of the hour.
    hour_start: &'static str,
    /// The scope prefixes of the counters ([`PacingScopes`]).
    instance_day: &'static str,
    recipient_hour: &'static str,
    new_recipient_day: &'static str,
    api_key: &'static str,
    idem_key: &'static str,
    now: &'static str,
}

/// One send's read: `$1` customer, `$2` instance, `$3` phone, `$4` start of the UTC
/// day, `$5` start of the hour 23 hours ago, `$6..$8` the counters' scope prefixes,
/// `$9` start of the hour, `$10` the API key's id; keyed, `$11` the key and `$12` now.
const PARAMS: Inputs = Inputs {
    customer: "$1",
    instance: "$2",
    phone: "$3",
    day_start: "$4",
    since: "$5",
    instance_day: "$6",
    recipient_hour: "$7",
    new_recipient_day: "$8",
    hour_start: "$9",
    api_key: "$10",
    idem_key: "$11",
    now: "$12",
};

/// A batch's reads: each row of `q` (`json_to_recordset` of `$1`) is one send's. The
/// prefixes are `PacingScopes`' (a test holds them equal).
const BATCHED: Inputs = Inputs {
    customer: "q.cus",
    instance: "q.ins",
    phone: "q.phone",
    day_start: "q.day_start",
    since: "q.since",
    instance_day: "'iday:'",
    recipient_hour: "'r24:'",
    new_recipient_day: "'inew:'",
    hour_start: "q.hour_start",
    api_key: "q.api_key",
    idem_key: "q.idem",
    now: "q.at",
};

/// Customer, instance by id (or else name), suppression and the pacing counters, in
/// one read (`PARAMS`). Every counter is a bounded lookup (a few index entries), never
/// a count over the message log. Two forms: without an idempotency key, and with the
/// key's row joined, so an unkeyed send's read is no larger for it.
static SEND_CONTEXT_SQL: LazyLock<[String; 2]> = LazyLock::new(|| {
    let (instance_match, order) = ("(i.id = $2 OR i.name = $2)", "ORDER BY CASE WHEN i.id = $2 THEN 0 ELSE 1 END");
    [send_context_sql(instance_match, order, false, &PARAMS), send_context_sql(instance_match, order, true, &PARAMS)]
});

/// `SEND_CONTEXT_SQL` for an instance the cache resolved: `$2` is its id, and the
/// customer and instance rows are read again by primary key, so what stops sending (a
/// revoked key, a paused instance, a plan or module change) holds from the moment it
/// is written, on every replica; the cache saves the name lookup, never a decision.
static SEND_FRESH_SQL: LazyLock<[String; 2]> = LazyLock::new(|| {
    [send_context_sql("i.id = $2", "", false, &PARAMS), send_context_sql("i.id = $2", "", true, &PARAMS)]
});

/// `SEND_FRESH_SQL` for a batch of sends (PostgreSQL), with each key's row joined (an
/// unkeyed send's `idem` is null and finds none): a row for each send whose customer
/// exists, its place in the batch as `n`.
static SEND_BATCH_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT q.n, r.* FROM json_to_recordset($1::json) AS q(n BIGINT, cus TEXT, ins TEXT, phone TEXT, \
         api_key TEXT, idem TEXT, day_start BIGINT, since BIGINT, hour_start BIGINT, at BIGINT) \
         CROSS JOIN LATERAL ({}) r",
        send_context_sql("i.id = q.ins", "", true, &BATCHED)
    )
});

fn send_context_sql(instance_match: &str, order: &str, keyed: bool, p: &Inputs) -> String {
    let customer_cols: Vec<String> = CUSTOMER_COLUMNS.split(", ").map(|c| format!("c.{c}")).collect();
    let instance_cols: Vec<String> = INSTANCE_COLUMNS.split(", ").map(|c| format!("i.{c} AS i_{c}")).collect();
    let (key_cols, key_join) = match keyed {
        true => (
            KeySnapshot::joined_columns("ik"),
            format!(
                "LEFT JOIN idempotency_keys ik ON ik.idem_key = {} AND ik.customer_id = c.id AND ik.expires_at > {}",
                p.idem_key, p.now
            ),
        ),
        false => (KeySnapshot::no_joined_columns(), String::new()),
    };
    let Inputs { customer, phone, day_start, since, hour_start, api_key, .. } = p;
    let Inputs { instance_day, recipient_hour, new_recipient_day, .. } = p;
    debug_assert!(instance_match.contains(p.instance));
    format!(
        "SELECT {}, {}, \
         (SELECT COUNT(*) FROM suppressed_recipients s WHERE s.customer_id = c.id AND s.phone = {phone}) AS suppressed, \
         (SELECT CAST(SUM(u.count) AS BIGINT) FROM usage_counters u WHERE u.scope = {recipient_hour} || i.id || ':' || {phone} \
            AND u.window_start >= {since}) AS to_recipient_24h, \
         (SELECT u.count FROM usage_counters u WHERE u.scope = {recipient_hour} || i.id || ':' || {phone} \
            AND u.window_start = {hour_start}) AS to_recipient_hour, \
         k.sent_total AS to_recipient_total, k.replies_total AS replies, \
         (SELECT u.count FROM usage_counters u WHERE u.scope = {new_recipient_day} || i.id AND u.window_start = {day_start}) AS new_today, \
         (SELECT u.count FROM usage_counters u WHERE u.scope = {instance_day} || i.id AND u.window_start = {day_start}) AS sent_today, \
         (SELECT a.revoked_at FROM api_keys a WHERE a.id = {api_key}) AS key_revoked_at, {key_cols} \
         FROM customers c LEFT JOIN instances i ON i.customer_id = c.id AND {instance_match} \
         LEFT JOIN contacts k ON k.instance_id = i.id AND k.phone = {phone} {key_join} \
         WHERE c.id = {customer} {order} LIMIT 1",
        customer_cols.join(", "),
        instance_cols.join(", "),
    )
}

/// Scope prefixes of the counters the pacing policy reads. They are taken with the
/// quota in the same reservation (never limits themselves) and given back with it if
/// the provider refuses, so they count what went out.
pub struct PacingScopes;

impl PacingScopes {
    /// `iday:{instance}`, per UTC day: the instance's sends.
    pub const INSTANCE_DAY: &str = "iday:";
    /// `r24:{instance}:{phone}`, per hour: sends to one recipient (24 buckets make
    /// the last 24 hours).
    pub const RECIPIENT_HOUR: &str = "r24:";
    /// `inew:{instance}`, per UTC day: sends to a recipient never messaged before.
    pub const NEW_RECIPIENT_DAY: &str = "inew:";
    /// `ifirst:{instance}:{phone}`, per UTC day, limit 1: the claim of a first contact,
    /// so that of concurrent first sends to one number only one counts as new.
    pub const FIRST_CONTACT: &str = "ifirst:";
}

impl FromCols for SendContext {
    fn from_cols(row: &impl Cols) -> Result<SendContext, StoreError> {
        let instance_id: Option<String> = row.col("i_id")?;
        let count = |name: &str| -> Result<u32, StoreError> {
            Ok(row.col::<Option<i64>>(name)?.unwrap_or(0).clamp(0, u32::MAX as i64) as u32)
        };
        Ok(SendContext {
            customer: Customer::from_cols(row)?,
            instance: instance_id.map(|_| Instance::from_prefixed_row(row, "i_")).transpose()?,
            suppressed: row.col::<i64>("suppressed")? > 0,
            counters: Counters {
                to_recipient_24h: count("to_recipient_24h")?,
                to_recipient_total: count("to_recipient_total")?,
                replies_from_recipient: count("replies")?,
                new_recipients_today: count("new_today")?,
                sent_today: count("sent_today")?,
            },
            to_recipient_hour: count("to_recipient_hour")?,
            key_revoked: row.col::<Option<i64>>("key_revoked_at")?.is_some(),
            key: KeySnapshot::from_joined(row)?,
        })
    }
}

/// What the send pipeline reads after the schema check, in one query.
#[derive(Clone, Debug)]
pub struct SendContext {
    pub customer: Customer,
    /// The customer's instance with the requested id or name.
    pub instance: Option<Instance>,
    /// Whether the customer suppressed the recipient.
    pub suppressed: bool,
    /// What the instance did recently, as the policies see it.
    pub counters: Counters,
    /// Of `counters.to_recipient_24h`, the sends of the current hour (the bucket a send
    /// takes).
    pub to_recipient_hour: u32,
    /// Whether the request's API key is revoked, as stored now.
    pub key_revoked: bool,
    /// The state of the request's idempotency key, when it has one (see
    /// `send::idempotency`): absent when it has none.
    pub key: KeySnapshot,
}

/// The inputs of one send's read.
#[derive(Clone)]
struct ReadArgs {
    customer: String,
    instance: String,
    phone: String,
    api_key: Option<String>,
    idem_key: Option<String>,
    now: i64,
}

impl ReadArgs {
    const DAY_MS: i64 = 24 * 3_600_000;
    const HOUR_MS: i64 = 3_600_000;

    fn day_start(&self) -> i64 {
        self.now - self.now.rem_euclid(Self::DAY_MS)
    }

    fn hour_start(&self) -> i64 {
        self.now - self.now.rem_euclid(Self::HOUR_MS)
    }

    fn since(&self) -> i64 {
        self.hour_start() - 23 * Self::HOUR_MS
    }

    /// Which form of `SEND_CONTEXT_SQL` and `SEND_FRESH_SQL` it takes.
    fn keyed(&self) -> usize {
        usize::from(self.idem_key.is_some())
    }

    /// The parameters of one send's read (`PARAMS`).
    fn params(&self) -> Vec<SqlValue> {
        let text = |s: &str| SqlValue::Text(s.to_string());
        let mut params = vec![
            text(&self.customer),
            text(&self.instance),
            text(&self.phone),
            SqlValue::Integer(self.day_start()),
            SqlValue::Integer(self.since()),
            text(PacingScopes::INSTANCE_DAY),
            text(PacingScopes::RECIPIENT_HOUR),
            text(PacingScopes::NEW_RECIPIENT_DAY),
            SqlValue::Integer(self.hour_start()),
            self.api_key.as_deref().map_or(SqlValue::Null, text),
        ];
        if let Some(idem_key) = &self.idem_key {
            params.extend([text(idem_key), SqlValue::Integer(self.now)]);
        }
        params
    }
}

/// One send's row of `SEND_BATCH_SQL`'s `$1`.
#[derive(serde::Serialize)]
struct BatchRow<'a> {
    n: usize,
    cus: &'a str,
    ins: &'a str,
    phone: &'a str,
    api_key: Option<&'a str>,
    idem: Option<&'a str>,
    day_start: i64,
    since: i64,
    hour_start: i64,
    at: i64,
}

impl<'a> BatchRow<'a> {
    fn new(n: usize, a: &'a ReadArgs) -> BatchRow<'a> {
        BatchRow {
            n,
            cus: &a.customer,
            ins: &a.instance,
            phone: &a.phone,
            api_key: a.api_key.as_deref(),
            idem: a.idem_key.as_deref(),
            day_start: a.day_start(),
            since: a.since(),
            hour_start: a.hour_start(),
            at: a.now,
        }
    }
}

/// Most reads in one statement.
const MAX_READ_BATCH: usize = 64;

static READ_BATCHES: AtomicU64 = AtomicU64::new(0);
static READS: AtomicU64 = AtomicU64::new(0);

/// `(statements, reads they answered)` of the PostgreSQL send path's batched reads
/// since the process started (a statement that failed is not counted, and nor are the
/// reads its callers then ask alone).
pub fn read_stats() -> (u64, u64) {
    (READ_BATCHES.load(Ordering::Relaxed), READS.load(Ordering::Relaxed))
}

/// PostgreSQL: the queue of the send path's reads, and the task that answers them a
/// batch at a time (see the module's doc). Cheap to clone.
#[derive(Clone)]
pub(super) struct SendReads {
    queue: mpsc::Sender<Queued>,
}

/// A read's answer from its batch; `None` when the caller is to read alone (the
/// batch's statement failed for another reason than the database being out of reach,
/// so that each read meets its own error).
type Answered = Option<Result<Option<SendContext>, StoreError>>;

/// A read waiting in the queue, and where its answer goes.
struct Queued {
    args: ReadArgs,
    reply: oneshot::Sender<Answered>,
}

impl SendReads {
    /// Starts the task that reads through `pool`, each statement answered within
    /// `timeout` (the database timeout) or failed as out of reach. It ends when the
    /// store's last clone is dropped. `log` hears of a batch that failed otherwise.
    pub(super) fn spawn(pool: AnyPool, timeout: Duration, log: Option<slog::Logger>) -> SendReads {
        let (queue, queued) = mpsc::channel(MAX_READ_BATCH * 16);
        tokio::spawn(answer_batches(Lane { pool, timeout, log }, queued));
        SendReads { queue }
    }

    /// The read of `args` in the next batch; `None` when the caller is to read alone
    /// (also when the task is gone: a store used after its runtime ended).
    async fn read(&self, args: ReadArgs) -> Answered {
        let (reply, answer) = oneshot::channel();
        self.queue.send(Queued { args, reply }).await.ok()?;
        answer.await.ok().flatten()
    }
}

/// What the task reads with.
struct Lane {
    pool: AnyPool,
    timeout: Duration,
    log: Option<slog::Logger>,
}

/// How often at most a failed batch is logged: a fault of the batch's statement alone
/// would otherwise log every batch (each of its reads then runs alone, and succeeds).
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The task: each time reads are queued, takes them all (up to `MAX_READ_BATCH`), reads
/// them in one statement and answers each.
async fn answer_batches(lane: Lane, mut queued: mpsc::Receiver<Queued>) {
    let mut batch = Vec::with_capacity(MAX_READ_BATCH);
    let mut warned: Option<Instant> = None;
    while queued.recv_many(&mut batch, MAX_READ_BATCH).await > 0 {
        // A statement that met a connection the database dropped while it sat idle (a
        // restart) is asked again, as any read is (`Store::read_one`). One that does
        // not answer in time fails as the writer's batches do: every send queued
        // behind it waits on it.
        let mut tries = lane.pool.options().get_max_connections();
        let read = loop {
            match timed(lane.timeout, read_batch(&lane.pool, &batch)).await {
                Err(StoreError::Database(e)) if tries > 0 && dropped_connection(&e) => tries -= 1,
                read => break read,
            }
        };
        let mut answers = match read {
            Ok(answers) => {
                READ_BATCHES.fetch_add(1, Ordering::Relaxed);
                READS.fetch_add(batch.len() as u64, Ordering::Relaxed);
                Some(Ok(answers))
            }
            // Out of reach: each caller is answered so at once (503), rather than
            // waiting once more for a connection of its own.
            Err(StoreError::Unavailable(why)) => Some(Err(why)),
            Err(e) if e.is_unavailable() => Some(Err(e.to_string())),
            Err(e) => {
                if let Some(log) = &lane.log
                    && warned.is_none_or(|at| at.elapsed() >= WARN_EVERY)
                {
                    slog::warn!(log, "a batch of the send path's reads failed; each of its reads runs alone";
                        "reads" => batch.len(), "error" => %e);
                    warned = Some(Instant::now());
                }
                None
            }
        };
        for (n, read) in batch.drain(..).enumerate() {
            let answer = match &mut answers {
                Some(Ok(contexts)) => Some(Ok(contexts[n].take())),
                Some(Err(why)) => Some(Err(StoreError::Unavailable(why.clone()))),
                None => None,
            };
            let _ = read.reply.send(answer);
        }
    }
}

/// Each read's context (`None` for a customer that does not exist), in batch order.
/// A batch of one runs the read of one send, which costs less than the batch's form.
async fn read_batch(pool: &AnyPool, batch: &[Queued]) -> Result<Vec<Option<SendContext>>, StoreError> {
    if let [one] = batch {
        let query = bind_all(sqlx::query(&SEND_FRESH_SQL[one.args.keyed()]), one.args.params());
        let row = query.fetch_optional(pool).await?;
        return Ok(vec![row.as_ref().map(SendContext::from_cols).transpose()?]);
    }
    let rows: Vec<BatchRow> = batch.iter().enumerate().map(|(n, read)| BatchRow::new(n, &read.args)).collect();
    let json = serde_json::to_string(&rows).map_err(|e| StoreError::Conflict(e.to_string()))?;
    let mut answers: Vec<Option<SendContext>> = (0..batch.len()).map(|_| None).collect();
    for row in sqlx::query(&SEND_BATCH_SQL).bind(json).fetch_all(pool).await? {
        let n: i64 = row.col("n")?;
        let slot = answers.get_mut(n as usize).ok_or_else(|| StoreError::Conflict(format!("read {n} of a batch")))?;
        *slot = Some(SendContext::from_cols(&row)?);
    }
    Ok(answers)
}

impl Store {
    /// The customer, its instance with this id (or else this name), whether `phone` is
    /// suppressed, the pacing counters, whether the request's API key is revoked and the
    /// state of its idempotency key `idem_key` (if it has one), in one read. The cache
    /// (see `cache`) only saves resolving an instance's name: the rows are always read
    /// as stored now.
    pub async fn send_context(
        &self,
        customer_id: &str,
        instance_ref: &str,
        phone: &str,
        api_key_id: Option<&str>,
        idem_key: Option<&str>,
        now: i64,
    ) -> Result<SendContext, StoreError> {
        let cached = self.cache.instance_id(customer_id, instance_ref);
        let generation = self.cache.generation();
        let mut args = ReadArgs {
            customer: customer_id.to_string(),
            instance: cached.clone().unwrap_or_else(|| instance_ref.to_string()),
            phone: phone.to_string(),
            api_key: api_key_id.map(str::to_string),
            idem_key: idem_key.map(str::to_string),
            now,
        };
        let missing = || StoreError::NotFound(format!("customer {customer_id}"));
        let mut context: Option<SendContext> = None;
        if cached.is_some() {
            context = Some(self.read_fresh(&args).await?.ok_or_else(missing)?);
        }
        // Not cached, or the cached id is gone (the instance was removed meanwhile):
        // resolve the id or name as the request gave it.
        let resolved = context.as_ref().is_some_and(|c| c.instance.is_some());
        if !resolved {
            args.instance = instance_ref.to_string();
            context = Some(self.read_one(&SEND_CONTEXT_SQL[args.keyed()], args.params()).await?.ok_or_else(missing)?);
        }
        let context = context.ok_or_else(missing)?;
        if !resolved && let Some(instance) = &context.instance {
            self.cache.put_instance_id(customer_id, instance_ref, &instance.id, generation);
        }
        Ok(context)
    }

    /// `SEND_FRESH_SQL`'s read of `args`: in a batch on PostgreSQL, else alone.
    async fn read_fresh(&self, args: &ReadArgs) -> Result<Option<SendContext>, StoreError> {
        if let Some(reads) = &self.send_reads
            && let Some(answer) = reads.read(args.clone()).await
        {
            return answer;
        }
        self.read_one(&SEND_FRESH_SQL[args.keyed()], args.params()).await
    }
}

#[cfg(test)]
#[path = "send_context_tests.rs"]
mod tests;
