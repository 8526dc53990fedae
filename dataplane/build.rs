//! Builds the eBPF objects with the pinned nightly and bpf-linker (via aya-build), or, with
//! `AYA_BUILD_SKIP=1`, writes empty stand-ins so `cargo check`/clippy need neither. A
//! stand-in fails to load at run time with a message naming the missing build.

use std::{env, fs, path::PathBuf, process::Command};

/// Nightly used for the BPF target. Its LLVM major must equal bpf-linker's (22).
const EBPF_TOOLCHAIN: &str = "nightly-2026-08-01";
/// Binaries of the xdp-ebpf package; each becomes one object in OUT_DIR.
const OBJECTS: [&str; 6] =
    ["spillway-lb", "spillway-decap", "spillway-floor", "spillway-hop", "spillway-lb-stages", "spillway-operator-example"];

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
    build_sockwatch(&out_dir, skip)?;
    let package = aya_build::Package { name: "xdp-ebpf", root_dir: "../xdp-ebpf", ..Default::default() };
    aya_build::build_ebpf([package], aya_build::Toolchain::Custom(EBPF_TOOLCHAIN))
}

/// The socket watcher (`sockwatch-ebpf/`) is C with CO-RE, compiled by clang (`$CLANG`,
/// else `clang-22`, else `clang`). Without clang, or with `AYA_BUILD_SKIP`, an empty stand-in
/// is embedded; it fails to load with a message naming the missing build.
fn build_sockwatch(out_dir: &std::path::Path, skip: bool) -> anyhow::Result<()> {
    const SOURCE: &str = "../sockwatch-ebpf/sockwatch.bpf.c";
    println!("cargo::rerun-if-changed={SOURCE}");
    println!("cargo::rerun-if-env-changed=CLANG");
    let out = out_dir.join("spillway-sockwatch");
    if skip {
        if !out.exists() {
            fs::write(&out, [])?;
        }
        return Ok(());
    }
    let candidates = env::var("CLANG").map(|c| vec![c]).unwrap_or_else(|_| vec!["clang-22".into(), "clang".into()]);
    for clang in candidates {
        let status = Command::new(&clang).args(["-target", "bpf", "-O2", "-g", "-Wall", "-Werror", "-c", SOURCE, "-o"]).arg(&out).status();
        match status {
            Ok(status) if status.success() => return Ok(()),
            Ok(status) => anyhow::bail!("{clang} failed to compile {SOURCE}: {status}"),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => return Err(anyhow::Error::new(err).context(format!("running {clang}"))),
        }
    }
    println!("cargo::warning=clang not found: spillway-sockwatch is an empty stand-in (set CLANG or install clang-22)");
    fs::write(&out, [])?;
    Ok(())
}
