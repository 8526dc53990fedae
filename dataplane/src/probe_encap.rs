//! The probe-encapsulation program (`spillway_probe`, tc egress) of the balancer's object:
//! loading it, and its own maps. It shares the balancer's backends and configuration maps by
//! living in the same object.

use aya::{
    maps::{Array, MapData, PerCpuArray},
    programs::SchedClassifier,
};
use spillway_common::{
    limits::{map_names, program_names},
    types::{ProbeConfig, ProbeReason},
};

use super::{
    Balancer, DataplaneError,
    maps::{named, take},
};

/// The probe program's maps (not pinned: each `lbd` fills its own before the program goes live).
pub struct ProbeMaps {
    config: Array<MapData, ProbeConfig>,
    last: Array<MapData, u32>,
    reasons: PerCpuArray<MapData, u64>,
}

impl Balancer {
    /// Loads the probe program (the balancer's XDP program is loaded with the object) and
    /// hands over its maps. Call once.
    pub fn load_probe(&mut self) -> Result<(&mut SchedClassifier, ProbeMaps), DataplaneError> {
        let maps = ProbeMaps {
            config: take(&mut self.ebpf, map_names::PROBE_CONFIG)?,
            last: take(&mut self.ebpf, map_names::PROBE_LAST)?,
            reasons: take(&mut self.ebpf, map_names::PROBE_REASONS)?,
        };
        let program = self.probe_program()?;
        super::without_signals(|| program.load()).map_err(|source| DataplaneError::Program { name: program_names::PROBE, source })?;
        Ok((program, maps))
    }

    /// The probe program (after [`Self::load_probe`]: loaded), for attaching and test runs.
    pub fn probe_program(&mut self) -> Result<&mut SchedClassifier, DataplaneError> {
        let name = program_names::PROBE;
        let program = self.ebpf.program_mut(name).ok_or(DataplaneError::MissingProgram { name })?;
        program.try_into().map_err(|source| DataplaneError::Program { name, source })
    }
}

impl ProbeMaps {
    pub fn set_config(&mut self, config: &ProbeConfig) -> Result<(), DataplaneError> {
        named(map_names::PROBE_CONFIG, self.config.set(0, config, 0))
    }

    /// What the program last did with a probe to backend `id` (`None`: no probe yet).
    pub fn last(&self, id: u32) -> Result<Option<ProbeReason>, DataplaneError> {
        let last = named(map_names::PROBE_LAST, self.last.get(&id, 0))?;
        Ok(last.checked_sub(1).and_then(|r| ProbeReason::ALL.get(r as usize).copied()))
    }

    /// Every verdict with its count summed over CPUs.
    pub fn reasons(&self) -> Result<Vec<(ProbeReason, u64)>, DataplaneError> {
        ProbeReason::ALL
            .iter()
            .map(|&r| {
                let per_cpu = named(map_names::PROBE_REASONS, self.reasons.get(&(r as u32), 0))?;
                Ok((r, per_cpu.iter().sum()))
            })
            .collect()
    }
}
