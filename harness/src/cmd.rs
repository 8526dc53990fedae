//! Running external commands (`ip`, `ethtool`, `nsenter`) with errors that say what failed.

use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// Runs `cmd` to completion and returns its stdout.
///
/// A non-zero exit is an error naming the full command line and carrying its
/// stderr, because "exit status 2" alone is useless when one of a hundred
/// setup commands fails.
pub(crate) fn run(cmd: &mut Command) -> Result<String> {
    let line = command_line(cmd);
    let output = cmd.stdin(Stdio::null()).output().with_context(|| format!("cannot start `{line}`"))?;
    if !output.status.success() {
        bail!("`{line}` failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The command as a shell-like line, for error messages.
pub(crate) fn command_line(cmd: &Command) -> String {
    std::iter::once(cmd.get_program()).chain(cmd.get_args()).map(|arg| arg.to_string_lossy()).collect::<Vec<_>>().join(" ")
}
