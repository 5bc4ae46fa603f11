//! The process's logger: bunyan JSON lines (on stderr, or appended to `log_file`)
//! written by a thread of their own, or human-readable lines on stderr (`pretty`).
//!
//! A request never waits on the log. A record below the level costs nothing: the
//! filter stands in front of the queue. A record at or above it is copied into a
//! bounded queue ([`QUEUE`] records); when the queue is full the record is dropped
//! and counted (`gateway_log_records_dropped_total`), never waited for. The writing
//! thread buffers lines and hands them to the file at the end of each round (or when
//! the buffer fills), so a busy second costs a few writes instead of one per line.
//!
//! The writing thread is woken by a record only when it found none the last time it
//! looked: a line written in a quiet moment reaches the file at once. After a round
//! that wrote lines it sleeps [`PAUSE`] and looks again, so under load no record wakes
//! it (a wake-up is a system call on the request's thread and a switch on the writer's:
//! about half the log thread's time when it was woken for each record; BENCHMARKS.md,
//! issue 22, twenty-ninth session). [`flush`] (a clean stop) writes whatever is still
//! queued.

use crate::config::Config;
use dropshot::{ConfigLogging, ConfigLoggingLevel};
use slog::{Drain, Level, Logger, OwnedKVList, Record};
use std::io::{self, BufWriter, Write};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Records waiting for the writing thread at most; more are dropped and counted.
pub const QUEUE: usize = 8192;
/// Bytes of lines the writing thread holds before it writes them out.
const BUFFER: usize = 64 * 1024;
/// How long the writing thread sleeps after a round that wrote lines before it looks
/// at the queue again: the queue holds what comes meanwhile, so more than [`QUEUE`]
/// records within one pause are dropped (and counted).
pub const PAUSE: Duration = Duration::from_millis(5);

/// One guard per queued logger made in this process: dropping it writes what is
/// queued and ends its thread.
static GUARDS: Mutex<Vec<Guard>> = Mutex::new(Vec::new());

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
    let (logger, guard) = start(out, level);
    GUARDS.lock().unwrap_or_else(|e| e.into_inner()).push(guard);
    logger
}

/// A logger writing to `out` from a thread of its own, and the guard that ends it.
fn start(out: Box<dyn Write + Send>, level: Level) -> (Logger, Guard) {
    let lines = Lines(Arc::new(Mutex::new(BufWriter::with_capacity(BUFFER, out))));
    // The JSON drain writes lines into the buffer; the writing thread hands them over.
    let json = slog_bunyan::with_name("gateway", lines.clone()).set_flush(false).build();
    let (tx, rx) = mpsc::sync_channel(QUEUE);
    let thread = std::thread::Builder::new()
        .name("log".into())
        .spawn(move || write_lines(&rx, &json, &lines))
        .expect("the log thread starts");
    let guard = Guard { tx: tx.clone(), thread: Some(thread) };
    (Logger::root(slog::LevelFilter(Queue { tx }, level).ignore_res(), slog::o!()), guard)
}

/// What the writing thread takes off the queue.
enum Message {
    Record(slog_async::AsyncRecord),
    /// End: everything queued before it has been written.
    Stop,
}

