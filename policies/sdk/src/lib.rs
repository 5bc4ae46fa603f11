//! `gateway-policy`: write Gateway policy modules in Rust.
//!
//! A policy is a type that implements [`Policy`] and is exported with one macro,
//! [`export_policy!`]. Built for `wasm32-unknown-unknown`, the crate becomes a
//! WebAssembly component (`gateway policy build`) that the gateway runs in a sandbox,
//! once per send, on a fresh instance; natively, the same code runs in `cargo test`,
//! and [`testing`] runs the fixture files that `gateway policy test` runs in the real
//! sandbox.
//!
//! ```ignore
//! use gateway_policy::{Decision, MessageContext, Policy, Stage, export_policy};
//!
//! pub struct NoMediaInOtp;
//!
//! impl Policy for NoMediaInOtp {
//!     fn evaluate(ctx: MessageContext) -> Decision {
//!         if ctx.purpose == "authentication" && ctx.media.is_some() {
//!             return Decision::deny("auth_with_media", "authentication messages carry no media", 90);
//!         }
//!         Decision::Allow
//!     }
//! }
//!
//! export_policy!(NoMediaInOtp, stages = "purpose");
//! ```
//!
//! On wasm32 the SDK also provides the module's allocator (a bump allocator over a
//! static arena: every evaluation is a fresh instance, so nothing is ever freed), so a
//! policy crate must not set its own `#[global_allocator]`.
//!
//! Why a wrapper around wit-bindgen rather than wit-bindgen alone: the export names of a
//! versioned interface (`gateway:policy/evaluator@0.1.0#evaluate`) are not valid native
//! linker symbols, so a crate that is both a `cdylib` and an `rlib` fails to link for
//! `cargo test`. The macro emits the exports only on wasm32, and also stamps the
//! module's name, version and stages into a custom section the gateway reads.

/// The bindings generated from the interface (`policies/wit/v0.1.0`).
pub mod bindings {
    wit_bindgen::generate!({
        world: "policy",
        path: "../wit/v0.1.0",
        pub_export_macro: true,
        export_macro_name: "__export_policy_wasm",
        default_bindings_module: "gateway_policy::bindings",
        additional_derives: [PartialEq],
    });
}

pub use bindings::exports::gateway::policy::evaluator::Guest as Policy;
pub use bindings::gateway::policy::types::{
    Counters, Customer, Decision, DenyInfo, Instance, Media, MediaKind, MessageContext, Recipient, ReviewInfo, Source,
    Stage,
};

/// The module's allocator: a bump allocator over a static arena (wasm32 only).
///
/// The gateway runs every evaluation on a fresh instance, so nothing needs freeing:
/// memory is handed out from an arena in the module's own (zero, untouched until used)
/// data, and given back with the whole instance. Besides being cheaper than a general
/// allocator, it means an evaluation never grows its memory, and growing memory costs
/// the gateway two `mprotect` calls (with a TLB shoot-down across its threads) per
/// evaluation. Past the arena, allocation falls back to the standard allocator.
#[cfg(target_arch = "wasm32")]
mod arena {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::UnsafeCell;

    const SIZE: usize = 256 * 1024;

    #[repr(C, align(16))]
    struct Arena {
        bytes: UnsafeCell<[u8; SIZE]>,
        used: UnsafeCell<usize>,
    }

    // wasm32 modules run single-threaded.
    unsafe impl Sync for Arena {}

    static ARENA: Arena = Arena { bytes: UnsafeCell::new([0; SIZE]), used: UnsafeCell::new(0) };

    pub struct Bump;

    impl Bump {
        fn contains(ptr: *mut u8) -> bool {
            let start = ARENA.bytes.get() as usize;
            (start..start + SIZE).contains(&(ptr as usize))
        }
    }

