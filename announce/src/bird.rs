//! A client for BIRD's control socket (what `birdc` speaks): one command, one reply. A reply
//! is lines `CODE-text` (more follow), ` text` (continuation of the same code) and a last
//! `CODE text`; codes 0xxx are success, 8xxx runtime errors and 9xxx parse errors.
//! Bounded: every exchange has a timeout and a reply is at most [`MAX_REPLY`] bytes.

use std::{
    io::{self, BufRead, BufReader, Read, Write},
    net::IpAddr,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::Duration,
};

/// How long BIRD may take to answer one command (a `configure` parses the whole file).
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// Longest reply read: a VIP's routes from a few hundred balancers fit many times over.
pub const MAX_REPLY: u64 = 1 << 20;
/// "Network not found": a `show route` that matched nothing.
const NOT_FOUND: u16 = 8001;

#[derive(Debug, thiserror::Error)]
pub enum BirdError {
    #[error("connecting to BIRD's control socket {}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("talking to BIRD")]
    Io(#[source] io::Error),
    #[error("BIRD answered {code}: {message}")]
    Refused { code: u16, message: String },
    #[error("BIRD's reply is garbled: {line:?}")]
    Garbled { line: String },
    #[error("BIRD's reply is longer than {MAX_REPLY} bytes")]
    TooLong,
}

/// One line of a reply: its code (continuations carry their block's) and text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub code: u16,
    pub text: String,
}

pub struct Bird {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Bird {
    /// Connects and reads BIRD's greeting.
    pub fn connect(path: &Path) -> Result<Self, BirdError> {
        let stream = UnixStream::connect(path).map_err(|source| BirdError::Connect { path: path.to_owned(), source })?;
        stream.set_read_timeout(Some(TIMEOUT)).and_then(|()| stream.set_write_timeout(Some(TIMEOUT))).map_err(BirdError::Io)?;
        let writer = stream.try_clone().map_err(BirdError::Io)?;
        let mut bird = Self { reader: BufReader::new(stream), writer };
        bird.reply()?;
        Ok(bird)
    }

    /// Runs `command` (one line) and returns the reply's lines; an error code is an error.
    pub fn command(&mut self, command: &str) -> Result<Vec<Line>, BirdError> {
        self.writer.write_all(format!("{command}\n").as_bytes()).map_err(BirdError::Io)?;
        self.reply()
    }

    /// Re-reads the configuration (and so the include), after checking it: a file BIRD
    /// would refuse is never loaded, and its message is the error.
    pub fn configure(&mut self) -> Result<(), BirdError> {
        self.command("configure check")?;
        self.command("configure").map(drop)
    }

