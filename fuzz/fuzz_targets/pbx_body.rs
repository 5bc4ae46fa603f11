//! The PBX webhook body: any bytes parse to a request or a typed error; a parsed
//! request's fields are what its JSON said.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = gateway_api::parse_json::<gateway_api::PbxWebhookRequest>(data) {
        if let Some(event) = request.event_type.as_deref() {
            let _ = gateway_api::PbxEventType::parse(event);
        }
        for phone in [&request.to, &request.customer_phone].into_iter().flatten() {
            let _ = gateway_server::phone::normalize(phone);
        }
    }
});
