//! Evolution event normalisation: any JSON the provider posts becomes facts or nothing,
//! never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(envelope) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = gateway_server::ingress::evolution::parse(&envelope);
    }
});
