//! QUIC VIPs: one server-id index entry per backend, (VIP id, server id) -> backend id and a
//! copy of the backend's entry, which is all a short header reads of it (each VIP's QUIC-LB
//! configuration is in its VIP slot: `sync_vip_flags`). Written after the backends they name
//! exist and before the VIP's flag sends its packets to the QUIC program; a copy is rewritten
//! when its backend's entry changes (at the end of the same apply), and a backend's entries go
//! before its slot is freed (`retire_quic_servers`), so no copy ever names a freed backend.

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
};

use spillway_common::{
    quic_lb::QuicLbConfig,
    types::{QuicServer, QuicServerKey},
};

use super::{Maps, ReconcileError, Reconciler};
use spillway_model::{DesiredState, server_ids};

impl Reconciler {
    pub(super) fn sync_quic_servers(&mut self, maps: &mut dyn Maps, desired: &DesiredState) -> Result<(), ReconcileError> {
        let mut servers = HashMap::new();
        for (vip, config) in &desired.vips {
            let Some(runtime) = self.vips.get(vip).filter(|_| config.quic.is_some()) else { continue };
            for (addr, server_id) in server_ids(config) {
                if let Some(&backend_id) = runtime.backends.get(&addr) {
                    // The entry as this apply left it (its flags or tunnel may have changed).
                    let server = QuicServer { backend_id, backend: self.backend_entry(backend_id, addr, runtime.id) };
                    servers.insert(QuicServerKey { vip_id: runtime.id, server_id }, server);
                }
            }
        }
        for (key, server) in &servers {
            if self.quic_servers.get(key) != Some(server) {
                maps.set_quic_server(key, server)?;
                self.quic_servers.insert(*key, *server);
            }
        }
        let stale: Vec<QuicServerKey> = self.quic_servers.keys().filter(|k| !servers.contains_key(k)).copied().collect();
        for key in stale {
            maps.remove_quic_server(&key)?;
            self.quic_servers.remove(&key);
        }
        Ok(())
    }

    /// Removes the server-id entries naming backend `id`, which is about to be freed: their
    /// copies would still say it is active.
    pub(super) fn retire_quic_servers(&mut self, maps: &mut dyn Maps, id: u32) -> Result<(), ReconcileError> {
        let named: Vec<QuicServerKey> = self.quic_servers.iter().filter(|(_, s)| s.backend_id == id).map(|(k, _)| *k).collect();
        for key in named {
            maps.remove_quic_server(&key)?;
            self.quic_servers.remove(&key);
        }
        Ok(())
    }
}

/// What a desired state wants of encrypted config ids, by (VIP id, config id): key files,
/// and the configurations beside the VIP slots' (`quic_next`).
pub(super) struct WantedKeys {
    keys: BTreeMap<(u32, u8), PathBuf>,
    configs: BTreeMap<(u32, u8), QuicLbConfig>,
}

pub(super) fn wanted_keys(reconciler: &Reconciler, desired: &DesiredState) -> WantedKeys {
    let mut wanted = WantedKeys { keys: BTreeMap::new(), configs: BTreeMap::new() };
    for (vip, config) in &desired.vips {
        let Some(runtime) = reconciler.vips.get(vip) else { continue };
        for quic in config.quic.iter().chain(&config.quic_next) {
            if let Some(file) = quic.key_file() {
                wanted.keys.insert((runtime.id, quic.config_id), file.to_path_buf());
            }
        }
        if let Some(next) = &config.quic_next {
            wanted.configs.insert((runtime.id, next.config_id), next.to_lb());
        }
    }
    wanted
}

impl Reconciler {
    /// Writes the keys, then the second config ids, that differ from what was written.
    pub(super) fn add_quic_keys(&mut self, maps: &mut dyn Maps, wanted: &WantedKeys) -> Result<(), ReconcileError> {
        for (&(vip_id, config_id), file) in &wanted.keys {
            if self.quic_keys.get(&(vip_id, config_id)) != Some(file) {
                maps.set_quic_key(vip_id, config_id, Some(file))?;
                self.quic_keys.insert((vip_id, config_id), file.clone());
            }
        }
        for (&(vip_id, config_id), config) in &wanted.configs {
            if self.quic_configs.get(&(vip_id, config_id)) != Some(config) {
                maps.set_quic_config(vip_id, config_id, Some(*config))?;
                self.quic_configs.insert((vip_id, config_id), *config);
            }
        }
        Ok(())
    }

    /// Removes the second config ids, then the keys, no longer wanted.
    pub(super) fn remove_quic_keys(&mut self, maps: &mut dyn Maps, wanted: &WantedKeys) -> Result<(), ReconcileError> {
        let stale: Vec<(u32, u8)> = self.quic_configs.keys().filter(|k| !wanted.configs.contains_key(k)).copied().collect();
        for (vip_id, config_id) in stale {
            maps.set_quic_config(vip_id, config_id, None)?;
            self.quic_configs.remove(&(vip_id, config_id));
        }
        let stale: Vec<(u32, u8)> = self.quic_keys.keys().filter(|k| !wanted.keys.contains_key(k)).copied().collect();
        for (vip_id, config_id) in stale {
            maps.set_quic_key(vip_id, config_id, None)?;
            self.quic_keys.remove(&(vip_id, config_id));
        }
        Ok(())
    }
}
