//! The send-message body parser: any bytes give a request or a typed error, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = gateway_api::parse_json::<gateway_api::SendMessageRequest>(data) {
        // What parsed has only the contract's fields (unknown ones are refused).
        let _ = (request.instance_id, request.phone, request.message_purpose, request.media);
    }
});
