//! `lbd --pass-to PIN`: the operator's pinned XDP program that the balancer tail-calls for
//! the frames it does not serve (`xdp-ebpf/src/bin/lb/pass_to.rs`), held in slot 0 of
//! `spw_pass_to`. The slot follows the pin: a program pinned there in its place replaces
//! it, and a pin removed empties it (the frames then pass, counted as `pass_to_missing`).

use std::path::{Path, PathBuf};

use aya::{
    maps::{MapData, MapError, ProgramArray},
    programs::{ProgramError, ProgramFd, ProgramInfo},
};
use spillway_common::limits::map_names;

use crate::{Balancer, DataplaneError};

/// `BPF_PROG_TYPE_XDP` (uapi/linux/bpf.h): what aya reports a pinned XDP program as.
const BPF_PROG_TYPE_XDP: u32 = 6;

#[derive(Debug, thiserror::Error)]
pub enum PassToError {
    #[error("--pass-to {}: nothing is pinned there; pin your XDP program there first", path.display())]
    Missing { path: PathBuf },
    #[error("--pass-to {}: not a pinned program (a map or a link is pinned there)", path.display())]
    NotProgram { path: PathBuf },
    #[error("--pass-to {}: reading the pinned program", path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("--pass-to {}: program {name} (id {id}) is of type {kind}, not an XDP program", path.display())]
    WrongType { path: PathBuf, name: String, id: u32, kind: String },
    #[error(
        "--pass-to {}: the balancer's program array refuses program {name} (id {id}); a tail call needs an XDP \
         program loaded as the balancer is (no xdp.frags)",
        path.display()
    )]
    Refused {
        path: PathBuf,
        name: String,
        id: u32,
        #[source]
        source: Box<MapError>,
    },
    #[error("emptying {}", map_names::PASS_TO_PROGRAM)]
    Clear(#[source] Box<MapError>),
}

/// A pinned XDP program: its id and a descriptor for it.
struct Pinned {
    id: u32,
    name: String,
    fd: ProgramFd,
}

/// Opens the program pinned at `path`, refusing anything but an XDP program.
fn open(path: &Path) -> Result<Pinned, PassToError> {
    if path.symlink_metadata().is_err() {
        return Err(PassToError::Missing { path: path.to_owned() });
    }
    let unreadable = |source| PassToError::Unreadable { path: path.to_owned(), source: Box::new(source) };
    if !pins_a_program(path) {
        return Err(PassToError::NotProgram { path: path.to_owned() });
    }
    let info = ProgramInfo::from_pin(path).map_err(unreadable)?;
    let name = info.name_as_str().unwrap_or("?").to_owned();
    if info.program_type() as u32 != BPF_PROG_TYPE_XDP {
        return Err(PassToError::WrongType { path: path.to_owned(), name, id: info.id(), kind: format!("{:?}", info.program_type()) });
    }
    Ok(Pinned { id: info.id(), name, fd: info.fd().map_err(unreadable)? })
}

/// Whether `path` pins a program: the kernel answers a map's descriptor with the map's info
/// where a program's is asked for (aya would read a map's type as a program's), so the kind is
/// read from the descriptor itself (`anon_inode:bpf-prog`).
fn pins_a_program(path: &Path) -> bool {
    use std::os::fd::{AsFd, AsRawFd};
    // Any pinned object opens this way; only its descriptor is used.
    let Ok(object) = MapData::from_pin(path) else { return false };
    let fd = object.fd().as_fd().as_raw_fd();
    std::fs::read_link(format!("/proc/self/fd/{fd}")).is_ok_and(|target| target.as_os_str() == "anon_inode:bpf-prog")
}

/// What [`PassTo::follow`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Followed {
    Unchanged,
    /// Another program is pinned there now: the slot holds it.
    Replaced {
        id: u32,
    },
    /// The pin is gone: the slot is empty.
    Gone,
}

/// Slot 0 of `spw_pass_to` and the pin it follows. Holds the array open for as long as
/// `lbd` runs (it is pinned too, so the program stays in it after `lbd` exits).
pub struct PassTo {
    array: ProgramArray<MapData>,
    pin: Option<PathBuf>,
    /// The id of the program in the slot, as this `lbd` set it.
    holds: Option<u32>,
}

impl PassTo {
    /// Takes the program array out of the loaded balancer; `pin` is `--pass-to`.
    pub fn take(balancer: &mut Balancer, pin: Option<&Path>) -> Result<Self, DataplaneError> {
        let array = crate::maps::take(balancer.ebpf_mut(), map_names::PASS_TO_PROGRAM)?;
        Ok(Self { array, pin: pin.map(Path::to_owned), holds: None })
    }

    pub fn pin(&self) -> Option<&Path> {
        self.pin.as_deref()
    }

    /// At start: fills the slot from the pin (a missing pin or another kind of program is an
    /// error naming `--pass-to`), or empties it without one, so a restart without the option
    /// hands nothing on. Returns the program's id.
    pub fn fill(&mut self) -> Result<Option<u32>, PassToError> {
        let Some(pin) = self.pin.clone() else {
            self.clear()?;
            return Ok(None);
        };
        let program = open(&pin)?;
        self.set(&pin, &program)?;
        Ok(Some(program.id))
    }

    /// Later: makes the slot hold what is pinned now (see the module's comment).
    pub fn follow(&mut self) -> Result<Followed, PassToError> {
        let Some(pin) = self.pin.clone() else { return Ok(Followed::Unchanged) };
        match open(&pin) {
            Ok(program) if Some(program.id) == self.holds => Ok(Followed::Unchanged),
            Ok(program) => {
                self.set(&pin, &program)?;
                Ok(Followed::Replaced { id: program.id })
            }
            Err(PassToError::Missing { .. }) if self.holds.is_some() => {
                self.clear()?;
                Ok(Followed::Gone)
            }
            Err(PassToError::Missing { .. }) => Ok(Followed::Unchanged),
            Err(e) => Err(e),
        }
    }

    fn set(&mut self, pin: &Path, program: &Pinned) -> Result<(), PassToError> {
        self.array.set(0, &program.fd, 0).map_err(|source| PassToError::Refused {
            path: pin.to_owned(),
            name: program.name.clone(),
            id: program.id,
            source: Box::new(source),
        })?;
        self.holds = Some(program.id);
        Ok(())
    }

    fn clear(&mut self) -> Result<(), PassToError> {
        match self.array.clear_index(&0) {
            Ok(()) => {}
            // Already empty.
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(PassToError::Clear(Box::new(e))),
        }
        self.holds = None;
        Ok(())
    }
}
