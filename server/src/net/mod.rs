//! Outbound network safety shared by every feature that reaches a customer-given URL
//! (media URLs now, webhook URLs later).

pub mod ssrf;
