//! The documentation's snippets, run as written (`daemon/tests/snippets.rs`): every fenced
//! block of the Markdown files carries a marker naming its kind on the line before it,
//!
//! ````text
//! <!-- snippet: spillway-toml -->
//! ```toml
//! [lbd]
//! ...
//! ```
//! ````
//!
//! and each kind is checked with the real tool ([`Kind`]). A fence without a marker, or with
//! a kind nobody checks, is an error: a new snippet cannot go unchecked. Here: reading the
//! snippets, the words of their shell commands, and the namespaces the checks run in (a
//! host with `eth0` for `lbd check`, a router and a balancer running BIRD).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::cleanup::sweep_stale;
use crate::fleet::{bird_binary, birdc, start_bird};
use crate::lbctl::START_TIMEOUT;
use crate::netns::Netns;
use crate::process::{Daemon, Registry};
use crate::tempdir::TempDir;
use crate::topology::next_id;

/// What a snippet is, and so how it is checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Shell commands: `bash -n`, and every `lbd` and `lbctl` command parsed by the real CLI.
    Shell,
    /// Shell commands for a host's network settings (`sysctl -w`, `ip`): checked as
    /// [`Kind::Shell`], and run in the balancer's namespace of [`SnippetHosts`].
    ShellInNetns,
    /// A terminal session: its `$ ` lines are commands, parsed like [`Kind::Shell`]'s.
    Transcript,
    /// A `spillway.toml` (or part of one): `lbd check -f` on a host with `eth0`.
    SpillwayToml,
    /// An `agent.toml`: `lbd check -f` as well.
    AgentToml,
    /// A balancer's `bird.conf`: `bird -p`, then started beside the router's, announcing
    /// what `lbd`'s include holds.
    BirdBalancer,
    /// A router's `bird.conf`: `bird -p`, then started with sessions to the balancer until
    /// they are Established and its kernel routes the balancer's VIPs through it.
    BirdRouter,
    /// A drop-in for the named shipped unit: `systemd-analyze verify` with the unit.
    SystemdDropIn(String),
    /// A Prometheus configuration: `promtool check config`.
    Prometheus,
    /// What a program prints (logs, output, diagrams): not run.
    Output,
    /// Rust for the reader's own program: not run here.
    Rust,
}

impl Kind {
    fn parse(marker: &str) -> Result<Kind> {
        let mut words = marker.split_whitespace();
        let kind = match (words.next(), words.next()) {
            (Some("shell"), None) => Kind::Shell,
            (Some("shell-netns"), None) => Kind::ShellInNetns,
            (Some("transcript"), None) => Kind::Transcript,
            (Some("spillway-toml"), None) => Kind::SpillwayToml,
            (Some("agent-toml"), None) => Kind::AgentToml,
            (Some("bird-balancer"), None) => Kind::BirdBalancer,
            (Some("bird-router"), None) => Kind::BirdRouter,
            (Some("systemd-drop-in"), Some(unit)) if unit.ends_with(".service") => Kind::SystemdDropIn(unit.to_owned()),
            (Some("prometheus"), None) => Kind::Prometheus,
            (Some("output"), None) => Kind::Output,
            (Some("rust"), None) => Kind::Rust,
            _ => bail!(
                "unknown snippet kind {marker:?}: shell, shell-netns, transcript, spillway-toml, agent-toml, bird-balancer, bird-router, \
                 systemd-drop-in UNIT.service, prometheus, output or rust"
            ),
        };
        ensure!(words.next().is_none(), "snippet kind {marker:?}: one kind (and a unit for systemd-drop-in)");
        Ok(kind)
    }
}

/// One fenced block of a Markdown file.
#[derive(Clone, Debug)]
pub struct Snippet {
    /// `README.md:123`: the fence's line.
    pub place: String,
    pub kind: Kind,
    /// The block's lines, its fence's indentation removed.
    pub text: String,
}

const MARKER_START: &str = "<!-- snippet:";
const MARKER_END: &str = "-->";

/// Every fenced block of `markdown` (the file `name`), each with the kind its marker names.
/// Fails on a fence without a marker on the line before it, an unknown kind, a marker
/// without a fence after it, and an unclosed fence.
pub fn extract(name: &str, markdown: &str) -> Result<Vec<Snippet>> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut snippets = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim_start();
        let place = format!("{name}:{}", i + 1);
        if line.starts_with(MARKER_START) {
            let next = lines.get(i + 1).map(|l| l.trim_start());
            ensure!(next.is_some_and(|l| l.starts_with("```")), "{place}: a snippet marker must be the line right before a ``` fence");
        }
        if !line.starts_with("```") {
            i += 1;
            continue;
        }
        let marker = i.checked_sub(1).map(|p| lines[p].trim()).and_then(|l| l.strip_prefix(MARKER_START)?.strip_suffix(MARKER_END));
        let Some(marker) = marker else {
            bail!(
                "{place}: a fenced block without a marker: put `<!-- snippet: KIND -->` on the line before it, naming how a test \
                 checks it (see harness/src/snippets.rs)"
            )
        };
        let kind = Kind::parse(marker.trim()).with_context(|| place.clone())?;
        let indent = lines[i].len() - line.len();
        let end =
            (i + 1..lines.len()).find(|&j| lines[j].trim_start().starts_with("```")).with_context(|| format!("{place}: unclosed fence"))?;
        let body: Vec<&str> =
            lines[i + 1..end].iter().map(|l| l.get(indent..).filter(|_| l[..indent].trim().is_empty()).unwrap_or(l)).collect();
        snippets.push(Snippet { place: place.clone(), kind, text: body.join("\n") + "\n" });
        i = end + 1;
    }
    Ok(snippets)
}

