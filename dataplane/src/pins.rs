//! What lives on bpffs and how it is attached, taken over and removed.
//!
//! ```text
//! <pin-dir>/v<PIN_VERSION>/maps/<map>   the balancer's maps (see dataplane)
//! <pin-dir>/v<PIN_VERSION>/links/<if>   the balancer's XDP link on interface <if>
//! <pin-dir>/v<PIN_VERSION>/link         the one link of an lbd that ran on one interface
//!                                       (moved under links/ by the next start)
//! <pin-dir>/v<PIN_VERSION>/prog         its entry program (`--xdp-attach none`; see `entry`)
//! <pin-dir>/v<PIN_VERSION>/probe_link   the probe path's tc link (see `vip_path`)
//! <pin-dir>/v<PIN_VERSION>/probe_prog   the probe program, for `lbd` to attach it again
//! <pin-dir>/agent/link                  the backend agent's XDP link
//! ```
//!
//! A pinned link keeps its program attached after the process that made it exits, so a
//! daemon that stops or dies leaves forwarding running. The next daemon does not detach:
//! it swaps its freshly loaded program into the pinned link (`bpf_link_update`), which the
//! kernel does atomically, so the interface never runs without a program.

use std::{
    fs::{self, DirBuilder, File},
    io,
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use aya::programs::{
    LinkOrder, ProgramError, SchedClassifier, TcAttachType, Xdp, XdpMode,
    links::{FdLink, LinkError, PinnedLink},
    tc::{SchedClassifierLink, TcAttach},
    xdp::XdpLink,
};
use nix::{
    errno::Errno,
    fcntl::{Flock, FlockArg},
    mount::{MsFlags, mount},
};
use spillway_common::limits::PIN_VERSION;

use crate::is_bpffs;
use crate::netif;

pub const BPFFS_ROOT: &str = "/sys/fs/bpf";
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/spillway";

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("mounting bpffs at {BPFFS_ROOT}")]
    Mount(#[source] Errno),
    #[error("{} is not on a bpf filesystem; choose a --pin-dir under {BPFFS_ROOT}", path.display())]
    NotBpffs { path: PathBuf },
    #[error("creating {}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "refusing the pin directory {}: {why}; an unprivileged user could remove or replace the pins there. \
         Remove it (`lbd --cleanup`, then rmdir) or choose another --pin-dir",
        path.display()
    )]
    UnsafeDir { path: PathBuf, why: String },
    #[error("another lbd is using {}; stop it first", path.display())]
    Busy { path: PathBuf },
    #[error("locking {}", path.display())]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Interface(#[from] netif::NetifError),
    #[error("opening the pinned link {}", path.display())]
    OpenLink {
        path: PathBuf,
        #[source]
        source: LinkError,
    },
    #[error("{} is not {expected} link; run `lbd --cleanup` to remove stale pins", path.display())]
    WrongLinkType { path: PathBuf, expected: &'static str },
    #[error(
        "the pinned link {} drives interface index {pinned}, not {iface} (index {wanted}); \
         run `lbd --cleanup` first to move the balancer to another interface",
        path.display()
    )]
    WrongInterface { path: PathBuf, pinned: u32, iface: String, wanted: u32 },
    #[error("replacing the program of the pinned link {}", path.display())]
    TakeOver {
        path: PathBuf,
        #[source]
        source: ProgramError,
    },
    #[error("attaching {what} to {iface}")]
    Attach {
        what: &'static str,
        iface: String,
        #[source]
        source: ProgramError,
    },
    #[error(
        "the kernel attached {what} to {iface} through netlink, which cannot be pinned (needs bpf_link: Linux 5.9+ for XDP, 6.6+ for tc)"
    )]
    NotPinnable { what: &'static str, iface: String },
    #[error("pinning the link at {}", path.display())]
    PinLink {
        path: PathBuf,
        #[source]
        source: aya::pin::PinError,
    },
    #[error("removing {}", path.display())]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Paths under the pin directory.
#[derive(Clone, Debug)]
pub struct PinLayout {
    root: PathBuf,
}

impl PinLayout {
    pub fn new(root: &Path) -> Self {
        Self { root: root.to_owned() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn balancer_dir(&self) -> PathBuf {
        self.root.join(format!("v{PIN_VERSION}"))
    }

    pub fn balancer_maps(&self) -> PathBuf {
        self.balancer_dir().join("maps")
    }

    /// Where the balancer's link on `iface` is pinned.
    pub fn balancer_link(&self, iface: &str) -> PathBuf {
        self.balancer_links().join(iface)
    }

    /// The directory of the balancer's links, one per interface.
    pub fn balancer_links(&self) -> PathBuf {
        self.balancer_dir().join("links")
    }

    /// The single link of an `lbd` from before several interfaces (see [`adopt_single_link`]).
    fn single_link(&self) -> PathBuf {
        self.balancer_dir().join("link")
    }

    /// The balancer's entry program, for an operator's root program (`--xdp-attach none`).
    pub fn entry_program(&self) -> PathBuf {
        self.balancer_dir().join("prog")
    }

    pub fn probe_link(&self) -> PathBuf {
        self.balancer_dir().join("probe_link")
    }

    pub fn probe_program(&self) -> PathBuf {
        self.balancer_dir().join("probe_prog")
    }

    pub fn agent_dir(&self) -> PathBuf {
        self.root.join("agent")
    }

    pub fn agent_link(&self) -> PathBuf {
        self.agent_dir().join("link")
    }
}

/// Mounts bpffs at /sys/fs/bpf unless something already is (fresh VMs, minimal containers).
pub fn ensure_bpffs() -> Result<(), PinError> {
    let root = Path::new(BPFFS_ROOT);
    if is_bpffs(root) {
        return Ok(());
    }
    mount_bpffs(root)
}

/// Mode 0700: the kernel's default for a bpffs root is 1777, which lets any user create a
/// directory there, such as the pin directory before `lbd` does.
fn mount_bpffs(at: &Path) -> Result<(), PinError> {
    mount(Some("bpf"), at, Some("bpf"), MsFlags::empty(), Some("mode=0700")).map_err(PinError::Mount)
}

/// Refuses `dir` unless it is a directory (not a symlink) owned by this user (root) and
/// writable by nobody else: whoever owns or may write a directory of pins may unlink them
/// (a pinned link gone is a detached balancer) or put maps of their own in their place.
fn refuse_unsafe_dir(dir: &Path) -> Result<(), PinError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let unsafe_dir = |why: String| PinError::UnsafeDir { path: dir.to_owned(), why };
    let meta = fs::symlink_metadata(dir).map_err(|source| PinError::CreateDir { path: dir.to_owned(), source })?;
    if !meta.is_dir() {
        return Err(unsafe_dir("it is not a directory".to_owned()));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(unsafe_dir(format!("it is owned by uid {}, not {me}", meta.uid())));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(unsafe_dir(format!("its mode {mode:04o} lets others write to it")));
    }
    Ok(())
}

/// Whether pins in a directory outlive the process that made them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Its bpffs is mounted in the host's mount namespace (PID 1's): the pins stay when
    /// this process and its mount namespace are gone.
    Durable,
    /// Its bpffs exists only in this process's mount namespace (`ip netns exec`, a
    /// container with a bpffs of its own): the pins, and the link that keeps the program
    /// attached, go with the namespace.
    Private,
    /// Not known (PID 1's mounts unreadable).
    Unknown(String),
}

/// Whether the pins under `dir` outlive this process: the bpffs holding `dir` must be one
/// PID 1's mount namespace has too (each bpffs mount is a file system of its own, so the
/// device numbers tell).
pub fn durability(dir: &Path) -> Durability {
    use std::os::unix::fs::MetadataExt;
    let dev = match fs::metadata(dir) {
        Ok(m) => m.dev(),
        Err(e) => return Durability::Unknown(format!("{}: {e}", dir.display())),
    };
    match fs::read_to_string("/proc/1/mountinfo") {
        Ok(mounts) if bpffs_devices(&mounts).contains(&dev) => Durability::Durable,
        Ok(_) => Durability::Private,
        Err(e) => Durability::Unknown(format!("/proc/1/mountinfo: {e}")),
    }
}

impl Durability {
    /// Says at start what a restart will keep (a warning unless the pins outlive us).
    pub fn log_at_start(&self, dir: &Path, what: &str) {
        match self {
            Durability::Durable => {}
            Durability::Private => spillway_logging::event!(
                warn,
                "pins_not_durable",
                pin_dir = dir.display(),
                message = format!(
                    "this bpffs exists only in this process's mount namespace (ip netns exec, or a container's own \
                     bpffs): when it exits, the pins and the link go with it and {what} stops; restarts are not \
                     hitless. Run it in the host's mount namespace (nsenter --net=/run/netns/NAME) or give the \
                     container the host's /sys/fs/bpf (see the README)"
                )
            ),
            Durability::Unknown(why) => {
                spillway_logging::event!(warn, "pins_durability_unknown", pin_dir = dir.display(), reason = why)
            }
        }
    }

    /// What continues after this process exits, for its last log line.
    pub fn after_exit(&self, what: &str) -> String {
        match self {
            Durability::Durable => format!("{what} continues through the pinned link"),
            Durability::Private => format!("the pins go with this mount namespace: {what} stops"),
            Durability::Unknown(_) => format!("{what} continues through the pinned link if its bpffs outlives this process"),
        }
    }
}

/// The device numbers of the bpf file systems in a mountinfo text (`ID PARENT MAJ:MIN ROOT
/// MOUNT_POINT ... - FSTYPE ...`), as `stat` encodes them.
fn bpffs_devices(mountinfo: &str) -> Vec<u64> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (mount, fs) = line.split_once(" - ")?;
            if fs.split(' ').next()? != "bpf" {
                return None;
            }
            let (major, minor) = mount.split(' ').nth(2)?.split_once(':')?;
            Some(nix::sys::stat::makedev(major.parse().ok()?, minor.parse().ok()?))
        })
        .collect()
}

