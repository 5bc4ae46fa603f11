//! Network addresses: outbound safety for every feature that reaches a customer-given
//! URL (webhook endpoints, media URLs): which addresses are public ([`ranges`]) and the
//! guard that resolves a URL and refuses the rest ([`ssrf`]), the HTTP client that
//! connects only to what the guard checked ([`guarded`]); inbound, the address a
//! request came from behind the operator's proxies ([`client_addr`]).

pub mod client_addr;
pub mod guarded;
pub mod ranges;
pub mod ssrf;
