//! The control plane's pure decisions: a backend's health from its probe outcomes over time,
//! with placement across zones and the capacity budget (`health`), and whether a VIP address
//! is announced, degraded or withdrawn (`announce`). No I/O and no clock: time comes in as an
//! argument (Unix ms in `lbd`), so every decision replays in a test.

pub mod announce;
pub mod health;
