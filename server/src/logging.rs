//! The process's logger: bunyan JSON lines (on stderr, or appended to `log_file`)
//! written by a thread of their own, or human-readable lines on stderr (`pretty`).
//!
//! A request never waits on the log. A record below the level costs nothing: the
//! filter stands in front of the queue. A record at or above it is copied into a
//! bounded queue ([`QUEUE`] records); when the queue is full the record is dropped
//! and counted (`gateway_log_records_dropped_total`), never waited for. The writing
//! thread buffers lines and hands them to the file when the queue runs empty (or the
//! buffer fills), so a busy second costs a few writes instead of one per line, and a
//! line written in a quiet moment reaches the file at once. [`flush`] (a clean stop)
//! writes whatever is still queued.

use crate::config::Config;
use dropshot::{ConfigLogging, ConfigLoggingLevel};
use slog::{Drain, Level, Logger, OwnedKVList, Record};
use std::io::{self, BufWriter, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Records waiting for the writing thread at most; more are dropped and counted.
pub const QUEUE: usize = 8192;
/// Bytes of lines the writing thread holds before it writes them out.
const BUFFER: usize = 64 * 1024;

/// One guard per queued logger made in this process: dropping it writes what is
/// queued and ends its thread.
static GUARDS: Mutex<Vec<slog_async::AsyncGuard>> = Mutex::new(Vec::new());

/// The root logger `config` asks for. Stdout is left to the CLI's JSON output.
pub fn make_logger(config: &Config) -> Result<Logger, String> {
    let level = match config.log_level.as_str() {
        "trace" => Level::Trace,
        "debug" => Level::Debug,
        "info" => Level::Info,
        "warn" => Level::Warning,
        "error" => Level::Error,
        "critical" => Level::Critical,
        other => return Err(format!("unknown log level {other:?}")),
    };
    let out: Box<dyn Write + Send> = match (config.log_format.as_str(), &config.log_file) {
        ("pretty", None) => {
            let level = match level {
                Level::Trace => ConfigLoggingLevel::Trace,
                Level::Debug => ConfigLoggingLevel::Debug,
                Level::Info => ConfigLoggingLevel::Info,
                Level::Warning => ConfigLoggingLevel::Warn,
                Level::Error => ConfigLoggingLevel::Error,
                Level::Critical => ConfigLoggingLevel::Critical,
            };
            return ConfigLogging::StderrTerminal { level }.to_logger("gateway").map_err(|e| e.to_string());
        }
        (_, Some(path)) => {
            let path = std::path::Path::new(path);
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
            }
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            eprintln!("note: configured to log to \"{}\"", path.display());
            Box::new(file)
        }
        (_, None) => Box::new(io::stderr()),
    };
    Ok(queued(out, level))
}

/// Writes what every queued logger of this process still holds, and ends their
/// threads; records logged afterwards are dropped (and counted). For the end of
/// `main`.
pub fn flush() {
    let guards = std::mem::take(&mut *GUARDS.lock().unwrap_or_else(|e| e.into_inner()));
    drop(guards);
}

fn queued(out: Box<dyn Write + Send>, level: Level) -> Logger {
    let pending = Arc::new(AtomicUsize::new(0));
    let out = IdleFlush { out: BufWriter::with_capacity(BUFFER, out), pending: pending.clone() };
    let json = slog_bunyan::with_name("gateway", out).set_flush(true).build();
    let writer = Writer { json, pending: pending.clone() };
    let (core, guard) =
        slog_async::AsyncCore::custom(writer).chan_size(QUEUE).thread_name("log".into()).build_with_guard();
    GUARDS.lock().unwrap_or_else(|e| e.into_inner()).push(guard);
    Logger::root(slog::LevelFilter(Queue { core, pending }, level).ignore_res(), slog::o!())
}

/// The request side: counts the record in, or drops and counts it when the queue is
/// full.
struct Queue {
    core: slog_async::AsyncCore,
    /// Records queued and not yet taken by the writing thread.
    pending: Arc<AtomicUsize>,
}

impl Drain for Queue {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), slog::Never> {
        self.pending.fetch_add(1, Ordering::AcqRel);
        if self.core.log(record, values).is_err() {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            crate::metrics::get().log_records_dropped.inc();
        }
        Ok(())
    }
}

/// The writing thread's side: takes a record off the count, then writes it.
struct Writer<W: Write> {
    json: slog_json::Json<W>,
    pending: Arc<AtomicUsize>,
}

impl<W: Write> Drain for Writer<W> {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), slog::Never> {
        self.pending.fetch_sub(1, Ordering::AcqRel);
        // A log that cannot be written (a full disk) must not stop the gateway.
        let _ = self.json.log(record, values);
        Ok(())
    }
}

/// Lines buffered until no record is waiting (the JSON drain asks for a flush after
/// every line; it happens only when the queue is empty, or by itself when the
/// buffer is full).
struct IdleFlush<W: Write> {
    out: BufWriter<W>,
    pending: Arc<AtomicUsize>,
}

impl<W: Write> Write for IdleFlush<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.out.write(bytes)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.pending.load(Ordering::Acquire) == 0 { self.out.flush() } else { Ok(()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that shares what it was given.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn lines(out: &Shared) -> Vec<serde_json::Value> {
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    #[test]
    fn a_quiet_line_is_written_at_once_and_below_the_level_nothing_is_queued() {
        let out = Shared::default();
        let log = queued(Box::new(out.clone()), Level::Info);
        slog::debug!(log, "not this");
        slog::info!(log, "send accepted"; "req_id" => "r1");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while lines(&out).is_empty() {
            assert!(std::time::Instant::now() < deadline, "the line never reached the writer");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let written = lines(&out);
        assert_eq!(written.len(), 1, "{written:?}");
        assert_eq!(written[0]["msg"], "send accepted");
        assert_eq!(written[0]["req_id"], "r1");
        assert_eq!(written[0]["name"], "gateway");
        assert_eq!(written[0]["level"], 30, "bunyan's info");
    }

    #[test]
    fn a_full_queue_drops_and_counts_never_waits() {
        /// A file that takes a second per write: the queue fills behind it.
        struct Slow;
        impl Write for Slow {
            fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
                std::thread::sleep(std::time::Duration::from_secs(1));
                Ok(bytes.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                std::thread::sleep(std::time::Duration::from_secs(1));
                Ok(())
            }
        }
        let before = crate::metrics::get().log_records_dropped.get();
        let log = queued(Box::new(Slow), Level::Info);
        let started = std::time::Instant::now();
        for i in 0..(QUEUE + 4000) {
            slog::info!(log, "line"; "i" => i);
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "logging waited on the writer");
        let dropped = crate::metrics::get().log_records_dropped.get() - before;
        assert!(dropped >= 2000, "only {dropped} dropped");
    }
}
