//! Telling `lbd` that a port report comes from the backend's own agent.
//!
//! The port the agent serves on is an ordinary TCP port: an unprivileged user of the backend
//! who binds it first, or anyone on the path, could otherwise answer `lbd`'s polls and move
//! the backend's weight. So both read one shared secret from a root-only file
//! (`--report-key`, [`ReportKey::load`]), and every poll carries a fresh random nonce
//! ([`NONCE_HEADER`]); the agent answers with HMAC-SHA256 over the nonce, the address `lbd`
//! dialled (the connection's local address on the agent) and the body ([`SIGNATURE_HEADER`]).
//! The nonce makes a recorded answer useless for the next poll (no clock to agree on), and
//! the address makes one backend's answer useless for another's poll. A fleet shares the
//! key: root on one backend could still sign for another (see README, "Security").

use std::{
    io::Read,
    net::IpAddr,
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use ring::{
    hmac,
    rand::{SecureRandom, SystemRandom},
};

/// The request header carrying `lbd`'s nonce.
pub const NONCE_HEADER: &str = "X-Spillway-Nonce";
/// The response header carrying the agent's signature (hex).
pub const SIGNATURE_HEADER: &str = "X-Spillway-Signature";
/// Fewer bytes than this in a key file are refused: a short secret can be guessed.
pub const MIN_KEY_BYTES: usize = 32;
/// The most a key file may hold.
const MAX_KEY_BYTES: u64 = 4096;
/// Random bytes in a nonce (hex on the wire).
const NONCE_BYTES: usize = 16;
/// Separates this use of the key from any other, and versions the message.
const CONTEXT: &[u8] = b"spillway-ports-v1";

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("reading the report key {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("refusing the report key {}: it is {what}; it must be a regular file of root's with mode 0600 (chown root, chmod 600)", path.display())]
    Unsafe { path: PathBuf, what: String },
    #[error("the report key {} holds {len} bytes (without surrounding white space): at least {MIN_KEY_BYTES} are needed, e.g. from head -c 32 /dev/urandom | base64", path.display())]
    TooShort { path: PathBuf, len: usize },
}

/// The shared secret of `lbd` and the agents.
pub struct ReportKey(hmac::Key);

impl ReportKey {
    /// Reads the key file: a regular file owned by root and readable by nobody else (checked
    /// on the opened file, so it cannot be swapped in between), its bytes without
    /// surrounding white space.
    pub fn load(path: &Path) -> Result<ReportKey, KeyError> {
        let read = |source| KeyError::Read { path: path.to_owned(), source };
        let unsafe_key = |what: String| KeyError::Unsafe { path: path.to_owned(), what };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| if e.raw_os_error() == Some(libc::ELOOP) { unsafe_key("a symbolic link".to_owned()) } else { read(e) })?;
        let meta = file.metadata().map_err(read)?;
        if !meta.file_type().is_file() {
            return Err(unsafe_key("not a regular file".to_owned()));
        }
        if meta.uid() != 0 {
            return Err(unsafe_key(format!("owned by uid {}", meta.uid())));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(unsafe_key(format!("mode {:04o}", meta.mode() & 0o7777)));
        }
        let mut bytes = Vec::new();
        file.take(MAX_KEY_BYTES).read_to_end(&mut bytes).map_err(read)?;
        let secret = bytes.trim_ascii();
        if secret.len() < MIN_KEY_BYTES {
            return Err(KeyError::TooShort { path: path.to_owned(), len: secret.len() });
        }
        Ok(ReportKey(hmac::Key::new(hmac::HMAC_SHA256, secret)))
    }

    /// A key from its secret, without a file: for tests and the fuzz target (feature
    /// `fuzzing`), never for `lbd`, whose key must come from a root-only file.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn from_secret(secret: &[u8]) -> ReportKey {
        ReportKey(hmac::Key::new(hmac::HMAC_SHA256, secret))
    }

    fn tag(&self, nonce: &str, agent: IpAddr, body: &[u8]) -> hmac::Tag {
        let mut context = hmac::Context::with_key(&self.0);
        for part in [CONTEXT, nonce.as_bytes(), agent.to_canonical().to_string().as_bytes()] {
            context.update(part);
            context.update(&[0]);
        }
        context.update(body);
        context.sign()
    }

    /// The agent's signature of `body` for the poll with `nonce` that reached it at `agent`.
    pub fn sign(&self, nonce: &str, agent: IpAddr, body: &[u8]) -> String {
        hex(self.tag(nonce, agent, body).as_ref())
    }

    /// Whether `signature` is [`sign`](Self::sign)'s for these (compared in constant time).
    pub fn verify(&self, nonce: &str, agent: IpAddr, body: &[u8], signature: &str) -> bool {
        let expected = self.tag(nonce, agent, body);
        let expected = expected.as_ref();
        // Every byte compared, whatever differs first: the time says nothing of the tag.
        unhex(signature)
            .is_some_and(|tag| tag.len() == expected.len() && tag.iter().zip(expected).fold(0, |diff, (a, b)| diff | (a ^ b)) == 0)
    }
}

