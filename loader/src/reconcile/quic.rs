//! QUIC VIPs: one server-id index entry per backend, (VIP id, server id) -> backend id
//! (each VIP's QUIC-LB configuration is in its VIP slot: `sync_vip_flags`). Written after the
//! backends they name exist and before the VIP's flag sends its packets to the QUIC program;
//! entries of VIPs and backends gone are removed (the data path also checks that an entry's
//! backend serves the VIP, so an entry outliving its backend for a moment misroutes nothing).

use std::collections::HashMap;

use spillway_common::types::QuicServerKey;

use super::{Maps, ReconcileError, Reconciler};
use crate::model::{DesiredState, server_ids};

impl Reconciler {
    pub(super) fn sync_quic_servers(&mut self, maps: &mut dyn Maps, desired: &DesiredState) -> Result<(), ReconcileError> {
        let mut servers = HashMap::new();
        for (vip, config) in &desired.vips {
            let Some(runtime) = self.vips.get(vip).filter(|_| config.quic.is_some()) else { continue };
            for (addr, server_id) in server_ids(config) {
                if let Some(&backend_id) = runtime.backends.get(&addr) {
                    servers.insert(QuicServerKey { vip_id: runtime.id, server_id }, backend_id);
                }
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
