//! QUIC VIPs (QUIC-LB, plaintext): a packet with a short header whose connection id names
//! a server of the VIP goes to that server's backend, beside the connection table and the
//! limits; anything else (a long header, an id naming no server in use, an ICMP error) takes
//! the VIP's path like any UDP packet.

use spillway_common::{
    hash::connection_id_hash,
    quic_lb::{MAX_CID_LEN, QuicLbConfig, decode_server_id},
    types::{BACKEND_ACTIVE, BackendInfo},
};

use crate::{frame::UDP_LEN, state::MapState};

const LONG_HEADER: u8 = 0x80;
/// The farthest a UDP header is looked for.
const MAX_L4: usize = 1 << 13;

/// The backend the connection id of the UDP packet at `l4` names, its id, and the hash of
/// the id (the outer header's entropy).
pub(crate) fn named(state: &MapState, frame: &[u8], vip_id: u32, cfg: &QuicLbConfig, l4: usize) -> Option<(u32, BackendInfo, u32)> {
    if l4 > MAX_L4 {
        return None;
    }
    let payload = l4 + UDP_LEN;
    if frame.get(payload)? & LONG_HEADER != 0 {
        return None;
    }
    // The longest id is read, whatever the configuration's length.
    let cid = frame.get(payload + 1..payload + 1 + MAX_CID_LEN)?;
    let server = decode_server_id(cid, cfg).ok()?;
    let (_, named) = state.quic_servers.iter().find(|(key, _)| key.vip_id == vip_id && key.server_id.words() == server.words())?;
    let backend = named.backend;
    if backend.state != BACKEND_ACTIVE || backend.vip_id != vip_id {
        return None;
    }
    let word = |at: usize| u64::from_le_bytes(cid[at..at + 8].try_into().unwrap_or_default());
    let hash = connection_id_hash(word(0), word(8), cfg.cid_len() as u32, state.config.table_seed);
    Some((named.backend_id, backend, hash))
}
