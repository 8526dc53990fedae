//! A configuration file applied as one change (the same path as every edit: try on a copy,
//! reconcile, persist, swap), and the state exported as a file.

use std::{collections::BTreeMap, net::IpAddr, path::PathBuf, time::Instant};

use super::{Core, CoreError, Counters};
use crate::settings::{RunningSettings, Section, Settings};
use crate::store::{ConfigMark, Store};
use crate::wall_clock::unix_ms;
use spillway_api::{Applied, ConfigStatus, Exported, Reply, Started};
use spillway_logging::event;
use spillway_model::config::{self, Change, ChangeKind, ConfigError, Document, Item};
use spillway_model::{
    DesiredState, Vip,
    host::{Host, HostError},
};
use spillway_reconcile::Maps;

/// How this `lbd` runs, for `status` and `export`; set once it is attached.
#[derive(Debug)]
pub struct DaemonInfo {
    pub started: Instant,
    pub xdp_mode: &'static str,
    pub pin_dir: PathBuf,
    pub state_dir: PathBuf,
    pub zone: Option<String>,
    pub settings: RunningSettings,
    /// The `--config` file's fate; `None` without one.
    pub config: Option<ConfigStatus>,
    /// The balancer's own port watcher, or why it is not loaded.
    pub watcher: Result<spillway_model::ports_report::WatcherStatus, String>,
    /// What the host allows a change to add (`Host::check`).
    pub host: Host,
    /// Where the entry program is pinned for the operator's root program (`--xdp-attach none`).
    pub entry_program: Option<PathBuf>,
    /// `--pass-to`.
    pub pass_to: Option<PathBuf>,
}

impl Default for DaemonInfo {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            xdp_mode: "native",
            pin_dir: PathBuf::new(),
            state_dir: PathBuf::new(),
            zone: None,
            settings: RunningSettings::default(),
            config: None,
            watcher: Err("not loaded yet".to_owned()),
            host: Host::default(),
            entry_program: None,
            pass_to: None,
        }
    }
}

#[derive(Debug, Default)]
pub struct ApplyOptions {
    /// Check and report only (`lbctl diff`).
    pub dry_run: bool,
    /// Remove VIPs that still have backends (their connections break).
    pub allow_vip_removal: bool,
    /// Remove backends that still serve (weight above 0: not drained first) from VIPs that stay.
    pub allow_backend_removal: bool,
    /// This is `lbd`'s own `--config` file at this path: once applied, remember what it
    /// declared (see `ConfigMark`).
    pub mark_as: Option<PathBuf>,
}

/// `lbd`'s own `--config` file and what it declared when `lbd` last took it in: the rule
/// for which state wins (README, "Which state wins") needs both.
#[derive(Debug)]
pub struct OwnConfig {
    pub path: PathBuf,
    pub taken_in: Option<ConfigMark>,
}

impl<M: Maps + Counters, S: Store> Core<M, S> {
    pub fn set_info(&mut self, info: DaemonInfo) {
        self.info = info;
    }

    /// Names `lbd`'s own `--config` file and the mark of what it declared when last taken in.
    pub fn set_own_config(&mut self, path: PathBuf, taken_in: Option<ConfigMark>) {
        self.own_config = Some(OwnConfig { path, taken_in });
    }

    /// Whether `doc` declares what `lbd`'s own `--config` file declared when `lbd` last took it
    /// in: then a SIGHUP has nothing to apply, and the running state (`lbctl` edits made since
    /// included) stays.
    pub fn own_config_unchanged(&self, doc: &Document) -> bool {
        let Some(own) = &self.own_config else { return false };
        let (Some(mark), Ok(declared)) = (&own.taken_in, doc.desired_state()) else { return false };
        mark.matches(&own.path, &declared)
    }

