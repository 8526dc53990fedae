//! What the API does, independent of sockets: owns the desired state, the reconciler and the
//! maps. A mutation is tried on a copy of the state, reconciled into the maps, persisted, and
//! only then becomes the current state; any failure rolls the maps back and changes nothing.

use std::{collections::BTreeSet, net::IpAddr};

use log::{error, info};
use spillway_common::{
    limits::DEFAULT_RING_SIZE,
    maglev::MAX_WEIGHT,
    types::{Reason, Traffic},
};

use crate::{
    api::{
        ApiError, BackendEntry, BackendList, BackendState, BackendStats, ErrorKind, ReasonCount, Reply, Request, Stats, VipEntry, VipList,
        VipStats,
    },
    dataplane::{BalancerMaps, DataplaneError},
    model::{DEFAULT_WEIGHT, DesiredState, ModelError},
    reconcile::{ApplyReport, Maps, ReconcileError, Reconciler},
    store::{Store, StoreError},
};

/// The counters `lbctl stats` reports; implemented by the real maps and, in tests, a fake.
pub trait Counters {
    fn vip_traffic(&self, id: u32) -> Result<Traffic, DataplaneError>;
    fn backend_traffic(&self, id: u32) -> Result<Traffic, DataplaneError>;
    fn reasons(&self) -> Result<Vec<(Reason, u64)>, DataplaneError>;
}