/// Held while a daemon owns a pin directory; a second daemon (or `--cleanup`) on the same
/// directory fails instead of fighting over the maps. Released when the process exits.
pub struct PinLock {
    _flock: Flock<File>,
}

/// How long a daemon waits for the lock of its pin directory: a process killed with SIGKILL
/// holds it until the kernel has torn it down, which takes a moment after `kill -9` returns
/// (a hand restart starts the next one at once). Longer means another daemon really runs.
pub const LOCK_WAIT: Duration = Duration::from_secs(5);
/// How often a waiting daemon tries the lock again.
const LOCK_RETRY: Duration = Duration::from_millis(50);

/// Creates `dir` (0700) on bpffs, checks that it and every directory above it on the same
/// bpffs are root's alone (see [`refuse_unsafe_dir`]; the mount's own root is the kernel's),
/// and takes its lock, waiting up to [`LOCK_WAIT`] for a previous holder to go.
pub fn create_and_lock(dir: &Path) -> Result<PinLock, PinError> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|source| PinError::CreateDir { path: dir.to_owned(), source })?;
    if !is_bpffs(dir) {
        return Err(PinError::NotBpffs { path: dir.to_owned() });
    }
    for ancestor in dir.ancestors().take_while(|a| a.parent().is_some_and(is_bpffs)) {
        refuse_unsafe_dir(ancestor)?;
    }
    lock_waiting(dir, LOCK_WAIT)
}