    /// `lbd`'s own `--config` file's path when it declares what `doc` declares now: an
    /// `lbctl apply -f` of that file (or of a copy) takes it in, so that a restart does not
    /// apply it again over the `lbctl` edits made after.
    pub(super) fn own_config_declaring(&self, doc: &Document) -> Option<PathBuf> {
        let own = self.own_config.as_ref()?;
        let theirs = Document::read(&own.path).ok()?.desired_state().ok()?;
        let ours = doc.desired_state().ok()?;
        (ConfigMark::of(&own.path, &theirs) == ConfigMark::of(&own.path, &ours)).then(|| own.path.clone())
    }

    /// Records what became of the `--config` file (start, SIGHUP).
    pub fn set_config_status(&mut self, status: ConfigStatus) {
        self.info.config = Some(status);
    }

    /// Makes `doc`'s desired state the current one, as one change. Refused whole, changing
    /// nothing, when the file is invalid (its `[lbd]` and `[agent]` settings included), adds
    /// what this host cannot serve (`Host::check`), removes a VIP that still has backends
    /// without `allow_vip_removal`, or removes a backend that still serves (not drained
    /// first) without `allow_backend_removal`; a dry run then reports those removals as refused.
    pub fn apply_file(&mut self, doc: &Document, options: ApplyOptions) -> Result<Applied, CoreError> {
        let mut next = doc.desired_state().map_err(CoreError::Config)?;
        let mark = options.mark_as.as_deref().map(|path| ConfigMark::of(path, &next));
        let settings = Settings::from_file(doc, Section::Lbd).map_err(CoreError::Config)?;
        let mut notes = self.info.settings.notes(&settings);
        Settings::from_file(doc, Section::Agent).map_err(CoreError::Config)?;
        // A backend past its drain deadline was removed; the file does not bring it back.
        let now = unix_ms();
        for config in next.vips.values_mut() {
            config.backends.retain(|_, b| b.drain_deadline_unix_ms.is_none_or(|deadline| deadline > now));
        }
        // Here rather than only in `mutate`, so that the diff and the answer show the starts.
        let started: Vec<Started> = next
            .stamp_starts(&self.state, now)
            .into_iter()
            .map(|(vip, backend, started_at_unix_ms)| Started { vip, backend, started_at_unix_ms })
            .collect();
        self.info.host.check(&self.state, &next).map_err(|e| CoreError::Config(host_refusal(doc, e)))?;
        let cut: BTreeMap<Vip, usize> = self
            .state
            .vips
            .iter()
            .filter(|(vip, config)| !next.vips.contains_key(vip) && !config.backends.is_empty())
            .map(|(vip, config)| (*vip, config.backends.len()))
            .collect();
        let serving_cut = serving_backends_removed(&self.state, &next);
        let refused_vips = !cut.is_empty() && !options.allow_vip_removal;
        let refused_backends = !serving_cut.is_empty() && !options.allow_backend_removal;
        let mut changes = config::diff(&self.state, &next);
        if options.dry_run {
            if let Some(wanted) = self.info.settings.uplinks_from(&settings) {
                let (from, to) = (self.wanted_uplinks().join(","), wanted.join(","));
                notes.push(format!("lbd.iface: the balancer would move from {from} to {to} while running"));
            }
            if refused_vips {
                mark_refused_removals(&mut changes, &cut);
            }
            if refused_backends {
                mark_refused_backend_removals(&mut changes, &serving_cut);
            }
            return Ok(Applied { applied: false, changes, notes, slots_written: 0, tables_flipped: 0, started });
        }
        if refused_vips {
            let vips: Vec<String> = cut.iter().map(|(vip, n)| format!("{vip} ({n} backends)")).collect();
            return Err(CoreError::VipRemoval { file: doc.name().to_owned(), vips: vips.join(", ") });
        }
        if refused_backends {
            let backends: Vec<String> = serving_cut.iter().map(|(vip, backend)| format!("{backend} of {vip}")).collect();
            return Err(CoreError::BackendRemoval { file: doc.name().to_owned(), backends: backends.join(", ") });
        }
        for change in &changes {
            event!(info, "config_change", source = doc.name(), change = change);
        }
        let what = super::change("apply").field("source", &doc.name()).field("changes", &changes.len());
        let Reply::Done { slots_written, tables_flipped } = self.mutate(what, |state| {
            *state = next;
            Ok(())
        })?
        else {
            unreachable!("a mutation answers Done")
        };
        notes.extend(self.take_uplinks(&settings));
        if let Some(mark) = mark {
            // The state is applied and saved; without the mark the next start applies the
            // file again, which changes nothing it did not declare.
            if let Err(e) = self.store.save_config_mark(&mark) {
                event!(warn, "config_mark_not_saved", file = crate::store::CONFIG_MARK_FILE, error = spillway_logging::error_chain(&e));
            }
            if let Some(own) = self.own_config.as_mut().filter(|own| own.path == mark.file) {
                own.taken_in = Some(mark);
            }
        }
        Ok(Applied { applied: true, changes, notes, slots_written, tables_flipped, started })
    }

