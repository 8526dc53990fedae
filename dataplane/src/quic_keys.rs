//! The keys of encrypted QUIC-LB config ids, put into the kernel (`spw_quic_keys`).
//!
//! The data path decrypts with the kernel's crypto kfuncs, through a `bpf_crypto_ctx` made by
//! `bpf_crypto_ctx_create`, which only a sleepable `syscall` program may call. aya 0.16 has
//! no such program type, so this module assembles and loads one (`spillway_quic_key`, a few
//! instructions) itself: it runs with the context's parameters (algorithm and key) as its
//! input (`BPF_PROG_TEST_RUN`), creates the context and `bpf_kptr_xchg`es it into its slot of
//! the keys map, releasing the one it replaces. The key's octets reach the kernel only in
//! that input, are held only by the crypto context, and are overwritten here after the run.
//!
//! A kernel without the kfuncs (or one that refuses the program) fails [`QuicKeys::load`]
//! with the kernel's words; `lbd` then refuses encrypted config ids.

use std::{
    ffi::CStr,
    io::Read,
    os::{
        fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
        unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt},
    },
    path::{Path, PathBuf},
};

use aya::Btf;
use aya_obj::btf::BtfKind;
use spillway_common::quic_lb::key::{KeyError, QuicLbKey};

/// `BPF_PROG_TYPE_SYSCALL`.
const PROG_TYPE_SYSCALL: u32 = 31;
/// `BPF_F_SLEEPABLE`: `bpf_crypto_ctx_create` may sleep.
const F_SLEEPABLE: u32 = 1 << 4;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
/// Helpers by number.
const HELPER_MAP_LOOKUP_ELEM: i32 = 1;
const HELPER_KPTR_XCHG: i32 = 194;
/// `struct bpf_crypto_params` (include/linux/bpf_crypto.h... kernel/bpf/crypto.c): type
/// name, algorithm name, key, key length, tag length.
const TYPE_LEN: usize = 14;
const ALGO_LEN: usize = 128;
const KEY_MAX: usize = 256;
const PARAMS_LEN: usize = TYPE_LEN + 2 + ALGO_LEN + KEY_MAX + 4 + 4;
/// Where the program reads, after the parameters, the slot and whether to clear it.
const SLOT_AT: i16 = PARAMS_LEN as i16;
const CLEAR_AT: i16 = SLOT_AT + 4;
/// What the program returns when the slot is out of the map.
const NO_SLOT: u32 = 1;
/// The program's name in `bpftool prog` (at most 15 characters).
pub const PROGRAM_NAME: &str = "spillway_quic_key";

