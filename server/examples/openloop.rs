//! Open-loop load for the benchmarks (bench/run.sh, bench/compare.sh): one POST every
//! 1/RATE seconds for SECONDS, each sent at its time whether or not the earlier ones have
//! been answered, so a slow answer never lowers the offered rate; each latency counts
//! from the moment the request was due, so a stall of the load generator itself is
//! charged to the answer rather than hidden (no coordinated omission). Closed-loop
//! tools (wrk, and hey's rate limit, whose workers also fire together) measure
//! something else: how long a burst of requests takes to drain.
//!
//!   cargo run --release --example openloop -- URL RATE SECONDS BODY   # env API_KEY
//!
//! Prints one line: the offered and answered rate, the answers that were not 2xx, and
//! the 50th, 90th, 99th and 99.9th percentiles and the maximum, in milliseconds; then
//! how late the thread that keeps the times woke (its 99.9th percentile and maximum): a
//! stall of the machine shows there as well as in the answers. With
//! `OPENLOOP_TRACE=FILE` it also writes each request's due time and latency (ms, one
//! line each) to FILE, to see when the slow answers came.

use std::time::{Duration, Instant};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, rate, seconds, body] = &args[..] else {
        eprintln!("usage: openloop URL RATE SECONDS BODY (the API key in API_KEY)");
        std::process::exit(2);
    };
    let rate: f64 = rate.parse().expect("RATE is requests per second");
    let seconds: f64 = seconds.parse().expect("SECONDS");
    let total = (rate * seconds).round() as usize;
    let period = Duration::from_secs_f64(1.0 / rate);
    let client = reqwest::Client::builder().pool_max_idle_per_host(1024).build().expect("client");
    let key = std::env::var("API_KEY").ok().filter(|k| !k.is_empty());
    let start = Instant::now() + Duration::from_millis(50);
    // A thread of its own keeps the times. tokio's timer rounds every deadline up to its
    // next millisecond tick, so each request left up to 1 ms after it was due, and that
    // wait was charged to the answer: against the bare echo this tool measured a p50 of
    // 1.0 to 1.7 ms and a p99 of 1.8 to 2.5 ms (BENCHMARKS.md, issue 22, thirty-first
    // session). `thread::sleep` wakes within the kernel's timer slack (50 µs) of the time
    // asked.
    //
    // How late the thread itself woke is kept too: on a virtual machine whose host
    // stalls it for milliseconds, every request due in the stall is late, and the line
    // says so beside the percentiles.
    let (due_tx, mut due_rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let pacer = std::thread::spawn(move || {
        let mut late = Vec::with_capacity(total);
        for i in 0..total {
            let due = start + period.mul_f64(i as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            late.push(due.elapsed());
            if due_tx.send(due).is_err() {
                break;
            }
        }
        late
    });
    let mut tasks = Vec::with_capacity(total);
    while let Some(due) = due_rx.recv().await {
        let mut request = client.post(url).header("content-type", "application/json").body(body.clone());
        if let Some(key) = &key {
            request = request.bearer_auth(key);
        }
        tasks.push(tokio::spawn(async move {
            let ok = match request.send().await {
                Ok(response) => {
                    let ok = response.status().is_success();
                    let _ = response.bytes().await;
                    ok
                }
                Err(_) => false,
            };
            (due - start, due.elapsed(), ok)
        }));
    }
    let mut latencies = Vec::with_capacity(total);
    let mut failed = 0;
    let trace_to = std::env::var("OPENLOOP_TRACE").ok();
    let mut trace = String::new();
    for task in tasks {
        let (at, latency, ok) = task.await.expect("request task");
        if trace_to.is_some() {
            trace.push_str(&format!("{:.3} {:.3}\n", at.as_secs_f64() * 1e3, latency.as_secs_f64() * 1e3));
        }
        latencies.push(latency);
        failed += usize::from(!ok);
    }
    if let Some(path) = trace_to {
        std::fs::write(&path, trace).expect("OPENLOOP_TRACE is a writable file");
    }
    let elapsed = start.elapsed().as_secs_f64();
    let mut late = pacer.join().expect("the pacing thread");
    latencies.sort_unstable();
    late.sort_unstable();
    println!(
        "offered {rate:.0}/s answered {:.0}/s non-2xx {failed} p50 {:.1} ms p90 {:.1} ms p99 {:.1} ms p99.9 {:.1} ms max {:.1} ms; \
         the pacer woke late by: p99.9 {:.1} ms max {:.1} ms",
        total as f64 / elapsed,
        quantile(&latencies, 0.50),
        quantile(&latencies, 0.90),
        quantile(&latencies, 0.99),
        quantile(&latencies, 0.999),
        quantile(&latencies, 1.0),
        quantile(&late, 0.999),
        quantile(&late, 1.0)
    );
}

/// The `q` quantile of `sorted` in milliseconds.
fn quantile(sorted: &[Duration], q: f64) -> f64 {
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)].as_secs_f64() * 1e3
}