    /// Persists the state `lbd` started from, which `mark` says its `--config` file declared
    /// (a first start from the file).
    pub fn save_started_state(&mut self, mark: &ConfigMark) -> Result<(), CoreError> {
        self.store.save(&self.state).map_err(CoreError::Persist)?;
        self.store.save_config_mark(mark).map_err(CoreError::Persist)?;
        self.set_own_config(mark.file.clone(), Some(mark.clone()));
        Ok(())
    }

    /// The desired state and the settings `lbd` was given, as a configuration file.
    pub(super) fn export(&self) -> Exported {
        let settings = self.info.settings.effective.to_table(Section::Lbd);
        Exported { config: config::export(&self.state, (!settings.is_empty()).then_some(settings)) }
    }
}

/// A host refusal placed on the file's field it is about.
pub fn host_refusal(doc: &Document, error: HostError) -> ConfigError {
    let path = match &error {
        HostError::LocalAddress { vip, .. } => doc.field_of(vip, None),
        HostError::NoOuterSource { vip, backend, .. } => doc.field_of(vip, Some(*backend)),
    };
    doc.refuse(&path, error.to_string())
}

/// The backends that serve in `now` (weight above 0) and that `next` removes from a VIP it
/// keeps: their connections break, as a removed VIP's would.
fn serving_backends_removed(now: &DesiredState, next: &DesiredState) -> Vec<(Vip, IpAddr)> {
    let kept = now.vips.iter().filter_map(|(vip, config)| next.vips.get(vip).map(|after| (vip, config, after)));
    kept.flat_map(|(vip, config, after)| {
        config
            .backends
            .iter()
            .filter(|(address, b)| b.weight > 0 && !after.backends.contains_key(address))
            .map(|(address, _)| (*vip, *address))
    })
    .collect()
}

/// Marks the removal of each backend in `cut` as one apply would refuse.
fn mark_refused_backend_removals(changes: &mut [Change], cut: &[(Vip, IpAddr)]) {
    for change in changes.iter_mut().filter(|c| c.change == ChangeKind::Removed && c.item == Item::Backend) {
        if change.vip.zip(change.backend).is_some_and(|removed| cut.contains(&removed)) {
            change.refused =
                Some("the backend still serves, its connections would break: drain it first, or needs --allow-backend-removal".to_owned());
        }
    }
}

/// Marks the removal of each VIP in `cut` (and of its backends) as one apply would refuse.
fn mark_refused_removals(changes: &mut [Change], cut: &BTreeMap<Vip, usize>) {
    for change in changes.iter_mut().filter(|c| c.change == ChangeKind::Removed) {
        if let Some(n) = change.vip.as_ref().and_then(|vip| cut.get(vip)).filter(|_| change.rule.is_none()) {
            change.refused = Some(format!("the VIP has {n} backends, whose connections would break: needs --allow-vip-removal"));
        }
    }
}