/// [`lock`], retried for up to `wait` while another process holds it (logged once).
fn lock_waiting(dir: &Path, wait: Duration) -> Result<PinLock, PinError> {
    let deadline = Instant::now() + wait;
    let mut logged = false;
    loop {
        match lock(dir) {
            Err(PinError::Busy { .. }) if Instant::now() < deadline => {
                if !logged {
                    spillway_logging::event!(
                        info,
                        "waiting_for_lock",
                        path = dir.display(),
                        wait_s = wait.as_secs_f64(),
                        message = "another process holds it (an lbd still exiting?)"
                    );
                    logged = true;
                }
                std::thread::sleep(LOCK_RETRY);
            }
            other => return other,
        }
    }
}

fn lock(dir: &Path) -> Result<PinLock, PinError> {
    let file = File::open(dir).map_err(|source| PinError::Lock { path: dir.to_owned(), source })?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(flock) => Ok(PinLock { _flock: flock }),
        Err((_, Errno::EWOULDBLOCK)) => Err(PinError::Busy { path: dir.to_owned() }),
        Err((_, errno)) => Err(PinError::Lock { path: dir.to_owned(), source: errno.into() }),
    }
}

/// How the program came to drive the interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attachment {
    /// No link was pinned: attached and pinned a new one.
    Attached,
    /// Swapped into the pinned link, replacing program `replaced_program_id`.
    TookOver { replaced_program_id: u32 },
    /// The pinned link's interface had gone away: replaced it with a new link.
    Reattached,
}