    /// The routes for exactly `prefix` in `table` (none when BIRD has no such network).
    pub fn routes(&mut self, table: &str, prefix: IpAddr) -> Result<Vec<RouteInfo>, BirdError> {
        let len = if prefix.is_ipv4() { 32 } else { 128 };
        match self.command(&format!("show route {prefix}/{len} table {table} all")) {
            Ok(lines) => Ok(parse_routes(&lines)),
            Err(BirdError::Refused { code: NOT_FOUND, .. }) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    fn reply(&mut self) -> Result<Vec<Line>, BirdError> {
        read_reply(&mut self.reader)
    }
}

/// One reply read off `reader` (at most [`MAX_REPLY`] bytes): its lines up to the last, or
/// the error its code says.
pub fn read_reply(reader: &mut impl BufRead) -> Result<Vec<Line>, BirdError> {
    let mut lines = Vec::new();
    let mut code = 0;
    let mut budget = MAX_REPLY;
    loop {
        let mut raw = String::new();
        let n = (&mut *reader).take(budget).read_line(&mut raw).map_err(BirdError::Io)?;
        if n == 0 {
            return Err(if budget == 0 { BirdError::TooLong } else { BirdError::Io(io::ErrorKind::UnexpectedEof.into()) });
        }
        budget -= n as u64;
        let raw = raw.trim_end_matches('\n');
        let (last, text) = match (raw.get(..4).and_then(|c| c.parse::<u16>().ok()), raw.as_bytes().get(4)) {
            (Some(c), Some(b' ')) => {
                code = c;
                (true, &raw[5..])
            }
            (Some(c), Some(b'-')) => {
                code = c;
                (false, &raw[5..])
            }
            (Some(c), None) if raw.len() == 4 => {
                code = c;
                (true, "")
            }
            _ if raw.starts_with(' ') => (false, &raw[1..]),
            _ => return Err(BirdError::Garbled { line: raw.to_owned() }),
        };
        lines.push(Line { code, text: text.to_owned() });
        if last {
            return if code >= 8000 { Err(BirdError::Refused { code, message: text.to_owned() }) } else { Ok(lines) };
        }
    }
}

/// What the announcement policy needs of a route in BIRD's table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteInfo {
    /// The protocol it came from (`spillway_vips4`, or a BGP session's name).
    pub protocol: String,
    /// `BGP.next_hop`: the balancer that announced it (absent on non-BGP routes).
    pub next_hop: Option<IpAddr>,
    /// `BGP.community` values.
    pub communities: Vec<(u16, u16)>,
}

/// The routes of a `show route ... all` reply: each starts with a line naming its protocol
/// in brackets (`10.0.0.1/32  unicast [uplink 12:00:00] * (100)`), attributes follow.
pub fn parse_routes(lines: &[Line]) -> Vec<RouteInfo> {
    let mut routes: Vec<RouteInfo> = Vec::new();
    for line in lines {
        let text = line.text.trim_start_matches('\t');
        if let Some(value) = text.strip_prefix("BGP.next_hop:") {
            if let Some(route) = routes.last_mut() {
                route.next_hop = value.split_whitespace().next().and_then(|a| a.parse().ok());
            }
        } else if let Some(value) = text.strip_prefix("BGP.community:") {
            if let Some(route) = routes.last_mut() {
                route.communities = parse_communities(value);
            }
        } else if !line.text.starts_with('\t')
            && let Some((_, rest)) = text.split_once('[')
            && let Some(protocol) = rest.split_whitespace().next()
        {
            routes.push(RouteInfo { protocol: protocol.trim_end_matches(']').to_owned(), ..RouteInfo::default() });
        }
    }
    routes
}

/// `(65535,0) (64512,7)` → the pairs.
fn parse_communities(value: &str) -> Vec<(u16, u16)> {
    value
        .split(')')
        .filter_map(|c| {
            let (a, b) = c.trim().strip_prefix('(')?.split_once(',')?;
            Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use super::*;

    /// A reply BIRD 2.0.12 gave for a VIP this balancer announces and another balancer
    /// announces degraded (through the router's ADD-PATH).
    const SHOW_ROUTE: &str = "1007-Table spillway4:\n 10.100.0.1/32        blackhole [spillway_vips4 11:16:50.436] * (200)\n\
        1008-\tType: static univ\n1012-\tBGP.community: (65535,0)\n\
        1007-                     unicast [uplink 11:16:50.480 from 10.9.0.1] (100) [AS65001i]\n \tvia 10.9.0.3 on eth0\n\
        1008-\tType: BGP univ\n1012-\tBGP.origin: IGP\n \tBGP.as_path: 65000 65001\n \tBGP.next_hop: 10.9.0.3\n \
        \tBGP.local_pref: 100\n \tBGP.community: (65535,0) (64512,7)\n0000 \n";

    /// A fake BIRD answering each command with the next canned reply.
    fn fake(replies: Vec<&'static str>) -> (spillway_harness::tempdir::TempDir, PathBuf, std::thread::JoinHandle<Vec<String>>) {
        let dir = spillway_harness::tempdir::TempDir::new("bird");
        let path = dir.path().join("bird.ctl");
        let listener = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            let mut writer = conn.try_clone().unwrap();
            writer.write_all(b"0001 BIRD 2.0.12 ready.\n").unwrap();
            let mut commands = Vec::new();
            let mut reader = BufReader::new(conn);
            for reply in replies {
                let mut command = String::new();
                reader.read_line(&mut command).unwrap();
                commands.push(command.trim_end().to_owned());
                writer.write_all(reply.as_bytes()).unwrap();
            }
            commands
        });
        (dir, path, server)
    }

    #[test]
    fn parses_routes_with_their_protocol_next_hop_and_communities() {
        let (_dir, path, server) = fake(vec![SHOW_ROUTE, "8001 Network not found\n"]);
        let mut bird = Bird::connect(&path).unwrap();
        let routes = bird.routes("spillway4", "10.100.0.1".parse().unwrap()).unwrap();
        assert_eq!(
            routes,
            [
                RouteInfo { protocol: "spillway_vips4".into(), next_hop: None, communities: vec![(65535, 0)] },
                RouteInfo {
                    protocol: "uplink".into(),
                    next_hop: Some("10.9.0.3".parse().unwrap()),
                    communities: vec![(65535, 0), (64512, 7)]
                },
            ]
        );
        assert!(bird.routes("spillway6", "fd00::1".parse().unwrap()).unwrap().is_empty());
        assert_eq!(server.join().unwrap(), ["show route 10.100.0.1/32 table spillway4 all", "show route fd00::1/128 table spillway6 all"]);
    }

    #[test]
    fn configure_checks_first_and_a_refusal_carries_birds_message() {
        let ok = "0002-Reading configuration from /etc/bird/bird.conf\n0020 Configuration OK\n";
        let done = "0002-Reading configuration from /etc/bird/bird.conf\n0003 Reconfigured\n";
        let (_dir, path, server) = fake(vec![ok, done]);
        Bird::connect(&path).unwrap().configure().unwrap();
        assert_eq!(server.join().unwrap(), ["configure check", "configure"]);

        let refused = "0002-Reading configuration from /etc/bird/bird.conf\n8002 /run/x.conf:2:27 Symbol 'spillway4' already defined\n";
        let (_dir, path, server) = fake(vec![refused]);
        let err = Bird::connect(&path).unwrap().configure().unwrap_err();
        assert!(matches!(&err, BirdError::Refused { code: 8002, message } if message.contains("already defined")), "{err:?}");
        assert_eq!(server.join().unwrap(), ["configure check"], "a refused check loads nothing");
    }

    #[test]
    fn garbled_and_missing_sockets_are_errors() {
        let (_dir, path, _server) = fake(vec!["hello\n"]);
        let err = Bird::connect(&path).unwrap().command("show status").unwrap_err();
        assert!(matches!(err, BirdError::Garbled { .. }), "{err:?}");
        let err = Bird::connect(Path::new("/nonexistent/bird.ctl")).err().unwrap();
        assert!(matches!(err, BirdError::Connect { .. }), "{err:?}");
    }
}
