//! Builds the eBPF objects with the pinned nightly and bpf-linker (via aya-build), or, with
//! `AYA_BUILD_SKIP=1`, writes empty stand-ins so `cargo check`/clippy need neither. A
//! stand-in fails to load at run time with a message naming the missing build.

use std::{env, fs, path::PathBuf};

/// Nightly used for the BPF target. Its LLVM major must equal bpf-linker's (22).
const EBPF_TOOLCHAIN: &str = "nightly-2026-08-01";
/// Binaries of the xdp-ebpf package; each becomes one object in OUT_DIR.
const OBJECTS: [&str; 3] = ["spillway-lb", "spillway-decap", "spillway-floor"];

fn main() -> anyhow::Result<()> {
    println!("cargo::rerun-if-changed=../common/src");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        for name in OBJECTS {
            let path = out_dir.join(name);
            if !path.exists() {
                fs::write(&path, [])?;
            }
        }
        // aya-build prints its own skip notice.
    }
    let package = aya_build::Package { name: "xdp-ebpf", root_dir: "../xdp-ebpf", ..Default::default() };
    aya_build::build_ebpf([package], aya_build::Toolchain::Custom(EBPF_TOOLCHAIN))
}
