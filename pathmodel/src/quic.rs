//! QUIC VIPs (QUIC-LB, plaintext): a packet with a short header whose connection id names
//! a server of the VIP goes to that server's backend, beside the connection table and the
//! limits; anything else (a long header, an id naming no server in use, an ICMP error) takes
//! the VIP's path like any UDP packet.

use spillway_common::{
    hash::connection_id_hash,
    quic_lb::{CONFIG_ID_SHIFT, MAX_CID_LEN, QuicLbConfig, decode_server_id},
    types::{BACKEND_ACTIVE, BackendInfo},
};

use crate::{ModelError, frame::UDP_LEN, state::MapState};

const LONG_HEADER: u8 = 0x80;
/// The farthest a UDP header is looked for.
const MAX_L4: usize = 1 << 13;

/// The backend the connection id of the UDP packet at `l4` names, its id, and the hash of
/// the id (the outer header's entropy). The id's config id picks the VIP's configuration, or
/// the other one it has during a rotation.
pub(crate) fn named(
    state: &MapState,
    frame: &[u8],
    vip_id: u32,
    vip_cfg: &QuicLbConfig,
    l4: usize,
) -> Result<Option<(u32, BackendInfo, u32)>, ModelError> {
    if l4 > MAX_L4 {
        return Ok(None);
    }
    let payload = l4 + UDP_LEN;
    let Some(first) = frame.get(payload) else {
        return Ok(None);
    };
    // The longest id is read, whatever the configuration's length.
    let Some(cid) = frame.get(payload + 1..payload + 1 + MAX_CID_LEN).filter(|_| first & LONG_HEADER == 0) else {
        return Ok(None);
    };
    let config_id = cid[0] >> CONFIG_ID_SHIFT;
    let cfg = if config_id == vip_cfg.config_id {
        *vip_cfg
    } else {
        state.quic_configs.get(&(vip_id, config_id)).copied().unwrap_or(QuicLbConfig::EMPTY)
    };
    if cfg.is_encrypted() {
        return Err(ModelError::Unmodelled("encrypted QUIC-LB ids (the kernel's crypto)"));
    }
    Ok(by_server(state, vip_id, &cfg, cid, vip_cfg.cid_len()))
}

/// The server a plaintext id names, if in use by the VIP; the id is hashed at `hashed_len`
/// octets (the VIP's configuration's, whichever one decoded it).
fn by_server(state: &MapState, vip_id: u32, cfg: &QuicLbConfig, cid: &[u8], hashed_len: usize) -> Option<(u32, BackendInfo, u32)> {
    let server = decode_server_id(cid, cfg).ok()?;
    let (_, named) = state.quic_servers.iter().find(|(key, _)| key.vip_id == vip_id && key.server_id.words() == server.words())?;
    let backend = named.backend;
    if backend.state != BACKEND_ACTIVE || backend.vip_id != vip_id {
        return None;
    }
    let word = |at: usize| u64::from_le_bytes(cid[at..at + 8].try_into().unwrap_or_default());
    let hash = connection_id_hash(word(0), word(8), hashed_len as u32, state.config.table_seed);
    Some((named.backend_id, backend, hash))
}
