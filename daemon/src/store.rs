//! The desired state on disk: `<state-dir>/state.json`, replaced atomically (temp file in
//! the same directory, fsync, rename, fsync the directory) so a crash leaves either the old
//! or the new state, never a torn one. A file that does not parse or validate is refused,
//! never overwritten: it may be the only record of what the balancer should do.

use std::{
    fs::{self, DirBuilder, File, OpenOptions},
    io::{self, Write},
    net::IpAddr,
    os::unix::fs::{DirBuilderExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use spillway_logging::event;
use spillway_model::{DesiredState, ModelError, Vip};
use spillway_policy::health::Restored;

pub const STATE_FILE: &str = "state.json";
/// Backend health as the last `lbd` left it: a cache that spares serving backends a new slow
/// start after a restart. Losing it costs nothing else, so a bad one is ignored.
pub const HEALTH_FILE: &str = "health.json";
/// Which desired state of the `--config` file `lbd` last applied (see [`ConfigMark`]).
pub const CONFIG_MARK_FILE: &str = "config-applied.json";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("reading state file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("state file {} is corrupt (fix or move it away; lbd never overwrites it)", path.display())]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("state file {} holds an invalid state (fix or move it away; lbd never overwrites it)", path.display())]
    Invalid {
        path: PathBuf,
        #[source]
        source: ModelError,
    },
    #[error("writing state file {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Where mutations are persisted; the daemon core is generic over it for tests.
pub trait Store {
    fn save(&mut self, state: &DesiredState) -> Result<(), StoreError>;
    fn save_health(&mut self, snapshot: &HealthSnapshot) -> Result<(), StoreError>;
    fn save_config_mark(&mut self, mark: &ConfigMark) -> Result<(), StoreError>;
}

/// The `--config` file and a hash of the desired state it declared when `lbd` last took it
/// in (at start, on SIGHUP, or through `lbctl apply -f` of a file declaring the same): at
/// the next start or SIGHUP the file is applied again only if what it declares changed since,
/// so `lbctl` edits made meanwhile are kept. Comments, `[lbd]` edits and the `started_at`
/// lines `lbctl apply` writes into the file do not count as changes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ConfigMark {
    pub file: PathBuf,
    /// FNV-1a (64 bits) of the state's JSON without backends' starts: BTreeMaps make that
    /// serialization canonical.
    pub state_fnv1a64: String,
}

impl ConfigMark {
    pub fn of(file: &Path, state: &DesiredState) -> Self {
        let mut declared = state.clone();
        for backend in declared.vips.values_mut().flat_map(|c| c.backends.values_mut()) {
            backend.started_at_unix_ms = None;
        }
        Self::hashed(file, &declared)
    }

    /// Whether `state`, declared by `file`, is what this mark recorded. Marks written before
    /// starts were left out hashed the state as declared: those still match an unchanged file.
    pub fn matches(&self, file: &Path, state: &DesiredState) -> bool {
        *self == Self::of(file, state) || *self == Self::hashed(file, state)
    }

    fn hashed(file: &Path, state: &DesiredState) -> Self {
        let json = serde_json::to_vec(state).unwrap_or_default();
        let hash = json.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3));
        Self { file: file.to_owned(), state_fnv1a64: format!("{hash:016x}") }
    }
}

/// Health as persisted across restarts (`health.json` next to the state file).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HealthSnapshot {
    pub backends: Vec<SnapshotEntry>,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SnapshotEntry {
    pub vip: Vip,
    pub backend: IpAddr,
    pub state: Restored,
}

pub struct StateFile {
    dir: PathBuf,
    path: PathBuf,
}

impl StateFile {
    /// The state file in `dir`, which is created (mode 0700) if missing.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|source| StoreError::Write { path: dir.to_owned(), source })?;
        Ok(Self { dir: dir.to_owned(), path: dir.join(STATE_FILE) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The saved state, or `None` when nothing was ever saved.
    pub fn load(&self) -> Result<Option<DesiredState>, StoreError> {
        let text = match fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(StoreError::Read { path: self.path.clone(), source }),
        };
        let state: DesiredState = serde_json::from_str(&text).map_err(|source| StoreError::Corrupt { path: self.path.clone(), source })?;
        state.validate().map_err(|source| StoreError::Invalid { path: self.path.clone(), source })?;
        Ok(Some(state))
    }

    /// The persisted health snapshot, if there is a readable one.
    pub fn load_health(&self) -> Option<HealthSnapshot> {
        let path = self.dir.join(HEALTH_FILE);
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(e) => {
                event!(warn, "health_file_ignored", path = path.display(), error = e);
                return None;
            }
        };
        serde_json::from_str(&text).map_err(|e| event!(warn, "health_file_ignored", path = path.display(), error = e)).ok()
    }

    /// The mark of the last applied `--config` file; `None` if there is none (or it is
    /// unreadable: then the file is applied again, which changes nothing it did not declare).
    pub fn load_config_mark(&self) -> Option<ConfigMark> {
        let text = fs::read_to_string(self.dir.join(CONFIG_MARK_FILE)).ok()?;
        serde_json::from_str(&text).map_err(|e| event!(warn, "config_mark_ignored", file = CONFIG_MARK_FILE, error = e)).ok()
    }

    fn write_json(&self, name: &str, value: &impl serde::Serialize) -> Result<(), StoreError> {
        let path = self.dir.join(name);
        let mut json = serde_json::to_vec_pretty(value).map_err(|e| StoreError::Write { path: path.clone(), source: e.into() })?;
        json.push(b'\n');
        self.write_atomically(name, &json).map_err(|source| StoreError::Write { path, source })
    }