/// Makes `program` drive `iface` through the link pinned at `link_path`: takes the pinned
/// link over if there is one, otherwise attaches in `mode` and pins the new link. A
/// taken-over link keeps the XDP mode it was created with.
pub fn attach_pinned(program: &mut Xdp, iface: &str, mode: XdpMode, link_path: &Path) -> Result<Attachment, PinError> {
    let ifindex = netif::ifindex(iface)?;
    match pinned(link_path, ifindex, iface)? {
        Pinned::Live { link, program_id } => {
            let take_over_error = |source| PinError::TakeOver { path: link_path.to_owned(), source };
            let link = XdpLink::try_from(link).map_err(|_| PinError::WrongLinkType { path: link_path.to_owned(), expected: "an XDP" })?;
            let id = program.attach_to_link(link).map_err(take_over_error)?;
            // Closing our descriptor leaves the link attached: its pin holds it.
            drop(program.take_link(id).map_err(take_over_error)?);
            Ok(Attachment::TookOver { replaced_program_id: program_id })
        }
        Pinned::Absent { defunct } => {
            let attach_error = |source| PinError::Attach { what: "XDP", iface: iface.to_owned(), source };
            let id = program.attach(ifindex, mode).map_err(attach_error)?;
            let link = FdLink::try_from(program.take_link(id).map_err(attach_error)?)
                .map_err(|_| PinError::NotPinnable { what: "XDP", iface: iface.to_owned() })?;
            pin_new(link, link_path, defunct)
        }
    }
}

/// [`attach_pinned`] for a tc program on the egress of interface `ifindex` (named `iface`
/// in messages), through a TCX link.
pub fn attach_pinned_tc(program: &mut SchedClassifier, ifindex: u32, iface: &str, link_path: &Path) -> Result<Attachment, PinError> {
    match pinned(link_path, ifindex, iface)? {
        Pinned::Live { link, program_id } => {
            let take_over_error = |source| PinError::TakeOver { path: link_path.to_owned(), source };
            let link = SchedClassifierLink::try_from(link)
                .map_err(|_| PinError::WrongLinkType { path: link_path.to_owned(), expected: "a tc" })?;
            let id = program.attach_to_link(link).map_err(take_over_error)?;
            drop(program.take_link(id).map_err(take_over_error)?);
            Ok(Attachment::TookOver { replaced_program_id: program_id })
        }
        Pinned::Absent { defunct } => {
            let attach_error = |source| PinError::Attach { what: "tc", iface: iface.to_owned(), source };
            let attach = TcAttach::Tcx { attach_type: TcAttachType::Egress, order: LinkOrder::default() };
            let id = program.attach(ifindex, attach).map_err(attach_error)?;
            let link = FdLink::try_from(program.take_link(id).map_err(attach_error)?)
                .map_err(|_| PinError::NotPinnable { what: "tc", iface: iface.to_owned() })?;
            pin_new(link, link_path, defunct)
        }
    }
}