/// A fresh nonce for one poll (hex), or `None` if the system's random source failed.
pub fn nonce() -> Option<String> {
    let mut bytes = [0u8; NONCE_BYTES];
    SystemRandom::new().fill(&mut bytes).ok()?;
    Some(hex(&bytes))
}

/// Whether `nonce` looks like one of [`nonce`]'s (what the agent accepts to sign).
pub fn is_nonce(nonce: &str) -> bool {
    nonce.len() == 2 * NONCE_BYTES && nonce.bytes().all(|b| b.is_ascii_hexdigit())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn key_file(dir: &Path, contents: &str, mode: u32) -> PathBuf {
        let path = dir.join(format!("key-{mode:o}-{}", contents.len()));
        std::fs::write(&path, contents).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    fn tempdir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("spillway-auth-{}-{:?}", std::process::id(), std::thread::current().id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    const SECRET: &str = "0123456789abcdef0123456789abcdef\n";

    #[test]
    fn a_key_is_read_only_from_a_root_only_file() {
        let dir = tempdir();
        assert!(ReportKey::load(&key_file(&dir, SECRET, 0o600)).is_ok());
        assert!(ReportKey::load(&key_file(&dir, SECRET, 0o400)).is_ok());
        for mode in [0o640, 0o604, 0o666] {
            let err = ReportKey::load(&key_file(&dir, SECRET, mode)).err().unwrap().to_string();
            assert!(err.contains(&format!("mode {mode:04o}")) && err.contains("chmod 600"), "{err}");
        }
        let link = dir.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(key_file(&dir, SECRET, 0o600), &link).unwrap();
        assert!(ReportKey::load(&link).err().unwrap().to_string().contains("a symbolic link"));
        assert!(ReportKey::load(&dir).err().unwrap().to_string().contains("not a regular file"));
        let err = ReportKey::load(&key_file(&dir, "short\n", 0o600)).err().unwrap().to_string();
        assert!(err.contains("holds 5 bytes"), "{err}");
        assert!(matches!(ReportKey::load(&dir.join("missing")), Err(KeyError::Read { .. })));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_signature_holds_for_its_nonce_address_and_body_only() {
        let dir = tempdir();
        let key = ReportKey::load(&key_file(&dir, SECRET, 0o600)).unwrap();
        let other = ReportKey::load(&key_file(&dir, &SECRET.replace('0', "1"), 0o600)).unwrap();
        let (n, agent) = (nonce().unwrap(), IpAddr::from([10, 0, 1, 11]));
        assert!(is_nonce(&n) && n != nonce().unwrap());
        let signature = key.sign(&n, agent, b"{}");
        assert!(key.verify(&n, agent, b"{}", &signature));
        let mapped: IpAddr = "::ffff:10.0.1.11".parse().unwrap();
        assert!(key.verify(&n, mapped, b"{}", &signature), "a dual-stack listener sees the IPv4-mapped address");
        assert!(!key.verify(&nonce().unwrap(), agent, b"{}", &signature), "replayed to another poll");
        assert!(!key.verify(&n, IpAddr::from([10, 0, 1, 12]), b"{}", &signature), "another backend's answer");
        assert!(!key.verify(&n, agent, b"{ }", &signature), "another body");
        assert!(!other.verify(&n, agent, b"{}", &signature), "another key");
        assert!(!key.verify(&n, agent, b"{}", "zz") && !key.verify(&n, agent, b"{}", ""));
        let _ = std::fs::remove_dir_all(dir);
    }
}