impl Counters for BalancerMaps {
    fn vip_traffic(&self, id: u32) -> Result<Traffic, DataplaneError> {
        BalancerMaps::vip_traffic(self, id)
    }
    fn backend_traffic(&self, id: u32) -> Result<Traffic, DataplaneError> {
        BalancerMaps::backend_traffic(self, id)
    }
    fn reasons(&self) -> Result<Vec<(Reason, u64)>, DataplaneError> {
        BalancerMaps::reasons(self)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("weight {weight} is out of range (1..={MAX_WEIGHT}); weight 0 is set by draining the backend")]
    WeightOutOfRange { weight: u32 },
    #[error("applying the change to the balancer's maps (rolled back)")]
    Apply(#[source] ReconcileError),
    #[error("saving the state (change rolled back)")]
    Persist(#[source] StoreError),
    #[error("reading counters")]
    Counters(#[source] DataplaneError),
}

impl CoreError {
    pub fn to_api(&self) -> ApiError {
        let kind = match self {
            Self::Model(_) | Self::WeightOutOfRange { .. } => ErrorKind::Invalid,
            Self::Apply(_) | Self::Persist(_) | Self::Counters(_) => ErrorKind::Internal,
        };
        ApiError { kind, message: error_chain(self) }
    }
}

/// `error: cause: cause`, so a single line names the root problem.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

pub struct Core<M, S> {
    state: DesiredState,
    reconciler: Reconciler,
    maps: M,
    store: S,
}

impl<M: Maps + Counters, S: Store> Core<M, S> {
    /// Adopts what the maps hold and makes them carry `state` (which was loaded from `store`).
    pub fn start(mut maps: M, store: S, state: DesiredState) -> Result<(Self, ApplyReport), ReconcileError> {
        let mut reconciler = Reconciler::adopt(&maps)?;
        let report = reconciler.apply(&mut maps, &state)?;
        Ok((Self { state, reconciler, maps, store }, report))
    }

    pub fn state(&self) -> &DesiredState {
        &self.state
    }

    #[cfg(test)]
    pub fn maps(&self) -> &M {
        &self.maps
    }

    /// Every backend address of every VIP (for neighbour upkeep).
    pub fn backend_addrs(&self) -> BTreeSet<IpAddr> {
        self.state.vips.values().flat_map(|c| c.backends.keys().copied()).collect()
    }

    pub fn handle(&mut self, request: Request) -> Result<Reply, CoreError> {
        match request {
            Request::ListVips => Ok(Reply::Vips(self.vips())),
            Request::ListBackends { vip } => Ok(Reply::Backends(self.backends(&vip)?)),
            Request::Stats => self.stats().map(Reply::Stats).map_err(CoreError::Counters),
            Request::AddVip { vip, ring_size } => {
                let ring_size = ring_size.unwrap_or(DEFAULT_RING_SIZE);
                self.mutate(&format!("op=add_vip vip={vip} ring_size={ring_size}"), |s| s.add_vip(vip, ring_size))
            }
            Request::RemoveVip { vip } => self.mutate(&format!("op=remove_vip vip={vip}"), |s| s.remove_vip(&vip).map(drop)),
            Request::AddBackend { vip, backend, weight } => {
                let weight = check_weight(weight.unwrap_or(DEFAULT_WEIGHT))?;
                self.mutate(&format!("op=add_backend vip={vip} backend={backend} weight={weight}"), |s| {
                    s.add_backend(&vip, backend, weight)
                })
            }
            Request::RemoveBackend { vip, backend } => {
                self.mutate(&format!("op=remove_backend vip={vip} backend={backend}"), |s| s.remove_backend(&vip, backend))
            }
            Request::DrainBackend { vip, backend } => {
                self.mutate(&format!("op=drain_backend vip={vip} backend={backend}"), |s| s.set_weight(&vip, backend, 0))
            }
            Request::SetWeight { vip, backend, weight } => {
                let weight = check_weight(weight)?;
                self.mutate(&format!("op=set_weight vip={vip} backend={backend} weight={weight}"), |s| s.set_weight(&vip, backend, weight))
            }
        }
    }

    fn mutate(&mut self, what: &str, edit: impl FnOnce(&mut DesiredState) -> Result<(), ModelError>) -> Result<Reply, CoreError> {
        let mut next = self.state.clone();
        edit(&mut next)?;
        next.validate()?;
        if next == self.state {
            info!("{what} changed=false");
            return Ok(Reply::Done { slots_written: 0, tables_flipped: 0 });
        }
        let report = match self.reconciler.apply(&mut self.maps, &next) {
            Ok(report) => report,
            Err(e) => {
                self.roll_back();
                return Err(CoreError::Apply(e));
            }
        };
        if let Err(e) = self.store.save(&next) {
            self.roll_back();
            return Err(CoreError::Persist(e));
        }
        self.state = next;
        info!("{what} slots_written={} tables_flipped={}", report.slots_written, report.tables_flipped);
        Ok(Reply::Done { slots_written: report.slots_written, tables_flipped: report.tables_flipped })
    }

    /// Puts the maps back to the current state. The reconciler's view may be stale after a
    /// failed apply, so it is rebuilt from the maps first.
    fn roll_back(&mut self) {
        let result = Reconciler::adopt(&self.maps).and_then(|mut r| {
            r.apply(&mut self.maps, &self.state)?;
            Ok(r)
        });
        match result {
            Ok(reconciler) => self.reconciler = reconciler,
            Err(e) => error!("rolling back the maps failed; restart lbd to resync: {}", error_chain(&e)),
        }
    }

    fn vips(&self) -> VipList {
        let vips = self
            .state
            .vips
            .iter()
            .map(|(vip, config)| VipEntry { vip: *vip, ring_size: config.ring_size, backends: config.backends.len() })
            .collect();
        VipList { vips }
    }

    fn backends(&self, vip: &crate::model::Vip) -> Result<BackendList, ModelError> {
        let config = self.state.vip(vip)?;
        let backends = config
            .backends
            .iter()
            .map(|(address, b)| BackendEntry { address: *address, weight: b.weight, state: BackendState::of_weight(b.weight) })
            .collect();
        Ok(BackendList { vip: *vip, backends })
    }

    fn stats(&self) -> Result<Stats, DataplaneError> {
        let traffic = |id: Option<u32>, read: &dyn Fn(u32) -> Result<Traffic, DataplaneError>| match id {
            Some(id) => read(id),
            None => Ok(Traffic::default()),
        };
        let mut vips = Vec::new();
        for (vip, config) in &self.state.vips {
            let t = traffic(self.reconciler.vip_id(vip), &|id| self.maps.vip_traffic(id))?;
            let mut backends = Vec::new();
            for address in config.backends.keys() {
                let b = traffic(self.reconciler.backend_id(vip, address), &|id| self.maps.backend_traffic(id))?;
                backends.push(BackendStats { address: *address, packets: b.packets, bytes: b.bytes });
            }
            vips.push(VipStats { vip: *vip, packets: t.packets, bytes: t.bytes, backends });
        }
        let reasons =
            self.maps.reasons()?.into_iter().map(|(reason, packets)| ReasonCount { reason: reason.label().to_owned(), packets }).collect();
        Ok(Stats { vips, reasons })
    }
}

fn check_weight(weight: u32) -> Result<u32, CoreError> {
    if weight == 0 || weight > MAX_WEIGHT {
        return Err(CoreError::WeightOutOfRange { weight });
    }
    Ok(weight)
}

#[cfg(test)]
mod tests;
