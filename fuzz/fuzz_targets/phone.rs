//! Phone normalisation: any text gives an E.164 number or nothing; a number it gives
//! normalises to itself.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Some(phone) = gateway_server::phone::normalize(text) {
        assert!(phone.e164.starts_with('+') && phone.e164[1..].bytes().all(|b| b.is_ascii_digit()), "{}", phone.e164);
        assert!(phone.e164.len() <= 16, "{}", phone.e164);
        let again = gateway_server::phone::normalize(&phone.e164).expect("an E.164 number normalises");
        assert_eq!(again.e164, phone.e164);
    }
});