/// What is pinned at a link path.
enum Pinned {
    /// A link driving the wanted interface: take it over.
    Live { link: FdLink, program_id: u32 },
    /// Nothing usable: attach afresh. `defunct`: a dead link's pin was removed.
    Absent { defunct: bool },
}

fn pinned(link_path: &Path, ifindex: u32, iface: &str) -> Result<Pinned, PinError> {
    if link_path.symlink_metadata().is_err() {
        return Ok(Pinned::Absent { defunct: false });
    }
    let open_error = |source| PinError::OpenLink { path: link_path.to_owned(), source };
    let link: FdLink = PinnedLink::from_pin(link_path).map_err(open_error)?.into();
    let info = link.info().map_err(open_error)?;
    match link_ifindex(info.id()) {
        // The interface was deleted; the link is dead and only its pin remains.
        Some(0) => {
            fs::remove_file(link_path).map_err(|source| PinError::Remove { path: link_path.to_owned(), source })?;
            Ok(Pinned::Absent { defunct: true })
        }
        Some(pinned) if pinned != ifindex => {
            Err(PinError::WrongInterface { path: link_path.to_owned(), pinned, iface: iface.to_owned(), wanted: ifindex })
        }
        _ => Ok(Pinned::Live { link, program_id: info.program_id() }),
    }
}

fn pin_new(link: FdLink, link_path: &Path, defunct: bool) -> Result<Attachment, PinError> {
    link.pin(link_path).map_err(|source| PinError::PinLink { path: link_path.to_owned(), source })?;
    Ok(if defunct { Attachment::Reattached } else { Attachment::Attached })
}

/// The interface a pinned link drives now (0: its interface is gone or it was detached);
/// `None` when nothing is pinned there or its fdinfo says nothing.
pub fn pinned_link_ifindex(link_path: &Path) -> Option<u32> {
    let link: FdLink = PinnedLink::from_pin(link_path).ok()?.into();
    link_ifindex(link.info().ok()?.id())
}

/// The interface index a link drives (0 once its interface is gone), from the fdinfo
/// of our descriptor for it: aya does not expose the kernel's link info beyond ids.
fn link_ifindex(link_id: u32) -> Option<u32> {
    let entries = fs::read_dir("/proc/self/fdinfo").ok()?;
    entries.flatten().find_map(|entry| fdinfo_ifindex(&fs::read_to_string(entry.path()).ok()?, link_id))
}

fn fdinfo_ifindex(fdinfo: &str, link_id: u32) -> Option<u32> {
    let field = |name: &str| fdinfo.lines().find_map(|l| l.strip_prefix(name)?.trim().parse::<u32>().ok());
    (field("link_id:")? == link_id).then(|| field("ifindex:")).flatten()
}

/// Detaches the balancer and the agent under `layout` and removes the whole pin directory.
/// Returns the links it unpinned.
pub fn cleanup(layout: &PinLayout) -> Result<Vec<PathBuf>, PinError> {
    if !layout.root().exists() {
        return Ok(Vec::new());
    }
    let _locks = [layout.balancer_dir(), layout.agent_dir()]
        .iter()
        .filter(|dir| dir.is_dir())
        .map(|dir| lock(dir))
        .collect::<Result<Vec<_>, _>>()?;
    let unpinned = unpin_links(balancer_links(layout).into_iter().chain([layout.probe_link(), layout.agent_link()]))?;
    fs::remove_dir_all(layout.root()).map_err(|source| PinError::Remove { path: layout.root().to_owned(), source })?;
    Ok(unpinned)
}

/// Undoes a first start that failed: detaches the balancer's links and removes its directory
/// (maps, links, probe program), and the pin directory itself when that leaves it empty. The
/// caller holds the balancer directory's lock. Returns the links it unpinned.
pub fn remove_balancer(layout: &PinLayout) -> Result<Vec<PathBuf>, PinError> {
    let unpinned = unpin_links(balancer_links(layout).into_iter().chain([layout.probe_link()]))?;
    let dir = layout.balancer_dir();
    fs::remove_dir_all(&dir).map_err(|source| PinError::Remove { path: dir, source })?;
    // Not empty: the agent's pins are there too, and stay.
    let _ = fs::remove_dir(layout.root());
    Ok(unpinned)
}

