//! The man pages and shell completions of `lbd` and `lbctl` (`spillway-manual`) as their
//! users get them: every subcommand covered, each page rendered by groff without a warning,
//! every setting of the example configuration in spillway.toml(5), each script valid.

use std::{fs, process::Command as Process};

use clap::{Command, CommandFactory};
use clap_complete::Shell;
use spillway_cli::Cli;
use spillway_daemon::args::LbdArgs;
use spillway_harness::tempdir::TempDir;
use spillway_manual::{EXAMPLE, completions, config_page, key_line, man_pages};

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
    for page in ["lbctl.8", "lbctl-apply.8", "lbctl-diff.8", "lbctl-export.8", "lbctl-status.8", "lbctl-vips-add.8", "lbd.8", "lbd-agent.8"]
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
    let config = config_page(tmp.path()).unwrap();
    let render = Process::new("groff").args(["-man", "-Tutf8", "-ww", "-Wbreak"]).arg(&config).output().unwrap();
    assert!(render.status.success() && render.stderr.is_empty(), "spillway.toml.5: {}", String::from_utf8_lossy(&render.stderr));
    let ascii = |page: &str| {
        let out = Process::new("groff").args(["-man", "-Tascii", "-P-cbou"]).arg(tmp.path().join(page)).output().unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    // Every key of the example, commented out or set, with its value, and its tables.
    let words = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
    let text = words(&ascii("spillway.toml.5"));
    for line in EXAMPLE.lines().filter(|l| key_line(l).is_some() || l.starts_with('[')) {
        let setting = words(line.strip_prefix("# ").unwrap_or(line));
        assert!(text.contains(&setting), "spillway.toml(5) lacks {setting:?}:\n{text}");
    }
    assert!(text.contains("lbctl diff -f spillway.toml") && text.contains("probe_mark"), "{text}");
    let lbd = ascii("lbd.8");
    for section in ["SIGNALS", "EXIT STATUS", "FILES", "SEE ALSO", "SIGHUP", "spillway.toml(5)"] {
        assert!(lbd.contains(section), "lbd(8) lacks {section}:\n{lbd}");
    }
    let diff = ascii("lbctl-diff.8");
    assert!(diff.contains("EXIT STATUS") && diff.contains("apply refuses"), "{diff}");
    assert!(ascii("lbctl.8").contains("lbctl ports"), "lbctl(8) names ports' exit status");
    assert!(ascii("lbd-check.8").contains("EXIT STATUS"));
    let apply = Process::new("groff").args(["-man", "-Tascii"]).arg(tmp.path().join("lbctl-apply.8")).output().unwrap();
    let text = String::from_utf8_lossy(&apply.stdout);
    assert!(text.contains("allow-vip-removal") && text.contains("spillway.toml"), "{text}");
}
