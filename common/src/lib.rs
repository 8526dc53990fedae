//! Types and math shared by the XDP programs and the userspace loader.
//!
//! Everything in [`types`] is `#[repr(C)]` and laid out identically on both sides of the
//! kernel boundary; [`hash`] is the one flow hash both sides compute. The Maglev table
//! builder ([`maglev`]) only runs in userspace and needs the `user` feature. [`quic_lb`] is
//! the QUIC-LB connection-id encoding the servers write and the data path reads (QUIC VIPs).
#![no_std]

#[cfg(feature = "user")]
extern crate alloc;
#[cfg(test)]
extern crate std;

pub mod hash;
pub mod limits;
pub mod prefix;
pub mod quic_lb;
pub mod types;

#[cfg(feature = "user")]
pub mod addr;
#[cfg(feature = "user")]
pub mod maglev;