/// Every balancer link pinned under `layout`: one per interface, and an older single link.
fn balancer_links(layout: &PinLayout) -> Vec<PathBuf> {
    let per_interface = fs::read_dir(layout.balancer_links()).into_iter().flatten().flatten().map(|e| e.path());
    per_interface.chain([layout.single_link()]).collect()
}

/// The interfaces with a balancer link pinned under `layout`, by name.
pub fn linked_interfaces(layout: &PinLayout) -> Vec<String> {
    let entries = fs::read_dir(layout.balancer_links()).into_iter().flatten().flatten();
    let mut names: Vec<String> = entries.filter_map(|e| e.file_name().into_string().ok()).collect();
    names.sort();
    names
}

/// Moves the single link an `lbd` that ran on one interface pinned (`v<N>/link`) to where
/// this one keeps its links (`v<N>/links/<if>`), so that the restart takes it over without
/// a gap. A link whose interface is gone is removed. Returns the interface it now serves.
pub fn adopt_single_link(layout: &PinLayout) -> Result<Option<String>, PinError> {
    let single = layout.single_link();
    if single.symlink_metadata().is_err() {
        return Ok(None);
    }
    let remove = |path: &Path| fs::remove_file(path).map_err(|source| PinError::Remove { path: path.to_owned(), source });
    let Some(iface) = pinned_link_ifindex(&single).filter(|&i| i != 0).and_then(|i| nix::net::if_::if_indextoname(i).ok()) else {
        remove(&single)?;
        return Ok(None);
    };
    let iface = iface.to_string_lossy().into_owned();
    let dir = layout.balancer_links();
    DirBuilder::new().recursive(true).mode(0o700).create(&dir).map_err(|source| PinError::CreateDir { path: dir.clone(), source })?;
    let to = layout.balancer_link(&iface);
    fs::rename(&single, &to).map_err(|source| PinError::Remove { path: single.clone(), source })?;
    Ok(Some(iface))
}

/// Detaches the balancer from `iface` by unpinning its link (the last reference: the kernel
/// detaches the program). False when no link was pinned for it.
pub fn detach_balancer(layout: &PinLayout, iface: &str) -> Result<bool, PinError> {
    Ok(!unpin_links([layout.balancer_link(iface)])?.is_empty())
}

/// Unpins each link of `paths` that is pinned; the last reference gone, its program detaches.
fn unpin_links(paths: impl IntoIterator<Item = PathBuf>) -> Result<Vec<PathBuf>, PinError> {
    let mut unpinned = Vec::new();
    for path in paths {
        if path.symlink_metadata().is_err() {
            continue;
        }
        let link = PinnedLink::from_pin(&path).map_err(|source| PinError::OpenLink { path: path.clone(), source })?;
        drop(link.unpin().map_err(|source| PinError::Remove { path: path.clone(), source })?);
        unpinned.push(path);
    }
    Ok(unpinned)
}

/// What drives `iface`'s XDP hook, for an attach that found it taken: the program's name and
/// id and, when it is a Spillway balancer's link pinned on this host's bpffs, its pin
/// directory. `None` when nothing does (the attach failed for another reason).
pub fn xdp_holder(iface: &str) -> Option<String> {
    let program_id = crate::rtnl::Rtnl::open().ok()?.link(iface).ok()??.xdp_prog_id?;
    let name = aya::programs::loaded_programs()
        .flatten()
        .find(|p| p.id() == program_id)
        .and_then(|p| p.name_as_str().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned());
    let mut holder = format!("program {name} (id {program_id})");
    if let Some(pin_dir) = balancer_pin_dir_running(program_id) {
        holder.push_str(&format!(", the balancer of another lbd: --pin-dir {}", pin_dir.display()));
    }
    Some(holder)
}

/// How deep under the bpffs root a balancer's link is looked for (`<root>/a/b/c/vN/links/if`).
const HOLDER_SEARCH_DEPTH: usize = 6;

