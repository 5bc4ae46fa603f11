//! Dashboard form parsing: any body is a form or a typed refusal.
#![no_main]
use gateway_server::dashboard::Form;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(form) = Form::from_body("application/x-www-form-urlencoded; charset=utf-8", data) {
        let _ = (form.get("email"), form.raw("password"), form.opt("csrf"), form.checked("event_"));
    }
});
