//! `lbd --xdp-attach none`: the balancer goes live on no interface. Its entry program
//! (`spillway_lb`) is pinned at `<pin-dir>/v<PIN_VERSION>/prog` for the operator's root
//! program to tail-call from its own program array (as Katran runs "shared"), and with
//! `--root-array` `lbd` puts it in that array itself, one map update: a restart then swaps
//! the new program in with no moment without one. Without it the operator's array keeps the
//! old program, which goes on working on the same pinned maps until the operator's one
//! update.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use aya::{
    maps::{Map, MapData, MapError, MapType, ProgramArray},
    programs::{ProgramError, Xdp},
};

use crate::pins::{self, PinLayout};

#[derive(Debug, thiserror::Error)]
pub enum EntryError {
    #[error("pinning the balancer's entry program at {}", path.display())]
    Pin {
        path: PathBuf,
        #[source]
        source: aya::pin::PinError,
    },
    #[error("replacing the pin {}", path.display())]
    Rename {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "--xdp-attach none, but the balancer's link {} still attaches it to an interface; remove that pin first \
         (rm {}: the interface then runs no balancer until your root program tail-calls it)",
        path.display(),
        path.display()
    )]
    LinkPinned { path: PathBuf },
    #[error("--root-array {}: no program array pinned there", path.display())]
    RootArray {
        path: PathBuf,
        #[source]
        source: Box<MapError>,
    },
    #[error("--root-array {}: a map of type {kind}, not a program array", path.display())]
    RootArrayType { path: PathBuf, kind: String },
    #[error("--root-array {} --root-index {index}: writing the slot", path.display())]
    RootSlot {
        path: PathBuf,
        index: u32,
        #[source]
        source: Box<MapError>,
    },
    #[error(transparent)]
    Program(#[from] Box<ProgramError>),
}

/// Pins `program` at `path`, replacing what is pinned there in one rename: the path always
/// names a program, the old one until the new one.
pub fn pin_entry(program: &mut Xdp, path: &Path) -> Result<(), EntryError> {
    // bpffs refuses names with a dot.
    let mut fresh = path.as_os_str().to_owned();
    fresh.push("_new");
    let fresh = PathBuf::from(fresh);
    // A start that died between pin and rename left this.
    let _ = fs::remove_file(&fresh);
    program.pin(&fresh).map_err(|source| EntryError::Pin { path: fresh.clone(), source })?;
    fs::rename(&fresh, path).map_err(|source| EntryError::Rename { path: path.to_owned(), source })
}

/// Refuses to leave the balancer unattached while a pinned link of it attaches it.
pub fn refuse_pinned_links(layout: &PinLayout) -> Result<(), EntryError> {
    match pins::linked_interfaces(layout).first() {
        Some(iface) => Err(EntryError::LinkPinned { path: layout.balancer_link(iface) }),
        None => Ok(()),
    }
}

/// Puts `program` in slot `index` of the program array pinned at `array`: one map update,
/// so the operator's root program tail-calls the old program or the new one, never nothing.
pub fn fill_root_slot(program: &Xdp, array: &Path, index: u32) -> Result<(), EntryError> {
    let slot_error = |source| EntryError::RootSlot { path: array.to_owned(), index, source: Box::new(source) };
    root_array(array)?.set(index, program.fd().map_err(Box::new)?, 0).map_err(slot_error)
}

/// Empties slot `index` of the program array pinned at `array` (`lbd --cleanup`): the root
/// program then calls the balancer no more.
pub fn clear_root_slot(array: &Path, index: u32) -> Result<(), EntryError> {
    match root_array(array)?.clear_index(&index) {
        Ok(()) => Ok(()),
        // Already empty.
        Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        Err(source) => Err(EntryError::RootSlot { path: array.to_owned(), index, source: Box::new(source) }),
    }
}

/// The program array pinned at `path`, refusing any other kind of map.
fn root_array(path: &Path) -> Result<ProgramArray<MapData>, EntryError> {
    let not_there = |source| EntryError::RootArray { path: path.to_owned(), source: Box::new(source) };
    let data = MapData::from_pin(path).map_err(not_there)?;
    let kind = data.info().and_then(|i| i.map_type()).map_err(not_there)?;
    if kind != MapType::ProgramArray {
        return Err(EntryError::RootArrayType { path: path.to_owned(), kind: format!("{kind:?}") });
    }
    ProgramArray::try_from(Map::ProgramArray(data)).map_err(not_there)
}