/// The `lbd` and `lbctl` commands of a shell snippet, each as its words (the program's
/// name first): continuation lines joined, comments, redirections and what follows them
/// dropped, pipelines and lists (`|`, `&&`, `||`, `;`) split. Only `$ ` lines of a
/// transcript are commands.
pub fn invocations(snippet: &Snippet) -> Vec<Vec<String>> {
    let joined = snippet.text.replace("\\\n", " ");
    let lines = joined.lines().filter_map(|line| match snippet.kind {
        Kind::Transcript => line.strip_prefix("$ "),
        _ => Some(line),
    });
    let mut commands = Vec::new();
    for line in lines {
        let mut current: Vec<String> = Vec::new();
        let mut redirected = false;
        for word in shell_words(line) {
            match word.as_str() {
                "|" | "&&" | "||" | ";" => {
                    commands.push(std::mem::take(&mut current));
                    redirected = false;
                }
                w if w.starts_with('>') || w.starts_with('<') || w.starts_with("2>") => redirected = true,
                _ if redirected => {}
                _ => current.push(word),
            }
        }
        commands.push(current);
    }
    commands.retain(|words| words.first().is_some_and(|w| w == "lbd" || w == "lbctl"));
    commands
}

/// `line`'s words as a shell splits them (quotes removed), up to a comment; operators are
/// words of their own.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == c {
                        break;
                    }
                    word.push(q);
                }
            }
            '#' if !in_word => break,
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '|' | '&' | ';' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
                let mut op = c.to_string();
                if chars.peek() == Some(&c) {
                    op.push(chars.next().expect("peeked"));
                }
                words.push(op);
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// The balancer's addresses in the documents' examples (docs/host.md, docs/fleet.md) (`outer_src`, BIRD's `local`).
pub const BALANCER4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
pub const BALANCER6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2);
/// The router's.
pub const ROUTER4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub const ROUTER6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1);

/// A balancer and a router as the documents number them, joined by a veth (`eth0` on each,
/// forwarding on), for running snippets: `lbd check` on the balancer, BIRD on both. Removed
/// on drop, processes first.
pub struct SnippetHosts {
    // Field order is drop order.
    registry: Arc<Registry>,
    balancer: Netns,
    router: Netns,
    tempdir: TempDir,
    /// Last: gone before a test that runs alone may start (see `alone`).
    _shared: crate::alone::Shared,
}

impl SnippetHosts {
    pub fn create() -> Result<SnippetHosts> {
        let shared = crate::alone::shared()?;
        if let Err(err) = sweep_stale() {
            eprintln!("spillway-harness: {err:#}");
        }
        let id = next_id();
        let tempdir = TempDir::create(std::env::temp_dir().join(&id))?;
        let registry = Arc::new(Registry::new(tempdir.path().to_owned()));
        let balancer = Netns::create("lb1", format!("{id}-lb1"), Arc::clone(&registry))?;
        let router = Netns::create("router", format!("{id}-router"), Arc::clone(&registry))?;
        let hosts = SnippetHosts { registry, balancer, router, tempdir, _shared: shared };
        hosts.balancer.run(&["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", hosts.router.name()])?;
        for (ns, v4, v6) in [(&hosts.balancer, BALANCER4, BALANCER6), (&hosts.router, ROUTER4, ROUTER6)] {
            ns.run(&["ip", "link", "set", "lo", "up"])?;
            ns.run(&["ip", "link", "set", "eth0", "up"])?;
            ns.run(&["ip", "addr", "add", &format!("{v4}/24"), "dev", "eth0"])?;
            ns.run(&["ip", "-6", "addr", "add", &format!("{v6}/64"), "dev", "eth0", "nodad"])?;
            for key in
                ["net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding", "net.ipv4.conf.eth0.forwarding", "net.ipv6.conf.eth0.forwarding"]
            {
                ns.sysctl(key, "1")?;
            }
        }
        Ok(hosts)
    }

    pub fn balancer(&self) -> &Netns {
        &self.balancer
    }

    /// Runs `script` with `bash -eu -o pipefail` in the balancer's namespace (its network
    /// settings are the namespace's own); fails with its output unless it succeeds.
    pub fn run_shell(&self, script: &str) -> Result<()> {
        self.balancer.run(&["bash", "-eu", "-o", "pipefail", "-c", script]).map(drop)
    }

    /// A directory for the snippets' files; removed on drop.
    pub fn tempdir(&self) -> &Path {
        self.tempdir.path()
    }

