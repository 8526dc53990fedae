//! The one temporary-directory type of the tests: a directory removed (recursively) on
//! drop, also when a test panics. Topologies, fleets and packet labs keep their files in
//! one ([`TempDir::create`]); unit tests ask for a fresh one by label ([`TempDir::new`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result};

/// A directory removed (recursively) on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `path` (its parent must exist, and it must not).
    pub fn create(path: PathBuf) -> Result<TempDir> {
        std::fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(TempDir(path))
    }

    /// A fresh, empty directory under the system's temporary directory, named after
    /// `label`, this process and a counter (so parallel tests never share one). Panics if
    /// it cannot be made: for tests.
    pub fn new(label: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("spw-unit-{}-{n}-{label}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        match std::fs::remove_dir_all(&self.0) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                eprintln!("spillway-harness: cannot remove {}: {err}", self.0.display());
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temp_dir_is_fresh_and_gone_when_dropped() {
        let (a, b) = (TempDir::new("t"), TempDir::new("t"));
        assert_ne!(a.path(), b.path());
        std::fs::write(a.path().join("f"), "x").unwrap();
        let path = a.path().to_path_buf();
        drop(a);
        assert!(!path.exists());
        let made = TempDir::create(b.path().join("sub")).unwrap();
        assert!(made.path().is_dir());
        assert!(TempDir::create(made.path().to_path_buf()).is_err(), "an existing directory is refused");
    }
}
