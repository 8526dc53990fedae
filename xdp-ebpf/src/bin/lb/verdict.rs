//! How a frame ended: the action the entry point returns and what `stats.rs` counts of it.

use spillway_common::types::Reason;

/// How a frame ended, and what its counters are.
pub struct Verdict {
    pub action: u32,
    pub reason: Reason,
    /// The VIP it was for and the backend it was sent to (their traffic counters).
    pub vip: Option<u32>,
    pub backend: Option<u32>,
    pub bytes: u32,
    /// A new flow was placed on a backend (counted as a new flow of both).
    pub new_flow: bool,
    /// Sent with a second candidate (`second_chance.rs`).
    pub second_chance: bool,
}

impl Verdict {
    #[inline(always)]
    pub fn ended(action: u32, reason: Reason) -> Verdict {
        Verdict { action, reason, vip: None, backend: None, bytes: 0, new_flow: false, second_chance: false }
    }
}
