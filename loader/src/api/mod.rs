//! `lbd`'s control API: one JSON request per line on a Unix socket, answered by one JSON
//! response line. The field and tag names below are a public interface: add, never rename.
//!
//! ```text
//! -> {"op":"add_backend","vip":"10.0.0.1:80/tcp","backend":"10.0.1.1","weight":100}
//! <- {"ok":{"type":"done","slots_written":2017,"tables_flipped":1}}
//! <- {"error":{"kind":"invalid","message":"unknown VIP 10.0.0.1:80/tcp"}}
//! ```

pub mod client;

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::model::Vip;

/// Where `lbd` listens and `lbctl` connects unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/spillway/api.sock";

/// Largest request line the server reads; anything longer is refused.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    ListVips,
    /// `ring_size` defaults to `limits::DEFAULT_RING_SIZE`.
    AddVip {
        vip: Vip,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ring_size: Option<u32>,
    },
    RemoveVip {
        vip: Vip,
    },
    ListBackends {
        vip: Vip,
    },
    /// `weight` defaults to `model::DEFAULT_WEIGHT`; 0 is refused (see `DrainBackend`).
    AddBackend {
        vip: Vip,
        backend: IpAddr,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        weight: Option<u32>,
    },
    RemoveBackend {
        vip: Vip,
        backend: IpAddr,
    },
    /// Weight 0: the backend keeps its flows but gets no new ones.
    DrainBackend {
        vip: Vip,
        backend: IpAddr,
    },
    /// A weight of at least 1 (undrains a drained backend).
    SetWeight {
        vip: Vip,
        backend: IpAddr,
        weight: u32,
    },
    Stats,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    Ok(Reply),
    Error(ApiError),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    /// A mutation took effect (or changed nothing); what it cost in map writes.
    Done {
        slots_written: usize,
        tables_flipped: usize,
    },
    Vips(VipList),
    Backends(BackendList),
    Stats(Stats),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// Not a request this server understands (bad JSON, unknown op or field).
    BadRequest,
    /// A well-formed request the desired state refuses (unknown VIP, duplicate, limits).
    Invalid,
    /// The peer is not root.
    PermissionDenied,
    /// Applying or persisting failed; the change was rolled back.
    Internal,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VipList {
    pub vips: Vec<VipEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VipEntry {
    pub vip: Vip,
    pub ring_size: u32,
    /// Number of backends, draining ones included.
    pub backends: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendList {
    pub vip: Vip,
    pub backends: Vec<BackendEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendEntry {
    pub address: IpAddr,
    pub weight: u32,
    pub state: BackendState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendState {
    Active,
    /// Weight 0: existing flows only.
    Draining,
}

impl BackendState {
    pub fn of_weight(weight: u32) -> Self {
        if weight == 0 { Self::Draining } else { Self::Active }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Draining => "draining",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    pub vips: Vec<VipStats>,
    /// Every `Reason` in `Reason::ALL` order, under its `label()`.
    pub reasons: Vec<ReasonCount>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VipStats {
    pub vip: Vip,
    pub packets: u64,
    pub bytes: u64,
    pub backends: Vec<BackendStats>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendStats {
    pub address: IpAddr,
    pub packets: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReasonCount {
    pub reason: String,
    pub packets: u64,
}

#[cfg(test)]
mod tests;
