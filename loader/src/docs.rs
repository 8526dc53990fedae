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
pub fn completions(command: Command, shell: Shell, out: &mut dyn Write) {
    let mut command = with_value_hints(command);
    let name = command.get_name().to_owned();
    clap_complete::generate(shell, &mut command, name, out);
}

/// Value names of options that take a path: shells complete files for those only.
const PATH_VALUES: [&str; 4] = ["FILE", "DIR", "PATH", "SOCKET"];

/// Marks every option value that is not a path as free text, so shells offer no file names
/// for a VIP, an address or a number (bash completes files for anything unmarked).
fn with_value_hints(command: Command) -> Command {
    use clap::ValueHint;
    let command = command.mut_args(|arg| {
        let path = arg.get_value_names().is_some_and(|names| names.iter().any(|n| PATH_VALUES.contains(&n.as_str())));
        if arg.get_action().takes_values() && arg.get_value_hint() == ValueHint::Unknown && !path {
            arg.value_hint(ValueHint::Other)
        } else {
            arg
        }
    });
    let names: Vec<String> = command.get_subcommands().map(|s| s.get_name().to_owned()).collect();
    names.into_iter().fold(command, |command, name| command.mut_subcommand(name, with_value_hints))
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

#[cfg(test)]
mod tests {
    use std::{fs, process::Command as Process};

    use clap::CommandFactory;

    use super::*;
    use crate::{cli::Cli, daemon::args::LbdArgs, testing::TempDir};

    fn commands() -> [Command; 2] {
        [LbdArgs::command(), Cli::command()]
    }

    #[test]
    fn bash_completions_are_valid_scripts_that_know_the_subcommands() {
        let tmp = TempDir::new("completions");
        for command in commands() {
            let name = command.get_name().to_owned();
            let mut script = Vec::new();
            completions(command.clone(), Shell::Bash, &mut script);
            let path = tmp.path().join(&name);
            fs::write(&path, &script).unwrap();
            let check = Process::new("bash").arg("-n").arg(&path).output().unwrap();
            assert!(check.status.success(), "{name}: {}", String::from_utf8_lossy(&check.stderr));
            let text = String::from_utf8(script).unwrap();
            for sub in command.get_subcommands() {
                assert!(text.contains(sub.get_name()), "{name}'s completion lacks {}", sub.get_name());
            }
            // A VIP is no file name; a configuration file is.
            if name == "lbctl" {
                let completes = |subcommand: &str, option: &str| {
                    let section = text.split(&format!("lbctl__subcmd__{subcommand})")).nth(1).unwrap();
                    let case = &section[section.find(&format!("{option})")).unwrap()..];
                    case[..case.find("return 0").unwrap()].to_owned()
                };
                let vip = completes("flows__subcmd__get", "--vip");
                assert!(!vip.contains("compgen -f"), "--vip completes files: {vip}");
                let file = completes("apply", "--file");
                assert!(file.contains("compgen -f"), "--file completes files: {file}");
            }
            for shell in [Shell::Zsh, Shell::Fish] {
                let mut other = Vec::new();
                completions(command.clone(), shell, &mut other);
                assert!(String::from_utf8(other).unwrap().contains(&name), "{name} {shell}");
            }
        }
    }

    #[test]
    fn man_pages_cover_every_subcommand_and_render() {
        let tmp = TempDir::new("man");
        let mut written = man_pages(Cli::command(), tmp.path()).unwrap();
        written.extend_from_slice(&man_pages(LbdArgs::command(), tmp.path()).unwrap());
        let names: Vec<String> = fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        for page in
            ["lbctl.8", "lbctl-apply.8", "lbctl-diff.8", "lbctl-export.8", "lbctl-status.8", "lbctl-vips-add.8", "lbd.8", "lbd-agent.8"]
        {
            assert!(names.iter().any(|n| n == page), "no {page} in {names:?}");
        }
        assert!(!names.iter().any(|n| n.contains("help")), "{names:?}");
        for path in &written {
            // groff's warnings (-ww) on stderr mean a malformed page; not those about lines
            // it cannot fill evenly (-Wbreak: the help's JSON examples are long words).
            let render = Process::new("groff").args(["-man", "-Tutf8", "-ww", "-Wbreak"]).arg(path).output().unwrap();
            assert!(render.status.success() && render.stderr.is_empty(), "{}: {}", path.display(), String::from_utf8_lossy(&render.stderr));
        }
        let apply = Process::new("groff").args(["-man", "-Tascii"]).arg(tmp.path().join("lbctl-apply.8")).output().unwrap();
        let text = String::from_utf8_lossy(&apply.stdout);
        assert!(text.contains("allow-vip-removal") && text.contains("spillway.toml"), "{text}");
    }
}