#[derive(Debug, thiserror::Error)]
pub enum QuicKeyError {
    #[error("the kernel's BTF (/sys/kernel/btf/vmlinux) cannot be read: {0}")]
    Btf(String),
    #[error("the kernel has no {name} kfunc (BPF crypto needs Linux 6.10 or later with CONFIG_CRYPTO)")]
    NoKfunc { name: &'static str },
    #[error("the kernel refused the program that makes QUIC-LB keys' crypto contexts ({PROGRAM_NAME}): {errno}; verifier: {log}")]
    Refused { errno: std::io::Error, log: String },
    #[error("running {PROGRAM_NAME}: {0}")]
    Run(std::io::Error),
    #[error("the kernel refused to make an ecb(aes) crypto context for a QUIC-LB key: error {0}")]
    Create(i32),
    #[error("QUIC-LB key slot {slot} is beyond the keys map ({PROGRAM_NAME} found no slot)")]
    NoSlot { slot: u32 },
    #[error("this kernel cannot decrypt QUIC-LB connection ids, so encrypted config ids (key_file) are refused: {0}")]
    Unavailable(String),
    #[error("QUIC-LB key file {path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("QUIC-LB key file {path} is readable or writable by group or others (mode {mode:03o}): make it root's alone (chmod 600)")]
    Exposed { path: PathBuf, mode: u32 },
    #[error("QUIC-LB key file {path} is owned by uid {uid}, not root")]
    NotRoots { path: PathBuf, uid: u32 },
    #[error("QUIC-LB key file {path} is not a regular file")]
    NotAFile { path: PathBuf },
    #[error("QUIC-LB key file {path}: {source}")]
    Format {
        path: PathBuf,
        #[source]
        source: KeyError,
    },
}

/// Longest key file read: 32 digits and room for white space around them.
const MAX_KEY_FILE: usize = 256;

/// Reads the key in `path`, a file root's alone (the key decrypts every id of its config id:
/// one readable by others is refused, before it is read).
pub fn read_key_file(path: &Path) -> Result<QuicLbKey, QuicKeyError> {
    let file_error = |source| QuicKeyError::File { path: path.to_path_buf(), source };
    // Non-blocking: a FIFO at the path would otherwise hold the open, and the core with it,
    // until a writer came; it is refused below as any other file that is not regular.
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(file_error)?;
    let meta = file.metadata().map_err(file_error)?;
    if !meta.is_file() {
        return Err(QuicKeyError::NotAFile { path: path.to_path_buf() });
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(QuicKeyError::Exposed { path: path.to_path_buf(), mode });
    }
    // SAFETY: geteuid has no preconditions.
    if meta.uid() != unsafe { libc::geteuid() } {
        return Err(QuicKeyError::NotRoots { path: path.to_path_buf(), uid: meta.uid() });
    }
    // One fixed buffer, never grown (a growing one leaves copies of the digits behind as it
    // is reallocated), zeroed after.
    let mut buffer = [0u8; MAX_KEY_FILE];
    let read = read_up_to(&file, &mut buffer).map_err(file_error);
    let key = read.and_then(|n| {
        let text = std::str::from_utf8(&buffer[..n]).unwrap_or("");
        QuicLbKey::from_file_text(text).map_err(|source| QuicKeyError::Format { path: path.to_path_buf(), source })
    });
    for octet in &mut buffer {
        // SAFETY: a valid pointer to an octet of `buffer`; volatile so the write stays.
        unsafe { std::ptr::write_volatile(octet, 0) };
    }
    key
}

/// Reads `file` into `buffer` until it ends or `buffer` is full; the count read.
fn read_up_to(mut file: &std::fs::File, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// One BPF instruction.
#[repr(C)]
#[derive(Clone, Copy)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn { code, regs: (src << 4) | dst, off, imm }
}

const MOV64_REG: u8 = 0xbf;
const MOV64_IMM: u8 = 0xb7;
const ADD64_IMM: u8 = 0x07;
const LDX_W: u8 = 0x61;
const STX_W: u8 = 0x63;
const ST_W: u8 = 0x62;
const LD_IMM64: u8 = 0x18;
const CALL: u8 = 0x85;
const JEQ_IMM: u8 = 0x15;
const JNE_IMM: u8 = 0x55;
const EXIT: u8 = 0x95;
const PSEUDO_MAP_FD: u8 = 1;
const PSEUDO_KFUNC_CALL: u8 = 2;

/// The program: r1 is the input (parameters, slot, clear flag). Returns 0, the negative
/// error `bpf_crypto_ctx_create` gave, or [`NO_SLOT`].
fn program(map_fd: i32, create: i32, release: i32) -> Vec<Insn> {
    vec![
        /* 0 */ insn(MOV64_REG, 6, 1, 0, 0),
        /* 1 */ insn(LDX_W, 1, 6, SLOT_AT, 0),
        /* 2 */ insn(STX_W, 10, 1, -4, 0),
        /* 3 */ insn(MOV64_REG, 2, 10, 0, 0),
        /* 4 */ insn(ADD64_IMM, 2, 0, 0, -4),
        /* 5 */ insn(LD_IMM64, 1, PSEUDO_MAP_FD, 0, map_fd),
        /* 6 */ insn(0, 0, 0, 0, 0),
        /* 7 */ insn(CALL, 0, 0, 0, HELPER_MAP_LOOKUP_ELEM),
        /* 8 */ insn(JEQ_IMM, 0, 0, 37 - 9, 0),
        /* 9 */ insn(MOV64_REG, 7, 0, 0, 0),
        /* 10 */ insn(LDX_W, 1, 6, CLEAR_AT, 0),
        /* 11 */ insn(JNE_IMM, 1, 0, 27 - 12, 0),
        // Create: bpf_crypto_ctx_create(params, sizeof params, &err).
        /* 12 */ insn(ST_W, 10, 0, -8, 0),
        /* 13 */ insn(MOV64_REG, 1, 6, 0, 0),
        /* 14 */ insn(MOV64_IMM, 2, 0, 0, PARAMS_LEN as i32),
        /* 15 */ insn(MOV64_REG, 3, 10, 0, 0),
        /* 16 */ insn(ADD64_IMM, 3, 0, 0, -8),
        /* 17 */ insn(CALL, 0, PSEUDO_KFUNC_CALL, 0, create),
        /* 18 */ insn(JEQ_IMM, 0, 0, 35 - 19, 0),
        // Into the slot; the context it held, if any, released.
        /* 19 */ insn(MOV64_REG, 2, 0, 0, 0),
        /* 20 */ insn(MOV64_REG, 1, 7, 0, 0),
        /* 21 */ insn(CALL, 0, 0, 0, HELPER_KPTR_XCHG),
        /* 22 */ insn(JEQ_IMM, 0, 0, 2, 0),
        /* 23 */ insn(MOV64_REG, 1, 0, 0, 0),
        /* 24 */ insn(CALL, 0, PSEUDO_KFUNC_CALL, 0, release),
        /* 25 */ insn(MOV64_IMM, 0, 0, 0, 0),
        /* 26 */ insn(EXIT, 0, 0, 0, 0),
        // Clear: nothing into the slot, its context released.
        /* 27 */ insn(MOV64_REG, 1, 7, 0, 0),
        /* 28 */ insn(MOV64_IMM, 2, 0, 0, 0),
        /* 29 */ insn(CALL, 0, 0, 0, HELPER_KPTR_XCHG),
        /* 30 */ insn(JEQ_IMM, 0, 0, 2, 0),
        /* 31 */ insn(MOV64_REG, 1, 0, 0, 0),
        /* 32 */ insn(CALL, 0, PSEUDO_KFUNC_CALL, 0, release),
        /* 33 */ insn(MOV64_IMM, 0, 0, 0, 0),
        /* 34 */ insn(EXIT, 0, 0, 0, 0),
        // bpf_crypto_ctx_create failed: its error.
        /* 35 */ insn(LDX_W, 0, 10, -8, 0),
        /* 36 */ insn(EXIT, 0, 0, 0, 0),
        /* 37 */ insn(MOV64_IMM, 0, 0, 0, NO_SLOT as i32),
        /* 38 */ insn(EXIT, 0, 0, 0, 0),
    ]
}

/// `union bpf_attr` for `BPF_PROG_LOAD`, up to the fields used.
#[repr(C)]
#[derive(Default)]
struct LoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

/// `union bpf_attr` for `BPF_PROG_TEST_RUN`.
#[repr(C)]
#[derive(Default)]
struct RunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    /// The struct's tail padding, made a field so it is zero: the kernel refuses an
    /// attribute with a non-zero byte past the command's fields.
    _pad: u32,
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<i64> {
    // SAFETY: `attr` is a live `bpf_attr` prefix of its size for `cmd`; every pointer in it
    // points at memory that outlives the call.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, (attr as *mut T).cast::<libc::c_void>(), size_of::<T>() as libc::c_uint) };
    if r < 0 { Err(std::io::Error::last_os_error()) } else { Ok(r) }
}

/// The loaded program, bound to the balancer's keys map.
pub struct QuicKeys {
    program: OwnedFd,
}

impl QuicKeys {
    /// Loads the program for the keys map `keys` (`spw_quic_keys`).
    pub fn load(keys: BorrowedFd<'_>) -> Result<Self, QuicKeyError> {
        let btf = Btf::from_sys_fs().map_err(|e| QuicKeyError::Btf(e.to_string()))?;
        let kfunc = |name: &'static str| {
            let id = btf.id_by_type_name_kind(name, BtfKind::Func).map_err(|_| QuicKeyError::NoKfunc { name })?;
            i32::try_from(id).map_err(|_| QuicKeyError::NoKfunc { name })
        };
        let insns = program(keys.as_raw_fd(), kfunc("bpf_crypto_ctx_create")?, kfunc("bpf_crypto_ctx_release")?);
        // kfuncs are for GPL-compatible programs only.
        let license = c"GPL";
        let mut name = [0u8; 16];
        name[..PROGRAM_NAME.len().min(15)].copy_from_slice(&PROGRAM_NAME.as_bytes()[..PROGRAM_NAME.len().min(15)]);
        let mut attr = LoadAttr {
            prog_type: PROG_TYPE_SYSCALL,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            prog_flags: F_SLEEPABLE,
            prog_name: name,
            ..LoadAttr::default()
        };
        match bpf(BPF_PROG_LOAD, &mut attr) {
            // SAFETY: a new descriptor the kernel handed us.
            Ok(fd) => Ok(Self { program: unsafe { OwnedFd::from_raw_fd(fd as i32) } }),
            Err(errno) => {
                // Again with the verifier's log, for the error.
                let mut log = vec![0u8; 1 << 16];
                attr.log_level = 1;
                attr.log_size = log.len() as u32;
                attr.log_buf = log.as_mut_ptr() as u64;
                let _ = bpf(BPF_PROG_LOAD, &mut attr);
                let text = CStr::from_bytes_until_nul(&log).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
                let last: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
                let log = last[last.len().saturating_sub(3)..].join(" / ");
                Err(QuicKeyError::Refused { errno, log })
            }
        }
    }

