//! The committed v1 contract (`openapi/openapi.json`), as bytes the server serves.
//!
//! `build.rs` refuses to build when the file is not an OpenAPI 3.0.3 document of
//! version 1.0.x, so a served contract is always a valid one. The drift test in
//! `gateway-api` keeps the file equal to what the API trait generates.

/// The exact text of `openapi/openapi.json`.
pub const OPENAPI_JSON: &str = include_str!(concat!(env!("OUT_DIR"), "/openapi.json"));

/// Hex SHA-256 of [`OPENAPI_JSON`] (served as the `ETag` of `GET /openapi.json`).
pub fn openapi_sha256() -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(OPENAPI_JSON.as_bytes()))
}