/// The pin directory whose balancer link (`<dir>/v<PIN_VERSION>/links/<if>`, or the older
/// `<dir>/v<PIN_VERSION>/link`) runs `program_id`.
fn balancer_pin_dir_running(program_id: u32) -> Option<PathBuf> {
    let version_dir = format!("v{PIN_VERSION}");
    let mut dirs = vec![(PathBuf::from(BPFFS_ROOT), 0)];
    while let Some((dir, depth)) = dirs.pop() {
        for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                if depth < HOLDER_SEARCH_DEPTH {
                    dirs.push((path, depth + 1));
                }
            } else {
                let named = |p: &Path, name: &str| p.file_name().is_some_and(|n| n == name);
                let versioned = if named(&dir, "links") { dir.parent() } else { Some(dir.as_path()) };
                let Some(versioned) = versioned.filter(|d| named(d, &version_dir)) else { continue };
                if !named(&dir, "links") && entry.file_name() != "link" {
                    continue;
                }
                let link: Option<FdLink> = PinnedLink::from_pin(&path).ok().map(Into::into);
                if link.and_then(|l| l.info().ok()).is_some_and(|info| info.program_id() == program_id) {
                    return versioned.parent().map(Path::to_owned);
                }
            }
        }
    }
    None
}

/// `--xdp-mode`: where the program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum XdpModeArg {
    /// In the driver (fast; needs driver support).
    Native,
    /// In the kernel's network stack (works everywhere; slower).
    Generic,
}

impl XdpModeArg {
    /// The flag's value, as logs and metrics name the mode.
    pub const fn label(self) -> &'static str {
        match self {
            XdpModeArg::Native => "native",
            XdpModeArg::Generic => "generic",
        }
    }
}