    /// Puts `key`'s context into slot `slot` (VIP id * 8 + config id), releasing the one it
    /// held: packets decrypt with the new key from the next one on.
    pub fn set(&self, slot: u32, key: &QuicLbKey) -> Result<(), QuicKeyError> {
        let mut input = [0u8; PARAMS_LEN + 8];
        input[..b"skcipher".len()].copy_from_slice(b"skcipher");
        let algo = TYPE_LEN + 2;
        input[algo..algo + b"ecb(aes)".len()].copy_from_slice(b"ecb(aes)");
        let key_at = algo + ALGO_LEN;
        input[key_at..key_at + key.octets().len()].copy_from_slice(key.octets());
        input[key_at + KEY_MAX..key_at + KEY_MAX + 4].copy_from_slice(&(key.octets().len() as u32).to_ne_bytes());
        input[PARAMS_LEN..PARAMS_LEN + 4].copy_from_slice(&slot.to_ne_bytes());
        let r = self.run(&mut input);
        // The key's octets: not left in this process's memory.
        for octet in input.iter_mut() {
            // SAFETY: a valid pointer to an octet of `input`; volatile so the write stays.
            unsafe { std::ptr::write_volatile(octet, 0) };
        }
        Self::outcome(r?, slot)
    }

    /// Empties slot `slot`: ids of its config id are no longer decrypted.
    pub fn clear(&self, slot: u32) -> Result<(), QuicKeyError> {
        let mut input = [0u8; PARAMS_LEN + 8];
        input[PARAMS_LEN..PARAMS_LEN + 4].copy_from_slice(&slot.to_ne_bytes());
        input[PARAMS_LEN + 4..].copy_from_slice(&1u32.to_ne_bytes());
        Self::outcome(self.run(&mut input)?, slot)
    }