    unsafe impl GlobalAlloc for Bump {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let base = ARENA.bytes.get() as usize;
            // SAFETY: single-threaded; `used` is only touched here and in `realloc`.
            let used = unsafe { &mut *ARENA.used.get() };
            let start = (base + *used).next_multiple_of(layout.align());
            match start.checked_add(layout.size()) {
                Some(end) if end <= base + SIZE => {
                    *used = end - base;
                    start as *mut u8
                }
                _ => unsafe { System.alloc(layout) },
            }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            if !Self::contains(ptr) {
                unsafe { System.dealloc(ptr, layout) }
            }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            let base = ARENA.bytes.get() as usize;
            // SAFETY: as in `alloc`.
            let used = unsafe { &mut *ARENA.used.get() };
            // The newest block grows (or shrinks) where it is.
            if Self::contains(ptr)
                && ptr as usize + layout.size() == base + *used
                && ptr as usize + new_size <= base + SIZE
            {
                *used = ptr as usize + new_size - base;
                return ptr;
            }
            let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
            let new = unsafe { self.alloc(new_layout) };
            if !new.is_null() {
                unsafe { std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size)) };
                unsafe { self.dealloc(ptr, layout) };
            }
            new
        }
    }

    #[global_allocator]
    static GLOBAL: Bump = Bump;
}

/// The interface version this SDK builds modules for.
pub const INTERFACE_VERSION: &str = "0.1.0";

/// Name of the custom section that carries a module's metadata (JSON).
pub const METADATA_SECTION: &str = "gateway-policy";

/// The purposes the gateway's specification allows.
pub const PURPOSES: [&str; 5] = ["transactional", "operational", "support", "internal_team", "authentication"];

impl Decision {
    /// Refuse the send: a stable `code`, a `reason` the customer can act on, and a risk
    /// score from 0 to 100.
    pub fn deny(code: &str, reason: impl Into<String>, risk_score: u8) -> Decision {
        Decision::Deny(DenyInfo { code: code.into(), reason: reason.into(), risk_score: risk_score.min(100) })
    }

    /// Refuse the send and queue it for an operator's review.
    pub fn review(reason: impl Into<String>, risk_score: u8) -> Decision {
        Decision::Review(ReviewInfo { reason: reason.into(), risk_score: risk_score.min(100) })
    }
}

impl MessageContext {
    /// The words of the message: the text, or the caption of a media message ("" when
    /// there is neither).
    pub fn body(&self) -> &str {
        self.text.as_deref().or(self.caption.as_deref()).unwrap_or("")
    }

    /// Whether the customer is approved for the requested purpose.
    pub fn purpose_approved(&self) -> bool {
        self.customer.approved_purposes.iter().any(|p| p == &self.purpose)
    }

    /// Whether the requested purpose is one the specification allows at all.
    pub fn purpose_known(&self) -> bool {
        PURPOSES.contains(&self.purpose.as_str())
    }
}

/// Exports a [`Policy`] from this crate as the module's evaluator.
///
/// - `export_policy!(MyPolicy)`: named after the crate, asked at both stages;
/// - `export_policy!(MyPolicy, stages = "content")`: asked only at the content stage
///   (`"purpose"`, `"content"` or `"purpose,content"`);
/// - `export_policy!(MyPolicy, name = "my-rules", stages = "content")`;
/// - either of the last two with `, reads_counters = false` at the end: the module's
///   rules never look at `ctx.counters`. The gateway then gives it zeros there, and
///   does not ask it again when a send's place among concurrent sends changes the
///   counters (about a quarter of the policy work under load). Leave it out if any
///   rule reads a counter.
///
/// The module's version is the crate's version (`Cargo.toml`). Use it once per crate.
#[macro_export]
macro_rules! export_policy {
    ($policy:ident) => {
        $crate::export_policy!($policy, stages = "purpose,content");
    };
    ($policy:ident, stages = $stages:literal) => {
        $crate::__export_policy_json!($policy, (env!("CARGO_PKG_NAME")), $stages, ());
    };
    ($policy:ident, name = $name:literal, stages = $stages:literal) => {
        $crate::__export_policy_json!($policy, ($name), $stages, ());
    };
    ($policy:ident, stages = $stages:literal, reads_counters = $reads:literal) => {
        $crate::__export_policy_json!($policy, (env!("CARGO_PKG_NAME")), $stages, (",\"reads_counters\":", $reads,));
    };
    ($policy:ident, name = $name:literal, stages = $stages:literal, reads_counters = $reads:literal) => {
        $crate::__export_policy_json!($policy, ($name), $stages, (",\"reads_counters\":", $reads,));
    };
}

