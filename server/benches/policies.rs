//! Policy evaluation: each bundled module on a fresh instance in the sandbox, the same
//! rules compiled natively beside it, and what both stages add to a send through the
//! engine the pipeline uses (blocking-pool hop included).
//!
//! ```sh
//! cargo bench -p gateway-server --bench policies     # or bench/policies.sh for the table
//! ```

use criterion::{Criterion, criterion_group, criterion_main};
use gateway_policy_model::{Context, Stage};
use gateway_server::config::PolicySettings;
use gateway_server::policy::host::PolicyHost;
use gateway_server::policy::{PolicyEngine, bundled};
use std::hint::black_box;
use std::sync::Arc;

/// A clean transactional message of about 450 bytes: nothing matches, so every rule
/// reads all of it (the content policy's worst ordinary case).
const TEXT: &str = "Hello Ana, this is a confirmation that your order 55102 from the downtown store is being \
    prepared. The courier will collect it this afternoon and you will receive the tracking number as soon as the \
    parcel is scanned at the depot. Delivery is expected on Thursday between 9am and 1pm. If nobody is at home the \
    courier will leave a note with the pickup address. You can change the delivery address until tomorrow at noon \
    from your account page. Thank you for shopping with us.";

fn context(stage: Stage) -> Context {
    let mut ctx = Context { stage, purpose: "transactional".into(), text: Some(TEXT.into()), ..Context::default() };
    ctx.counters.to_recipient_total = 3;
    ctx.counters.to_recipient_24h = 1;
    ctx.counters.sent_today = 40;
    ctx
}

fn host() -> Arc<PolicyHost> {
    let dir = std::env::temp_dir().join("gateway-bench-wasm-cache");
    let settings = PolicySettings { cache_dir: dir.display().to_string(), ..PolicySettings::default() };
    let host = PolicyHost::new(&settings, slog::Logger::root(slog::Discard, slog::o!())).expect("policy host");
    let modules = bundled::MODULES
        .iter()
        .map(|(name, bytes)| Arc::new(host.load(bytes, name, true).unwrap_or_else(|e| panic!("{name}: {e}"))))
        .collect();
    host.install(modules);
    Arc::new(host)
}

fn fresh_instance(c: &mut Criterion) {
    let host = host();
    let set = host.current();
    let mut group = c.benchmark_group("fresh");
    for module in &set.modules {
        let stage = module.stages[0];
        let converted = module.convert(&context(stage));
        group.bench_function(module.metadata.name.as_str(), |b| {
            b.iter(|| black_box(module.evaluate(black_box(&converted), host.limits())))
        });
    }
    group.finish();
}

fn native(c: &mut Criterion) {
    let purpose = gateway_policy::testing::to_wit(&context(Stage::Purpose));
    let content = gateway_policy::testing::to_wit(&context(Stage::Content));
    let mut group = c.benchmark_group("native");
    group.bench_function("purpose", |b| b.iter(|| black_box(policy_purpose::decide(black_box(&purpose)))));
    group.bench_function("content", |b| {
        b.iter(|| black_box(policy_content::decide(black_box(content.body()), black_box(&content.purpose))))
    });
    group.bench_function("pacing", |b| b.iter(|| black_box(policy_pacing::decide(black_box(&content)))));
    group.finish();
}

fn per_send(c: &mut Criterion) {
    let host = host();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (purpose, content) = (context(Stage::Purpose), context(Stage::Content));
    // Both stages through the engine the pipeline calls, in a task of the server's
    // kind of runtime (a loop inside one task, so thread wake-ups are not measured).
    c.bench_function("send/both-stages", |b| {
        b.iter_custom(|iters| {
            let (host, purpose, content) = (host.clone(), purpose.clone(), content.clone());
            runtime.block_on(async move {
                tokio::spawn(async move {
                    let started = std::time::Instant::now();
                    for _ in 0..iters {
                        let first = host.evaluate(black_box(&purpose)).await;
                        let second = host.evaluate(black_box(&content)).await;
                        black_box((first, second));
                    }
                    started.elapsed()
                })
                .await
                .unwrap()
            })
        })
    });
}

criterion_group!(benches, fresh_instance, native, per_send);
criterion_main!(benches);