    fn run(&self, input: &mut [u8]) -> Result<u32, QuicKeyError> {
        let mut attr = RunAttr {
            prog_fd: self.program.as_fd().as_raw_fd() as u32,
            ctx_size_in: input.len() as u32,
            ctx_in: input.as_mut_ptr() as u64,
            ..RunAttr::default()
        };
        bpf(BPF_PROG_TEST_RUN, &mut attr).map_err(QuicKeyError::Run)?;
        Ok(attr.retval)
    }

    fn outcome(retval: u32, slot: u32) -> Result<(), QuicKeyError> {
        match retval {
            0 => Ok(()),
            NO_SLOT => Err(QuicKeyError::NoSlot { slot }),
            err => Err(QuicKeyError::Create(err as i32)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{fs, os::unix::fs::PermissionsExt};

    use spillway_harness::tempdir::TempDir;

    use super::*;

    #[test]
    fn a_key_file_others_may_read_is_refused_naming_it_and_one_of_roots_alone_is_read() {
        let dir = TempDir::new("quic-key");
        let path = dir.path().join("quic-1.key");
        fs::write(&path, "8f95f09245765f80256934e50c66207f\n").unwrap();
        for mode in [0o644, 0o640, 0o602] {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
            let err = read_key_file(&path).unwrap_err();
            assert!(matches!(err, QuicKeyError::Exposed { .. }), "{err}");
            assert!(err.to_string().contains(&path.display().to_string()) && err.to_string().contains("chmod 600"), "{err}");
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_key_file(&path).unwrap().octets()[..2], [0x8f, 0x95]);
        fs::write(&path, "not a key").unwrap();
        let err = read_key_file(&path).unwrap_err().to_string();
        assert!(err.contains("quic-1.key") && err.contains("32 hexadecimal digits"), "{err}");
        // The key itself is in no error.
        fs::write(&path, "8f95f09245765f80256934e50c66207f00").unwrap();
        assert!(!read_key_file(&path).unwrap_err().to_string().contains("8f95"));
    }

    #[test]
    fn a_fifo_at_the_key_files_path_is_refused_without_waiting_for_a_writer() {
        let dir = TempDir::new("quic-key-fifo");
        let path = dir.path().join("quic-1.key");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let err = read_key_file(&path).unwrap_err();
        assert!(matches!(err, QuicKeyError::NotAFile { .. }), "{err}");
    }
}
