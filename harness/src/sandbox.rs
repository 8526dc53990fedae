//! One bare network namespace with a temporary directory, for tests that run the real
//! daemons without traffic (no bridge, no backends): the test wires what it needs inside.
//! The processes it spawned are stopped and the namespace and directory removed on drop,
//! panics included; leftovers of killed runs are swept like a topology's.

use std::path::Path;
use std::sync::Arc;

use anyhow::Result;

use crate::netns::Netns;
use crate::process::Registry;
use crate::tempdir::TempDir;
use crate::topology::next_id;

pub struct Sandbox {
    netns: Netns,
    registry: Arc<Registry>,
    tempdir: TempDir,
    /// Last: gone before a test that runs alone may start (see `alone`).
    _shared: crate::alone::Shared,
}

impl Sandbox {
    /// A fresh namespace (named after `label`) and temporary directory; the logs of the
    /// processes spawned in the namespace go to the directory.
    pub fn build(label: &str) -> Result<Sandbox> {
        let shared = crate::alone::shared()?;
        let id = next_id();
        let tempdir = TempDir::create(std::env::temp_dir().join(&id))?;
        let registry = Arc::new(Registry::new(tempdir.path().to_owned()));
        let netns = Netns::create(label, format!("{id}-{label}"), Arc::clone(&registry))?;
        Ok(Sandbox { netns, registry, tempdir, _shared: shared })
    }

    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// The temporary directory.
    pub fn dir(&self) -> &Path {
        self.tempdir.path()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.registry.stop_all();
    }
}