    /// `bird -p -c FILE`: BIRD parses `config` (written to `name` in the temporary
    /// directory) and says nothing.
    pub fn bird_parses(&self, name: &str, config: &str) -> Result<()> {
        let file = self.tempdir().join(name);
        std::fs::write(&file, config).with_context(|| format!("writing {}", file.display()))?;
        let out = Command::new(bird_binary()?).arg("-p").arg("-c").arg(&file).output().context("running bird -p")?;
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        ensure!(out.status.success() && said.trim().is_empty(), "bird -p -c {}: {said}", file.display());
        Ok(())
    }

    /// Starts BIRD with `router` on the router and `balancer` on the balancer, and waits
    /// (bounded) until every BGP protocol named in `sessions` (router's, balancer's) is
    /// Established on its side. Returns the daemons, which stop on drop of the hosts.
    pub fn start_bird_pair(&self, router: &str, balancer: &str, sessions: (&[&str], &[&str])) -> Result<[Daemon; 2]> {
        let router_dir = self.tempdir().join("bird-router");
        let balancer_dir = self.tempdir().join("bird-balancer");
        let daemons = [start_bird(&self.router, &router_dir, router)?, start_bird(&self.balancer, &balancer_dir, balancer)?];
        let started = Instant::now();
        for (dir, names, daemon) in [(&router_dir, sessions.0, &daemons[0]), (&balancer_dir, sessions.1, &daemons[1])] {
            for name in names {
                loop {
                    let shown = birdc(&dir.join("bird.ctl"), &format!("show protocols {name}")).unwrap_or_default();
                    if shown.contains("Established") {
                        break;
                    }
                    if started.elapsed() > START_TIMEOUT {
                        bail!("BGP session {name} not Established within {START_TIMEOUT:?}:\n{shown}\n{}", daemon.log());
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        Ok(daemons)
    }
}

impl SnippetHosts {
    /// Waits (bounded) until the router's kernel routes `prefix` through the balancer: the
    /// route it learnt over BGP, installed by its BIRD.
    pub fn wait_for_router_route(&self, prefix: &str) -> Result<()> {
        let (family, via) = if prefix.contains(':') { ("-6", BALANCER6.to_string()) } else { ("-4", BALANCER4.to_string()) };
        let started = Instant::now();
        loop {
            let shown = self.router.run(&["ip", family, "route", "show", prefix])?;
            if shown.split_whitespace().collect::<Vec<_>>().windows(2).any(|w| w == ["via", via.as_str()]) {
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                bail!("the router has no route to {prefix} via {via} within {START_TIMEOUT:?}: {shown:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for SnippetHosts {
    fn drop(&mut self) {
        self.registry.stop_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fence_needs_a_known_marker() {
        let marked = "text\n<!-- snippet: shell -->\n```sh\nlbctl status\n```\n";
        let snippets = extract("x.md", marked).unwrap();
        assert_eq!((snippets.len(), &snippets[0].kind, snippets[0].text.as_str()), (1, &Kind::Shell, "lbctl status\n"));
        for (text, error) in [
            ("```toml\n[lbd]\n```\n", "x.md:1: a fenced block without a marker"),
            ("<!-- snippet: shell -->\n\n```sh\n```\n", "x.md:1: a snippet marker must be the line right before"),
            ("<!-- snippet: toml -->\n```toml\n```\n", "unknown snippet kind \"toml\""),
            ("<!-- snippet: shell -->\n```sh\nlbctl status\n", "x.md:2: unclosed fence"),
        ] {
            let err = format!("{:#}", extract("x.md", text).unwrap_err());
            assert!(err.contains(error), "{text:?}: {err}");
        }
    }

    #[test]
    fn invocations_are_the_lbd_and_lbctl_commands() {
        let text = "lbd check -f a.toml && systemctl reload spillway   # comment\nlbctl export > x.toml\n\
                    lbctl backends drain --vip 1.2.3.4:80/tcp 10.0.0.1 && lbctl flows purge --backend 10.0.0.1\n\
                    lbd agent --iface eth0 \\\n    --allow-from 10.0.0.2/32\nip addr add 1.2.3.4/32 dev lo\necho '# not a comment' | lbctl apply -f -\n";
        let snippet = Snippet { place: String::new(), kind: Kind::Shell, text: text.to_owned() };
        let words: Vec<String> = invocations(&snippet).iter().map(|c| c.join(" ")).collect();
        assert_eq!(
            words,
            [
                "lbd check -f a.toml",
                "lbctl export",
                "lbctl backends drain --vip 1.2.3.4:80/tcp 10.0.0.1",
                "lbctl flows purge --backend 10.0.0.1",
                "lbd agent --iface eth0 --allow-from 10.0.0.2/32",
                "lbctl apply -f -",
            ]
        );
        let transcript = Snippet { place: String::new(), kind: Kind::Transcript, text: "$ lbctl vips list\nlbctl not a command\n".into() };
        assert_eq!(invocations(&transcript), [["lbctl", "vips", "list"]]);
    }
}
