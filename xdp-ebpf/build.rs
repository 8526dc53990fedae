//! Compiles the C half of the balancer's QUIC program (`c/quic_aes.bpf.c`: AES through the
//! kernel's crypto kfuncs, and the map of the keys' contexts) to LLVM bitcode with clang
//! (`$CLANG`, else `clang-22`), and has bpf-linker link it into `spillway-lb`. Its maps are
//! exported by name: unexported, its relocations resolve to another map.

use std::{env, path::PathBuf, process::Command};

const SOURCE: &str = "c/quic_aes.bpf.c";

fn main() {
    println!("cargo::rerun-if-changed={SOURCE}");
    println!("cargo::rerun-if-env-changed=CLANG");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("quic_aes.bc");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang-22".into());
    let status = Command::new(&clang)
        .args(["-target", "bpf", "-O2", "-g", "-Wall", "-Werror", "-emit-llvm", "-c", SOURCE, "-o"])
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("running {clang} to compile {SOURCE}: {e} (install clang-22: ./x setup)"));
    assert!(status.success(), "{clang} failed to compile {SOURCE}: {status}");
    println!("cargo::rustc-link-arg-bin=spillway-lb={}", out.display());
    println!("cargo::rustc-link-arg-bin=spillway-lb=--export=spw_quic_keys,spw_quic_aes_buf");
}