impl From<XdpModeArg> for aya::programs::XdpMode {
    fn from(mode: XdpModeArg) -> Self {
        match mode {
            XdpModeArg::Native => aya::programs::XdpMode::Driver,
            XdpModeArg::Generic => aya::programs::XdpMode::Skb,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A fresh directory, mode 0700, removed at the end.
    fn temp_dir(label: &str) -> spillway_harness::tempdir::TempDir {
        let dir = spillway_harness::tempdir::TempDir::new(label);
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        dir
    }

    /// Runs `f` with a bpffs mounted (as `lbd` mounts one) at `dir`, in a mount namespace of
    /// a thread of its own, so nothing outside sees the mount; unmounts it after.
    fn on_private_bpffs<T: Send>(dir: &Path, f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    use nix::sched::{CloneFlags, unshare};
                    unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_FS).unwrap();
                    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>).unwrap();
                    mount_bpffs(dir).unwrap();
                    assert!(is_bpffs(dir));
                    let out = f();
                    nix::mount::umount(dir).unwrap();
                    out
                })
                .join()
                .unwrap()
        })
    }

    #[test]
    fn bpffs_devices_are_read_from_mountinfo() {
        let mountinfo = "22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw\n\
                         31 22 0:27 / /sys/fs/bpf rw,nosuid shared:12 - bpf bpf rw,mode=700\n\
                         40 22 0:33 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(bpffs_devices(mountinfo), [nix::sys::stat::makedev(0, 27)]);
        assert!(bpffs_devices("garbage\n").is_empty());
    }

    #[test]
    fn pins_on_a_bpffs_of_this_mount_namespace_only_are_private() {
        let dir = temp_dir("private");
        // PID 1 does not have a bpffs mounted in a mount namespace of a thread of its own.
        let private = on_private_bpffs(dir.path(), || durability(dir.path()));
        assert_eq!(private, Durability::Private);
        ensure_bpffs().unwrap();
        assert_eq!(durability(Path::new(BPFFS_ROOT)), Durability::Durable, "the host's bpffs (this test runs in PID 1's mounts)");
    }

    #[test]
    fn a_pin_directory_others_own_or_may_write_is_refused() {
        let dir = temp_dir("owned");
        refuse_unsafe_dir(dir.path()).expect("ours, 0700");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        refuse_unsafe_dir(dir.path()).expect("ours, 0755");
        for mode in [0o777, 0o770, 0o1777, 0o702] {
            fs::set_permissions(dir.path(), fs::Permissions::from_mode(mode)).unwrap();
            let err = refuse_unsafe_dir(dir.path()).expect_err("writable by others");
            assert!(err.to_string().contains("lets others write"), "{mode:o}: {err}");
        }
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        // As an unprivileged user who created it first would leave it.
        let nobody = nix::unistd::User::from_name("nobody").unwrap().expect("a nobody user");
        nix::unistd::chown(dir.path(), Some(nobody.uid), None).unwrap();
        let err = refuse_unsafe_dir(dir.path()).expect_err("owned by nobody");
        assert!(err.to_string().contains(&format!("owned by uid {}", nobody.uid)), "{err}");
        assert!(err.to_string().contains("--pin-dir"), "the error says what to do: {err}");
        let link = dir.path().with_extension("link");
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink("/tmp", &link).unwrap();
        let err = refuse_unsafe_dir(&link).expect_err("a symlink");
        fs::remove_file(&link).unwrap();
        assert!(err.to_string().contains("not a directory"), "{err}");
    }

    #[test]
    fn bpffs_is_mounted_for_root_only() {
        let dir = temp_dir("mount");
        let mode = on_private_bpffs(dir.path(), || fs::metadata(dir.path()).unwrap().permissions().mode() & 0o7777);
        // The kernel always adds the sticky bit to a bpffs root.
        assert_eq!(mode & 0o777, 0o700, "bpffs root mode {mode:o}");
    }

    #[test]
    fn layout_is_versioned() {
        let layout = PinLayout::new(Path::new("/sys/fs/bpf/x"));
        assert_eq!(layout.balancer_maps(), Path::new(&format!("/sys/fs/bpf/x/v{PIN_VERSION}/maps")));
        assert_eq!(layout.balancer_link("eth0"), Path::new(&format!("/sys/fs/bpf/x/v{PIN_VERSION}/links/eth0")));
        assert_eq!(layout.agent_link(), Path::new("/sys/fs/bpf/x/agent/link"));
    }

    #[test]
    fn fdinfo_of_an_xdp_link() {
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nlink_type:\txdp\nlink_id:\t42\nprog_tag:\tf0f0\nprog_id:\t99\nifindex:\t7\n";
        assert_eq!(fdinfo_ifindex(text, 42), Some(7));
        assert_eq!(fdinfo_ifindex(text, 43), None);
        assert_eq!(fdinfo_ifindex("pos:\t0\nflags:\t02\n", 42), None);
    }

    #[test]
    fn a_lock_released_within_the_wait_is_taken_and_one_held_longer_is_refused() {
        let dir = temp_dir("lock");
        let held = lock(dir.path()).unwrap();
        let release_after = Duration::from_millis(400);
        let started = Instant::now();
        let taken = std::thread::scope(|scope| {
            scope.spawn(move || {
                std::thread::sleep(release_after);
                drop(held);
            });
            lock_waiting(dir.path(), Duration::from_secs(5))
        });
        assert!(taken.is_ok(), "the lock was released after {release_after:?}: {:?}", taken.err());
        assert!(started.elapsed() >= release_after, "taken only once released");

        // Still held at the end of the wait: the same refusal as before.
        let _held = taken.unwrap();
        let started = Instant::now();
        let err = lock_waiting(dir.path(), Duration::from_millis(300)).err().unwrap();
        assert!(started.elapsed() >= Duration::from_millis(300), "waited the whole bound");
        assert!(err.to_string().starts_with("another lbd is using"), "{err}");
    }

    #[test]
    fn pin_dir_off_bpffs_is_refused() {
        let tmp = spillway_harness::tempdir::TempDir::new("pins");
        let err = create_and_lock(&tmp.path().join("pins")).err().unwrap();
        assert!(matches!(err, PinError::NotBpffs { .. }), "{err:?}");
    }
}
