//! Shell completions and man pages, generated from the clap definitions of `lbd` and `lbctl`
//! (so they cannot drift from the real options). `./x install` puts them in place.

use std::{
    io::{self, Write},
    path::{Path, PathBuf},
};

use clap::{Args, Command};
use clap_complete::Shell;

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Directory to write the pages to (one per command and subcommand).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
}

/// Writes `shell`'s completion script for `command` to `out`.
pub fn completions(mut command: Command, shell: Shell, out: &mut dyn Write) {
    let name = command.get_name().to_owned();
    clap_complete::generate(shell, &mut command, name, out);
}

/// Writes a page in section 8 (system administration) for `command` and each of its
/// subcommands, named like `lbctl-vips-add.8`; returns their paths.
pub fn man_pages(mut command: Command, dir: &Path) -> io::Result<Vec<PathBuf>> {
    fn write(command: &Command, dir: &Path, written: &mut Vec<PathBuf>) -> io::Result<()> {
        let page = clap_mangen::Man::new(command.clone()).section("8");
        written.push(page.generate_to(dir)?);
        for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
            write(sub, dir, written)?;
        }
        Ok(())
    }
    // Building sets each subcommand's display name (`lbctl-vips-add`), which names its page.
    command = command.disable_help_subcommand(true);
    command.build();
    let mut written = Vec::new();
    write(&command, dir, &mut written)?;
    Ok(written)
}