    fn write_atomically(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let target = self.dir.join(name);
        let temp = self.dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let result = (|| {
            let mut file = OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&temp)?;
            file.write_all(bytes)?;
            file.sync_all()?;
            fs::rename(&temp, &target)?;
            // The rename is durable only once the directory entry is.
            File::open(&self.dir)?.sync_all()
        })();
        if result.is_err() {
            let _ = fs::remove_file(&temp);
        }
        result
    }
}

impl Store for StateFile {
    fn save(&mut self, state: &DesiredState) -> Result<(), StoreError> {
        self.write_json(STATE_FILE, state)
    }

    fn save_health(&mut self, snapshot: &HealthSnapshot) -> Result<(), StoreError> {
        self.write_json(HEALTH_FILE, snapshot)
    }

    fn save_config_mark(&mut self, mark: &ConfigMark) -> Result<(), StoreError> {
        self.write_json(CONFIG_MARK_FILE, mark)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TempDir;

    fn sample() -> DesiredState {
        let mut state = DesiredState::default();
        let vip = "10.0.0.1:80/tcp".parse().unwrap();
        state.add_vip(vip, 251).unwrap();
        state.add_backend(&vip, "10.0.1.1".parse().unwrap(), 100).unwrap();
        state
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    }

    #[test]
    fn missing_file_is_no_state() {
        let tmp = TempDir::new("store-missing");
        assert_eq!(StateFile::open(&tmp.path().join("sub")).unwrap().load().unwrap(), None);
    }

    #[test]
    fn save_then_load_round_trips_and_leaves_no_temp_file() {
        let tmp = TempDir::new("store-roundtrip");
        let mut store = StateFile::open(tmp.path()).unwrap();
        store.save(&sample()).unwrap();
        store.save(&DesiredState::default()).unwrap();
        store.save(&sample()).unwrap();
        assert_eq!(StateFile::open(tmp.path()).unwrap().load().unwrap(), Some(sample()));
        assert_eq!(entries(tmp.path()), [STATE_FILE]);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(fs::metadata(store.path()).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn corrupt_file_is_refused_naming_it_and_left_alone() {
        let tmp = TempDir::new("store-corrupt");
        let store = StateFile::open(tmp.path()).unwrap();
        fs::write(store.path(), "{\"vips\": {").unwrap();
        let err = store.load().unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }));
        assert!(err.to_string().contains(&store.path().display().to_string()), "{err}");
        assert_eq!(fs::read_to_string(store.path()).unwrap(), "{\"vips\": {");
    }

    #[test]
    fn invalid_state_is_refused_naming_it() {
        let tmp = TempDir::new("store-invalid");
        let store = StateFile::open(tmp.path()).unwrap();
        fs::write(store.path(), r#"{"vips":{"10.0.0.1:80/tcp":{"ring_size":100,"backends":{}}}}"#).unwrap();
        let err = store.load().unwrap_err();
        assert!(matches!(err, StoreError::Invalid { source: ModelError::BadRingSize { size: 100 }, .. }), "{err:?}");
        assert!(err.to_string().contains(STATE_FILE), "{err}");
    }

    #[test]
    fn config_mark_round_trips_and_tells_states_apart() {
        let tmp = TempDir::new("store-mark");
        let mut store = StateFile::open(tmp.path()).unwrap();
        assert_eq!(store.load_config_mark(), None);
        let file = Path::new("/etc/spillway/spillway.toml");
        let mark = ConfigMark::of(file, &sample());
        assert_eq!(mark, ConfigMark::of(file, &sample()));
        assert_ne!(mark, ConfigMark::of(file, &DesiredState::default()));
        assert_ne!(mark, ConfigMark::of(Path::new("/etc/other.toml"), &sample()));
        store.save_config_mark(&mark).unwrap();
        assert_eq!(store.load_config_mark(), Some(mark));
        fs::write(tmp.path().join(CONFIG_MARK_FILE), "{").unwrap();
        assert_eq!(store.load_config_mark(), None);
    }

    #[test]
    fn a_mark_ignores_starts_and_a_mark_from_before_that_still_matches() {
        let file = Path::new("/etc/spillway/spillway.toml");
        let mut started = sample();
        let (vip, backend) = ("10.0.0.1:80/tcp".parse().unwrap(), "10.0.1.1".parse().unwrap());
        started.vips.get_mut(&vip).unwrap().backends.get_mut(&backend).unwrap().started_at_unix_ms = Some(5);
        let mark = ConfigMark::of(file, &sample());
        assert_eq!(ConfigMark::of(file, &started), mark);
        assert!(mark.matches(file, &started));
        // Written before starts were left out: the state hashed as declared.
        let legacy = ConfigMark::hashed(file, &started);
        assert_ne!(legacy, mark);
        assert!(legacy.matches(file, &started) && !legacy.matches(file, &DesiredState::default()));
    }

    #[test]
    fn failed_write_leaves_no_temp_file() {
        let tmp = TempDir::new("store-fail");
        let mut store = StateFile::open(tmp.path()).unwrap();
        // A directory where the state file should be makes the rename fail.
        fs::create_dir(store.path()).unwrap();
        assert!(matches!(store.save(&sample()), Err(StoreError::Write { .. })));
        assert_eq!(entries(tmp.path()), [STATE_FILE]);
    }
}
