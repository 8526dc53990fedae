//! The test binaries of the workspace, built once by `cargo test --no-run`, which names each
//! executable, its package and target in its JSON messages.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::Stdio;

use anyhow::{Context, Result, ensure};
use serde_json::Value;

/// One test executable, as `cargo test` would run it.
#[derive(Debug)]
pub struct TestBinary {
    pub package: String,
    /// `lib`, `bin`, `test`, ...: the target's first kind.
    pub kind: String,
    pub target: String,
    pub executable: PathBuf,
    /// The package's directory: cargo runs a test binary there.
    pub package_dir: PathBuf,
}

/// Builds every test target of the default members (and the binaries the tests run) and
/// lists the test executables. Compiler messages go to the terminal as usual.
pub fn build() -> Result<Vec<TestBinary>> {
    let args = ["test", "--no-run", "--message-format=json-render-diagnostics"];
    let mut child = super::cargo(&args).stdout(Stdio::piped()).spawn()?;
    let stdout = child.stdout.take().context("cargo's stdout")?;
    let mut binaries = Vec::new();
    for line in std::io::BufReader::new(stdout).lines() {
        let message: Value = serde_json::from_str(&line?).context("a message of cargo test --no-run")?;
        if let Some(binary) = test_binary(&message)? {
            binaries.push(binary);
        }
    }
    let status = child.wait()?;
    ensure!(status.success(), "cargo {} failed ({status})", args.join(" "));
    Ok(binaries)
}

/// The test executable a `compiler-artifact` message names, if it names one.
fn test_binary(message: &Value) -> Result<Option<TestBinary>> {
    let is_test = message["reason"] == "compiler-artifact" && message["profile"]["test"] == true;
    let Some(executable) = message["executable"].as_str().filter(|_| is_test) else {
        return Ok(None);
    };
    let text = |value: &Value| value.as_str().map(str::to_owned).with_context(|| format!("a test artifact without {value}: {message}"));
    let manifest = PathBuf::from(text(&message["manifest_path"])?);
    Ok(Some(TestBinary {
        package: package_name(&text(&message["package_id"])?),
        kind: text(&message["target"]["kind"][0])?,
        target: text(&message["target"]["name"])?,
        executable: PathBuf::from(executable),
        package_dir: manifest.parent().context("a manifest path without a directory")?.to_owned(),
    }))
}

/// The name in a package id: `path+file:///w/daemon#spillway-daemon@0.1.0`, or, when the
/// name is the directory's, `path+file:///w/xtask#0.1.0`.
fn package_name(id: &str) -> String {
    let (url, fragment) = id.split_once('#').unwrap_or((id, ""));
    match fragment.split_once('@') {
        Some((name, _version)) => name.to_owned(),
        None => url.rsplit('/').next().unwrap_or(url).to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_artifact_names_its_package_target_and_directory() {
        let message = serde_json::json!({
            "reason": "compiler-artifact",
            "package_id": "path+file:///w/daemon#spillway-daemon@0.1.0",
            "manifest_path": "/w/daemon/Cargo.toml",
            "target": { "kind": ["test"], "name": "e2e" },
            "profile": { "test": true },
            "executable": "/w/target/debug/deps/e2e-0123"
        });
        let binary = test_binary(&message).unwrap().unwrap();
        assert_eq!((binary.package.as_str(), binary.kind.as_str(), binary.target.as_str()), ("spillway-daemon", "test", "e2e"));
        assert_eq!(binary.executable, PathBuf::from("/w/target/debug/deps/e2e-0123"));
        assert_eq!(binary.package_dir, PathBuf::from("/w/daemon"));
    }

    #[test]
    fn binaries_built_for_the_tests_to_run_are_no_test_binaries() {
        let lbd = serde_json::json!({
            "reason": "compiler-artifact",
            "package_id": "path+file:///w/daemon#spillway-daemon@0.1.0",
            "manifest_path": "/w/daemon/Cargo.toml",
            "target": { "kind": ["bin"], "name": "lbd" },
            "profile": { "test": false },
            "executable": "/w/target/debug/lbd"
        });
        assert!(test_binary(&lbd).unwrap().is_none());
        assert!(test_binary(&serde_json::json!({ "reason": "build-finished", "success": true })).unwrap().is_none());
    }

    #[test]
    fn a_package_named_after_its_directory_has_no_name_in_its_id() {
        assert_eq!(package_name("path+file:///w/xtask#0.1.0"), "xtask");
        assert_eq!(package_name("path+file:///w/harness#spillway-harness@0.1.0"), "spillway-harness");
    }
}