/// Ends a writing thread when dropped, once it has written what was queued before.
struct Guard {
    tx: SyncSender<Message>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Waits for room if the queue is full: the thread is writing it out.
        let _ = self.tx.send(Message::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The writing thread: blocks for a record when the last look found none; after a
/// round that wrote some, sleeps [`PAUSE`] and looks again. Each round writes every
/// record queued by then and hands the lines to the file. Ends at `Stop` (the queue
/// keeps its order, so what was logged before has been written; what follows is
/// counted as dropped), or when every sender is gone.
fn write_lines<W: Write>(rx: &Receiver<Message>, json: &slog_json::Json<W>, lines: &Lines) {
    let mut busy = false;
    loop {
        let first = match busy {
            true => {
                std::thread::sleep(PAUSE);
                rx.try_recv().ok()
            }
            false => match rx.recv() {
                Ok(message) => Some(message),
                Err(_) => return,
            },
        };
        let Some(mut message) = first else {
            // Nothing came during the pause: block until something does.
            busy = false;
            continue;
        };
        loop {
            match message {
                // A log that cannot be written (a full disk) must not stop the gateway.
                Message::Record(record) => {
                    let _ = record.log_to(json);
                }
                Message::Stop => {
                    lines.hand_over();
                    while let Ok(Message::Record(_)) = rx.try_recv() {
                        crate::metrics::get().log_records_dropped.inc();
                    }
                    return;
                }
            }
            match rx.try_recv() {
                Ok(next) => message = next,
                Err(_) => break,
            }
        }
        lines.hand_over();
        busy = true;
    }
}

/// The request side: queues a copy of the record, or drops and counts it when the
/// queue is full (or its thread has ended).
struct Queue {
    tx: SyncSender<Message>,
}

impl Drain for Queue {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), slog::Never> {
        let record = slog_async::AsyncRecord::from(record, values);
        if self.tx.try_send(Message::Record(record)).is_err() {
            crate::metrics::get().log_records_dropped.inc();
        }
        Ok(())
    }
}

/// The lines the JSON drain wrote and the writing thread has not yet handed to the
/// file. Both sides are the writing thread, so the lock is never contended; the drain
/// never flushes (the thread does, at the end of each round).
#[derive(Clone)]
struct Lines(Arc<Mutex<BufWriter<Box<dyn Write + Send>>>>);

impl Lines {
    /// Hands the buffered lines to the file.
    fn hand_over(&self) {
        // A log that cannot be written (a full disk) must not stop the gateway.
        let _ = self.0.lock().unwrap_or_else(|e| e.into_inner()).flush();
    }
}

impl Write for Lines {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).write(bytes)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

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

    /// A writer that counts the writes it was given.
    #[derive(Clone, Default)]
    struct Counted(Arc<AtomicUsize>, Shared);

    impl Write for Counted {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.fetch_add(1, Ordering::SeqCst);
            self.1.write(bytes)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_steady_stream_is_written_in_rounds_not_a_wake_up_per_line() {
        let out = Counted::default();
        let log = queued(Box::new(out.clone()), Level::Info);
        let started = std::time::Instant::now();
        let lines_sent = 2000;
        for i in 0..lines_sent {
            slog::info!(log, "line"; "i" => i);
            std::thread::sleep(Duration::from_micros(100));
        }
        let elapsed = started.elapsed();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while lines(&out.1).len() < lines_sent {
            assert!(std::time::Instant::now() < deadline, "only {} lines written", lines(&out.1).len());
            std::thread::sleep(Duration::from_millis(5));
        }
        let written = lines(&out.1);
        assert!(written.iter().enumerate().all(|(i, l)| l["i"] == i), "lines out of order");
        // A round each PAUSE while lines come, and at most one more each time a pause
        // found none and the thread waited to be woken: a writer woken by every line
        // would hand its buffer to the file about once a line.
        let writes = out.0.load(Ordering::SeqCst);
        let bound = 2 * (elapsed.as_millis() as usize / PAUSE.as_millis() as usize + 2);
        assert!(writes <= bound, "{writes} writes for {lines_sent} lines in {elapsed:?} (at most {bound})");
    }

    #[test]
    fn the_stop_writes_what_is_queued_and_later_records_are_counted_as_dropped() {
        let out = Shared::default();
        let (log, guard) = start(Box::new(out.clone()), Level::Info);
        for i in 0..500 {
            slog::info!(log, "line"; "i" => i);
        }
        drop(guard);
        assert_eq!(lines(&out).len(), 500, "what was queued before the stop is written");
        let before = crate::metrics::get().log_records_dropped.get();
        slog::info!(log, "after the stop");
        assert!(crate::metrics::get().log_records_dropped.get() > before, "a record after the stop is counted");
        assert_eq!(lines(&out).len(), 500);
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