/// The metadata JSON of `export_policy!`: its name, the crate's version, the stages,
/// the interface version, then any further fields (`, "key": value` pieces).
#[doc(hidden)]
#[macro_export]
macro_rules! __export_policy_json {
    ($policy:ident, ($($name:tt)+), $stages:literal, ($($more:tt)*)) => {
        $crate::__export_policy_with_metadata!(
            $policy,
            concat!(
                "{\"name\":\"",
                $($name)+,
                "\",\"version\":\"",
                env!("CARGO_PKG_VERSION"),
                "\",\"stages\":\"",
                $stages,
                "\",\"interface\":\"0.1.0\"",
                $($more)*
                "}"
            )
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __export_policy_with_metadata {
    ($policy:ident, $metadata:expr) => {
        #[cfg(target_arch = "wasm32")]
        $crate::bindings::__export_policy_wasm!($policy with_types_in $crate::bindings);

        #[cfg(target_arch = "wasm32")]
        const _: () = {
            const METADATA: &str = $metadata;
            #[unsafe(link_section = "gateway-policy")]
            #[used]
            static GATEWAY_POLICY_METADATA: [u8; METADATA.len()] = $crate::__bytes::<{ METADATA.len() }>(METADATA);
        };

        // Natively the exports are left out; this keeps the type checked as a Policy.
        const _: fn() = || {
            fn is_policy<P: $crate::Policy>() {}
            is_policy::<$policy>();
        };
    };
}

/// The bytes of `s` as an array (for the metadata section).
#[doc(hidden)]
pub const fn __bytes<const N: usize>(s: &str) -> [u8; N] {
    let bytes = s.as_bytes();
    let mut out = [0u8; N];
    let mut i = 0;
    while i < N {
        out[i] = bytes[i];
        i += 1;
    }
    out
}

/// Native testing: build contexts, evaluate a policy, run fixture files.
///
/// ```ignore
/// #[test]
/// fn fixtures() {
///     gateway_policy::testing::assert_fixtures::<MyPolicy>("fixtures.json");
/// }
/// ```
#[cfg(not(target_arch = "wasm32"))]
pub mod testing {
    use super::*;
    use gateway_policy_model as model;
    pub use gateway_policy_model::{Context, Fixture, FixtureResult, Report, Verdict, parse_fixtures};

    /// The default context of fixture files (a transactional text send at the content
    /// stage to +14155550123 from a 30-day-old connected instance), as the policy sees it.
    pub fn context() -> MessageContext {
        to_wit(&Context::default())
    }

    /// A context with this text at this stage and purpose; the rest as [`context`].
    pub fn text(stage: Stage, purpose: &str, text: &str) -> MessageContext {
        MessageContext { stage, purpose: purpose.into(), text: Some(text.into()), ..context() }
    }

    /// The policy's view of a JSON-model context.
    pub fn to_wit(c: &Context) -> MessageContext {
        MessageContext {
            stage: match c.stage {
                model::Stage::Purpose => Stage::Purpose,
                model::Stage::Content => Stage::Content,
            },
            purpose: c.purpose.clone(),
            text: c.text.clone(),
            caption: c.caption.clone(),
            media: c.media.as_ref().map(|m| Media {
                kind: match m.kind {
                    model::MediaKind::Image => MediaKind::Image,
                    model::MediaKind::Document => MediaKind::Document,
                    model::MediaKind::Audio => MediaKind::Audio,
                },
                mime_type: m.mime_type.clone(),
                file_name: m.file_name.clone(),
                size_bytes: m.size_bytes,
            }),
            recipient: Recipient { phone: c.recipient.phone.clone(), country_code: c.recipient.country_code },
            instance: Instance {
                id: c.instance.id.clone(),
                name: c.instance.name.clone(),
                age_days: c.instance.age_days,
                connection_state: c.instance.connection_state.clone(),
            },
            customer: Customer {
                id: c.customer.id.clone(),
                plan: c.customer.plan.clone(),
                approved_purposes: c.customer.approved_purposes.clone(),
            },
            source: match c.source {
                model::Source::Api => Source::Api,
                model::Source::Pbx => Source::Pbx,
                model::Source::Dashboard => Source::Dashboard,
            },
            counters: Counters {
                to_recipient_24h: c.counters.to_recipient_24h,
                to_recipient_total: c.counters.to_recipient_total,
                replies_from_recipient: c.counters.replies_from_recipient,
                new_recipients_today: c.counters.new_recipients_today,
                sent_today: c.counters.sent_today,
            },
        }
    }

    /// A decision in the fixture files' terms.
    pub fn verdict(d: Decision) -> Verdict {
        match d {
            Decision::Allow => Verdict::Allow,
            Decision::Deny(i) => Verdict::Deny { code: i.code, reason: i.reason, risk_score: i.risk_score },
            Decision::Review(i) => Verdict::Review { reason: i.reason, risk_score: i.risk_score },
        }
    }

    /// Evaluates `P` on a JSON-model context.
    pub fn evaluate<P: Policy>(c: &Context) -> Verdict {
        verdict(P::evaluate(to_wit(c)))
    }

    /// Runs every fixture of the file at `path` (relative paths are relative to the
    /// crate, where `cargo test` runs) natively against `P`.
    pub fn run_fixtures<P: Policy>(path: impl AsRef<std::path::Path>) -> Result<Report, String> {
        let path = path.as_ref();
        let json = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        let fixtures = parse_fixtures(&json).map_err(|e| format!("{}: {e}", path.display()))?;
        let results = fixtures
            .into_iter()
            .map(|f| FixtureResult { outcome: f.expect.check(&evaluate::<P>(&f.context)), name: f.name, fuel: None })
            .collect();
        Ok(Report { results })
    }

    /// Runs the fixtures and panics, printing the report, if any fails.
    pub fn assert_fixtures<P: Policy>(path: impl AsRef<std::path::Path>) {
        let report = run_fixtures::<P>(path).unwrap_or_else(|e| panic!("{e}"));
        println!("{report}");
        assert_eq!(report.failed(), 0, "failing fixtures:\n{report}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo;

    impl Policy for Echo {
        fn evaluate(ctx: MessageContext) -> Decision {
            match ctx.body() {
                "deny" => Decision::deny("echo", "asked to deny", 250),
                "review" => Decision::review("asked to review", 40),
                _ => Decision::Allow,
            }
        }
    }

    export_policy!(Echo, name = "echo", stages = "content");

    #[test]
    fn risk_is_capped_and_body_prefers_text() {
        assert_eq!(
            Echo::evaluate(testing::text(Stage::Content, "support", "deny")),
            Decision::deny("echo", "asked to deny", 100)
        );
        let mut ctx = testing::context();
        ctx.caption = Some("review".into());
        assert_eq!(ctx.body(), "review");
        assert!(ctx.purpose_known() && ctx.purpose_approved());
    }

    #[test]
    fn fixture_files_run_natively() {
        let dir = std::env::temp_dir().join(format!("gateway-policy-sdk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("fixtures.json");
        std::fs::write(
            &path,
            r#"[{"name": "plain", "context": {"text": "hello"}, "expect": {"decision": "allow"}},
                {"name": "denied", "context": {"text": "deny"}, "expect": {"decision": "deny", "code": "echo"}},
                {"name": "wrong on purpose", "context": {"text": "review"}, "expect": {"decision": "allow"}}]"#,
        )
        .unwrap();
        let report = testing::run_fixtures::<Echo>(&path).unwrap();
        assert_eq!(report.summary(), "2 passed, 1 failed");
        assert!(report.to_string().contains("FAIL  wrong on purpose: expected decision allow, got review"));
        std::fs::remove_dir_all(&dir).ok();
    }
}
