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
/// subcommands, named like `lbctl-vips-add.8`, with the sections [`sections`] adds to
/// clap's; returns their paths.
pub fn man_pages(mut command: Command, dir: &Path) -> io::Result<Vec<PathBuf>> {
    fn write(command: &Command, dir: &Path, written: &mut Vec<PathBuf>) -> io::Result<()> {
        let page = clap_mangen::Man::new(command.clone()).section("8");
        let path = dir.join(page.get_filename());
        let mut roff = Vec::new();
        page.render(&mut roff)?;
        let name = command.get_display_name().unwrap_or(command.get_name());
        for (title, body) in sections(name) {
            roff.extend(format!(".SH \"{title}\"\n{body}\n").into_bytes());
        }
        std::fs::write(&path, roff)?;
        written.push(path);
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

/// What clap cannot say about a page: signals, exit status, files and related pages (roff).
fn sections(page: &str) -> Vec<(&'static str, &'static str)> {
    const LBD_FILES: &str = ".TP\n.I /etc/spillway/spillway.toml\nThe configuration ./x install puts in place (\\-\\-config; see spillway.toml(5)).\n\
        .TP\n.I /run/spillway/api.sock\nThe API socket lbctl talks to (\\-\\-api).\n\
        .TP\n.I /var/lib/spillway\nThe state lbd persists across restarts (\\-\\-state\\-dir).\n\
        .TP\n.I /sys/fs/bpf/spillway\nThe pinned maps and link that keep forwarding when lbd is gone (\\-\\-pin\\-dir).";
    const LBCTL_STATUS: &str = "0 on success, 1 on any error, 2 for a usage error. Exceptions: lbctl diff (see lbctl\\-diff(8)) and lbctl ports, \
        which exits 1 when lbd has no report for the host.";
    const DIFF_STATUS: &str = ".TP\n0\nApplying the file would change nothing.\n.TP\n1\nIt would change something.\n\
        .TP\n2\nAn error: the file could not be read or lbd could not be asked.\n\
        .TP\n3\nIt would change something apply refuses as it is (a VIP removed with its backends: see \\-\\-allow\\-vip\\-removal).";
    match page {
        "lbd" => vec![
            (
                "SIGNALS",
                ".TP\nSIGHUP\nRe\\-reads the \\-\\-config file and applies it, as lbctl apply would (systemctl reload spillway).\n\
                 .TP\nSIGTERM, SIGINT\nExit, leaving forwarding running through the pinned link (if the bpffs outlives lbd: \
                 it warns at start when not); the next lbd takes it over. lbd \\-\\-cleanup removes what lbd put in the kernel.",
            ),
            (
                "EXIT STATUS",
                "0 when lbd exited on a signal (or \\-\\-cleanup finished), 1 when it could not start or failed, 2 for a usage error.",
            ),
            ("FILES", LBD_FILES),
            ("SEE ALSO", "lbctl(8), lbd\\-check(8), lbd\\-agent(8), spillway.toml(5), systemctl(1)"),
        ],
        "lbd-check" => vec![
            (
                "EXIT STATUS",
                "0 when a start would accept the file, 1 when it would refuse it (the reason names line, column and field), 2 for a usage error.",
            ),
            ("SEE ALSO", "lbd(8), lbctl\\-diff(8), spillway.toml(5)"),
        ],
        "lbd-agent" => vec![
            ("SIGNALS", ".TP\nSIGTERM, SIGINT\nExit, leaving decapsulation running through the pinned link."),
            ("EXIT STATUS", "0 when the agent exited on a signal, 1 when it could not start or failed, 2 for a usage error."),
            (
                "FILES",
                ".TP\n.I /etc/spillway/agent.toml\nThe agent's settings ([agent] of spillway.toml(5)).\n.TP\n.I /sys/fs/bpf/spillway\nIts pinned maps and link (\\-\\-pin\\-dir).",
            ),
            ("SEE ALSO", "lbd(8), lbctl\\-ports(8), spillway.toml(5)"),
        ],
        "lbctl" => vec![
            ("EXIT STATUS", LBCTL_STATUS),
            ("FILES", ".TP\n.I /run/spillway/api.sock\nlbd's API socket (\\-\\-api)."),
            ("SEE ALSO", "lbd(8), lbctl\\-apply(8), lbctl\\-diff(8), spillway.toml(5)"),
        ],
        "lbctl-diff" => vec![("EXIT STATUS", DIFF_STATUS), ("SEE ALSO", "lbctl\\-apply(8), lbd\\-check(8), spillway.toml(5)")],
        "lbctl-apply" => vec![("SEE ALSO", "lbctl\\-diff(8), lbctl\\-export(8), spillway.toml(5)")],
        "lbctl-export" => vec![("SEE ALSO", "lbctl\\-apply(8), spillway.toml(5)")],
        "lbctl-ports" => vec![
            ("EXIT STATUS", "0 with a report, 1 when lbd has none for the host (the reason is printed) or on an error."),
            ("SEE ALSO", "lbd\\-agent(8)"),
        ],
        _ => Vec::new(),
    }
}

/// The example configuration the page describes (the one ./x install puts in place).
pub const EXAMPLE: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/spillway.toml"));

/// `# key = value` or `key = value`: a line that sets (or shows the default of) a key.
pub fn key_line(line: &str) -> Option<&str> {
    let setting = line.strip_prefix("# ").unwrap_or(line);
    let (key, _) = setting.split_once(" = ")?;
    key.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_').then_some(key)
}

fn escape(text: &str) -> String {
    let text = text.replace('\\', "\\e").replace('-', "\\-").replace('"', "\\(dq");
    if text.starts_with(['.', '\'']) { format!("\\&{text}") } else { text }
}

/// spillway.toml(5), from the example file: its opening comment is the description, each
/// table a subsection, each key (with its default) a tagged paragraph of the comment above
/// it. Generated, so the page and the example cannot disagree.
pub fn config_page(dir: &Path) -> io::Result<PathBuf> {
    let mut page = String::from(
        ".TH spillway.toml 5 \"\" spillway \"File Formats\"\n.nh\n.ad l\n.SH NAME\nspillway.toml \\- configuration of lbd, lbd agent and the desired state\n.SH DESCRIPTION\n",
    );
    let (mut comment, mut keys): (Vec<&str>, Vec<&str>) = (Vec::new(), Vec::new());
    let emit = |page: &mut String, comment: &mut Vec<&str>, keys: &mut Vec<&str>| {
        if keys.is_empty() && !comment.is_empty() {
            page.push_str(".PP\n");
        }
        for (n, key) in keys.drain(..).enumerate() {
            page.push_str(&format!("{}\n.B {}\n", if n == 0 { ".TP" } else { ".TQ" }, escape(key)));
        }
        let mut verbatim = false;
        for line in comment.drain(..) {
            // Indented lines are command examples: kept as they are.
            let indented = line.starts_with("  ");
            if indented != verbatim {
                page.push_str(if indented { ".nf\n" } else { ".fi\n" });
                verbatim = indented;
            }
            page.push_str(&if line.is_empty() { ".sp".to_owned() } else { escape(line.trim_start()) });
            page.push('\n');
        }
        if verbatim {
            page.push_str(".fi\n");
        }
    };
    for line in EXAMPLE.lines() {
        if line.starts_with('[') {
            // The comment just above a table describes the table: it goes under its heading.
            let about = if keys.is_empty() { std::mem::take(&mut comment) } else { Vec::new() };
            emit(&mut page, &mut comment, &mut keys);
            page.push_str(&format!(".SS \"{}\"\n", escape(line)));
            emit(&mut page, &mut { about }, &mut Vec::new());
        } else if line.trim().is_empty() {
            emit(&mut page, &mut comment, &mut keys);
        } else if key_line(line).is_some() || !line.starts_with('#') {
            keys.push(line.strip_prefix("# ").unwrap_or(line));
        } else {
            // A key's comment is above it: one after keys starts the next.
            if !keys.is_empty() {
                emit(&mut page, &mut comment, &mut keys);
            }
            comment.push(line[1..].strip_prefix(' ').unwrap_or(&line[1..]));
        }
    }
    emit(&mut page, &mut comment, &mut keys);
    page.push_str(".SH \"SEE ALSO\"\nlbd(8), lbd\\-check(8), lbctl\\-diff(8), lbctl\\-apply(8), lbd\\-agent(8)\n");
    let path = dir.join("spillway.toml.5");
    std::fs::write(&path, page)?;
    Ok(path)
}
