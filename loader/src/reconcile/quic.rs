//! QUIC VIPs: each one's QUIC-LB configuration in the slot of its VIP id, and one entry per
//! backend, (VIP id, server id) -> backend id. Written after the backends they name exist
//! and before the VIP's flag sends its packets to the QUIC program; entries of VIPs and
//! backends gone are removed (the data path also checks that an entry's backend serves the
//! VIP, so an entry outliving its backend for a moment misroutes nothing).

use std::collections::HashMap;

use spillway_common::{quic_lb::QuicLbConfig, types::QuicServerKey};

use super::{Maps, ReconcileError, Reconciler};
use crate::model::{DesiredState, server_ids};

impl Reconciler {
    pub(super) fn sync_quic(&mut self, maps: &mut dyn Maps, desired: &DesiredState) -> Result<(), ReconcileError> {
        let mut configs = vec![QuicLbConfig::EMPTY; self.capacity.vips as usize];
        let mut servers = HashMap::new();
        for (vip, config) in &desired.vips {
            let (Some(quic), Some(runtime)) = (config.quic, self.vips.get(vip)) else { continue };
            configs[runtime.id as usize] = quic.to_lb();
            for (addr, server_id) in server_ids(config) {
                if let Some(&backend_id) = runtime.backends.get(&addr) {
                    servers.insert(QuicServerKey { vip_id: runtime.id, server_id }, backend_id);
                }
            }
        }
        for (id, (want, have)) in configs.iter().zip(self.quic_configs.iter_mut()).enumerate() {
            if want != have {
                maps.set_quic_config(id as u32, want)?;
                *have = *want;
            }
        }
        for (key, &backend_id) in &servers {
            if self.quic_servers.get(key) != Some(&backend_id) {
                maps.set_quic_server(key, backend_id)?;
                self.quic_servers.insert(*key, backend_id);
            }
        }
        let stale: Vec<QuicServerKey> = self.quic_servers.keys().filter(|k| !servers.contains_key(k)).copied().collect();
        for key in stale {
            maps.remove_quic_server(&key)?;
            self.quic_servers.remove(&key);
        }
        Ok(())
    }
}
