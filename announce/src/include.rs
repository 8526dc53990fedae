//! The BIRD configuration include `lbd` writes: one static protocol per family whose routes
//! are the announced VIP addresses (host routes, `blackhole` in BIRD's own table only). The
//! operator's `bird.conf` includes it and exports these protocols over BGP (README, "Running
//! a fleet"). It is the one record of what is announced: BIRD reads it again at every start,
//! and a starting `lbd` takes it over, so neither restarting changes what the routers see.

use std::{
    fs,
    io::{self, Write},
    net::IpAddr,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

/// The static protocols the include defines, and the BIRD tables they fill (which the
/// operator's configuration declares and gives to its BGP sessions).
pub const PROTOCOL4: &str = "spillway_vips4";
pub const PROTOCOL6: &str = "spillway_vips6";
pub const TABLE4: &str = "spillway4";
pub const TABLE6: &str = "spillway6";
/// RFC 8326 GRACEFUL_SHUTDOWN: routers honouring it prefer every other path.
pub const GRACEFUL_SHUTDOWN: (u16, u16) = (65535, 0);

#[derive(Debug, thiserror::Error)]
pub enum IncludeError {
    #[error("reading {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("writing {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The include's text for `routes` (address, degraded), in address order.
pub fn render(routes: &[(IpAddr, bool)]) -> String {
    let mut out = String::from(
        "# Written by lbd (Spillway); do not edit. The VIP addresses this balancer announces:\n\
         # include this file in bird.conf and export these protocols over BGP. A degraded\n\
         # address carries GRACEFUL_SHUTDOWN (65535, 0): routers configured for it prefer\n\
         # the other balancers' paths.\n",
    );
    for (protocol, table, v4) in [(PROTOCOL4, TABLE4, true), (PROTOCOL6, TABLE6, false)] {
        let family = if v4 { "ipv4" } else { "ipv6" };
        out.push_str(&format!("protocol static {protocol} {{\n  {family} {{ table {table}; }};\n"));
        let mut mine: Vec<&(IpAddr, bool)> = routes.iter().filter(|(a, _)| a.is_ipv4() == v4).collect();
        mine.sort();
        for (addr, degraded) in mine {
            let len = if v4 { 32 } else { 128 };
            let (asn, value) = GRACEFUL_SHUTDOWN;
            let attrs = if *degraded { format!(" {{ bgp_community.add(({asn}, {value})); }}") } else { String::new() };
            out.push_str(&format!("  route {addr}/{len} blackhole{attrs};\n"));
        }
        out.push_str("}\n");
    }
    out
}

/// The routes (address, degraded) a file written by [`render`] announces; other lines
/// are ignored.
pub fn parse(text: &str) -> Vec<(IpAddr, bool)> {
    text.lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix("route ")?;
            let (addr, _) = rest.split_once('/')?;
            Some((addr.parse().ok()?, rest.contains("bgp_community.add")))
        })
        .collect()
}

/// The include's current text (`None`: no file yet).
pub fn read(path: &Path) -> Result<Option<String>, IncludeError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(IncludeError::Read { path: path.to_owned(), source }),
    }
}

/// Replaces the include atomically (temporary file, fsync, rename). World-readable: BIRD
/// usually runs as its own user, and the file holds nothing secret.
pub fn write(path: &Path, text: &str) -> Result<(), IncludeError> {
    let error = |source| IncludeError::Write { path: path.to_owned(), source };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        fs::DirBuilder::new().recursive(true).create(dir).map_err(error)?;
        // Not lbd's umask: BIRD's user must reach the file.
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).map_err(error)?;
    }
    let tmp = path.with_extension("tmp");
    let mut file = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o644).open(&tmp).map_err(error)?;
    // The mode is masked by lbd's umask on creation; set it explicitly.
    file.set_permissions(fs::Permissions::from_mode(0o644)).map_err(error)?;
    file.write_all(text.as_bytes()).and_then(|()| file.sync_all()).map_err(error)?;
    fs::rename(&tmp, path).map_err(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_both_families_sorted_and_parses_back() {
        let routes =
            vec![("fd00:100::1".parse().unwrap(), false), ("10.100.0.2".parse().unwrap(), true), ("10.100.0.1".parse().unwrap(), false)];
        let text = render(&routes);
        assert!(
            text.contains(
                "protocol static spillway_vips4 {\n  ipv4 { table spillway4; };\n  route 10.100.0.1/32 blackhole;\n  \
             route 10.100.0.2/32 blackhole { bgp_community.add((65535, 0)); };\n}\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("protocol static spillway_vips6 {\n  ipv6 { table spillway6; };\n  route fd00:100::1/128 blackhole;\n}\n"),
            "{text}"
        );
        let mut parsed = parse(&text);
        parsed.sort();
        let mut want = routes;
        want.sort();
        assert_eq!(parsed, want);
        // Nothing announced still defines both protocols (the operator's filters name them).
        assert!(parse(&render(&[])).is_empty());
        assert!(render(&[]).contains("protocol static spillway_vips6"));
    }

    #[test]
    fn written_atomically_and_readable_by_bird() {
        let dir = spillway_harness::tempdir::TempDir::new("include");
        let path = dir.path().join("bird").join("vips.conf");
        assert_eq!(read(&path).unwrap(), None);
        write(&path, "one").unwrap();
        write(&path, "two").unwrap();
        assert_eq!(read(&path).unwrap().as_deref(), Some("two"));
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o644);
        assert!(!path.with_extension("tmp").exists());
        assert_eq!(fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o755, "BIRD's user reads it");
    }
}
