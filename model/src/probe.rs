//! What a backend is probed with: persisted in `lbd`'s state and sent over its API as small,
//! self-describing JSON, e.g. `{"kind":"tcp"}`, `{"kind":"http","path":"/healthz"}` or
//! `{"kind":"udp","payload":"0a0b","expect":"0c"}`; and what one probe found out
//! ([`ProbeOutcome`]), which the probes produce and the health policy consumes.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

/// Longest UDP payload (and expected reply prefix): well inside one datagram on any path.
pub const MAX_PAYLOAD: usize = 512;
/// Longest HTTP path and Host header we send: a health check needs no more.
const MAX_PATH: usize = 1024;
const MAX_HOST: usize = 255;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ProbeSpec {
    /// A TCP connect. (A struct variant: serde lets unit variants ignore unknown fields.)
    Tcp {},
    /// `GET path` over HTTP/1.1 (over TLS when `tls`), passing on status `expect_status`.
    Http {
        #[serde(default = "default_path")]
        path: String,
        #[serde(default = "default_status")]
        expect_status: u16,
        /// The Host header (and the TLS server name when it is a DNS name); the target's
        /// address when unset.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host: Option<String>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        tls: bool,
    },
    /// One datagram `payload`; passes on a reply starting with `expect` (any reply when unset).
    Udp {
        payload: Hex,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expect: Option<Hex>,
    },
}

/// Which way a VIP's backends are probed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ProbePath {
    /// To the backend's own address (or its probe target), as the kernel routes it: proves
    /// the host and service are up. For backends that do not serve the VIP by direct server
    /// return.
    Direct,
    /// To the VIP, encapsulated to the backend exactly as the VIP's traffic is: proves the
    /// backend serves the VIP (VIP on its `lo`, decapsulation, the service listening on the
    /// VIP), with a direct probe beside it to tell a broken VIP path from a dead backend.
    #[default]
    Tunnel,
}

impl ProbePath {
    pub const fn as_str(self) -> &'static str {
        match self {
            ProbePath::Direct => "direct",
            ProbePath::Tunnel => "tunnel",
        }
    }

    pub fn is_tunnel(&self) -> bool {
        *self == ProbePath::Tunnel
    }
}

impl fmt::Display for ProbePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Default for ProbeSpec {
    fn default() -> Self {
        ProbeSpec::Tcp {}
    }
}

fn default_path() -> String {
    "/".to_owned()
}

const fn default_status() -> u16 {
    200
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ProbeSpecError {
    #[error("probe kind: unknown {0:?} (one of tcp, http, https, udp)")]
    UnknownKind(String),
    #[error("probe {option}: not an option of {kind} probes")]
    NotForKind { option: &'static str, kind: String },
    #[error("probe payload: required by udp probes")]
    MissingPayload,
    #[error("probe {field}: {problem}")]
    Invalid { field: &'static str, problem: String },
}

impl ProbeSpecError {
    /// The field (option) the problem is about.
    pub fn field(&self) -> &'static str {
        match self {
            Self::UnknownKind(_) => "kind",
            Self::NotForKind { option, .. } => option,
            Self::MissingPayload => "payload",
            Self::Invalid { field, .. } => field,
        }
    }
}

impl ProbeSpec {
    /// Checks what serde cannot: lengths, ranges and what may go into a request line.
    pub fn validate(&self) -> Result<(), ProbeSpecError> {
        let invalid = |field, problem: &str| Err(ProbeSpecError::Invalid { field, problem: problem.to_owned() });
        match self {
            ProbeSpec::Tcp {} => Ok(()),
            ProbeSpec::Http { path, expect_status, host, tls: _ } => {
                if !path.starts_with('/') {
                    return invalid("path", "must start with '/'");
                }
                if path.len() > MAX_PATH || !is_token(path) {
                    return invalid("path", &format!("must be at most {MAX_PATH} visible ASCII characters (no spaces)"));
                }
                if !(100..=599).contains(expect_status) {
                    return invalid("expect_status", "must be in 100..=599");
                }
                match host {
                    Some(host) if host.is_empty() || host.len() > MAX_HOST || !is_token(host) => {
                        invalid("host", &format!("must be 1 to {MAX_HOST} visible ASCII characters (no spaces, CR or LF)"))
                    }
                    _ => Ok(()),
                }
            }
            ProbeSpec::Udp { payload, expect } => {
                if payload.0.len() > MAX_PAYLOAD {
                    return invalid("payload", &format!("longer than {MAX_PAYLOAD} bytes"));
                }
                match expect {
                    Some(expect) if expect.0.is_empty() => invalid("expect", "empty (leave it out to accept any reply)"),
                    Some(expect) if expect.0.len() > MAX_PAYLOAD => invalid("expect", &format!("longer than {MAX_PAYLOAD} bytes")),
                    _ => Ok(()),
                }
            }
        }
    }

    /// A validated spec from command-line options: `kind` is `tcp`, `http`, `https` or `udp`;
    /// an option that `kind` does not take is refused by name. HTTP defaults to `GET /`
    /// expecting 200.
    pub fn from_parts(
        kind: &str,
        path: Option<String>,
        expect_status: Option<u16>,
        host: Option<String>,
        payload: Option<String>,
        expect: Option<String>,
    ) -> Result<Self, ProbeSpecError> {
        let allowed: &[&str] = match kind {
            "tcp" => &[],
            "http" | "https" => &["path", "expect_status", "host"],
            "udp" => &["payload", "expect"],
            other => return Err(ProbeSpecError::UnknownKind(other.to_owned())),
        };
        let given = [
            ("path", path.is_some()),
            ("expect_status", expect_status.is_some()),
            ("host", host.is_some()),
            ("payload", payload.is_some()),
            ("expect", expect.is_some()),
        ];
        if let Some((option, _)) = given.into_iter().find(|(option, set)| *set && !allowed.contains(option)) {
            return Err(ProbeSpecError::NotForKind { option, kind: kind.to_owned() });
        }
        let hex = |field, text: String| text.parse::<Hex>().map_err(|e| ProbeSpecError::Invalid { field, problem: e.to_string() });
        let spec = match kind {
            "tcp" => ProbeSpec::Tcp {},
            "udp" => ProbeSpec::Udp {
                payload: hex("payload", payload.ok_or(ProbeSpecError::MissingPayload)?)?,
                expect: expect.map(|text| hex("expect", text)).transpose()?,
            },
            _ => ProbeSpec::Http {
                path: path.unwrap_or_else(default_path),
                expect_status: expect_status.unwrap_or(default_status()),
                host,
                tls: kind == "https",
            },
        };
        spec.validate()?;
        Ok(spec)
    }
}

/// Visible ASCII only: nothing that could end a request line or header (CR, LF, space).
fn is_token(text: &str) -> bool {
    text.bytes().all(|b| b.is_ascii_graphic())
}

/// Bytes written as lowercase hex in JSON and on the command line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hex(pub Vec<u8>);

#[derive(Debug, Error, PartialEq, Eq)]
#[error("not hex (an even number of digits 0-9, a-f)")]
pub struct NotHex;

impl FromStr for Hex {
    type Err = NotHex;

    fn from_str(text: &str) -> Result<Self, NotHex> {
        if !text.len().is_multiple_of(2) {
            return Err(NotHex);
        }
        let digit = |b: u8| (b as char).to_digit(16).ok_or(NotHex);
        text.as_bytes().chunks(2).map(|pair| Ok((digit(pair[0])? * 16 + digit(pair[1])?) as u8)).collect::<Result<_, _>>().map(Hex)
    }
}

impl fmt::Display for Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl Serialize for Hex {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Hex {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?.parse().map_err(serde::de::Error::custom)
    }
}

/// What one probe found out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The backend answered correctly in `latency_us` (microseconds: a probe on a LAN takes
    /// a fraction of a millisecond).
    Success { latency_us: u64 },
    /// The backend answered wrongly or refused (`reason` is for the logs).
    Failure { reason: String },
    /// No answer within `timeout_ms`.
    Timeout,
    /// The probe through the tunnel to the VIP failed (`tunnel` says how: `timeout`,
    /// `refused`, ...) while a direct probe of the backend's own address passed: the host is
    /// up but does not serve the VIP (VIP missing from its `lo`, decapsulation detached,
    /// its `rp_filter`, a service listening on its own address only).
    VipPathFailed { tunnel: String },
    /// The LB itself could not probe (no ephemeral port, no memory, no route of its own):
    /// says nothing about the backend, so it never changes the backend's state or streaks.
    Unknown,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(path: &str, expect_status: u16, host: Option<&str>) -> ProbeSpec {
        ProbeSpec::Http { path: path.to_owned(), expect_status, host: host.map(str::to_owned), tls: false }
    }

    #[test]
    fn json_is_small_and_round_trips() {
        let cases = [
            (ProbeSpec::Tcp {}, r#"{"kind":"tcp"}"#),
            (http("/", 200, None), r#"{"kind":"http","path":"/","expect_status":200}"#),
            (
                ProbeSpec::Http { path: "/h".into(), expect_status: 204, host: Some("a.example".into()), tls: true },
                r#"{"kind":"http","path":"/h","expect_status":204,"host":"a.example","tls":true}"#,
            ),
            (ProbeSpec::Udp { payload: Hex(vec![0x0a, 0xff]), expect: None }, r#"{"kind":"udp","payload":"0aff"}"#),
            (ProbeSpec::Udp { payload: Hex(vec![]), expect: Some(Hex(vec![1])) }, r#"{"kind":"udp","payload":"","expect":"01"}"#),
        ];
        for (spec, json) in cases {
            assert_eq!(serde_json::to_string(&spec).unwrap(), json);
            assert_eq!(serde_json::from_str::<ProbeSpec>(json).unwrap(), spec);
        }
    }

    #[test]
    fn json_defaults_and_refusals() {
        assert_eq!(serde_json::from_str::<ProbeSpec>(r#"{"kind":"http"}"#).unwrap(), http("/", 200, None));
        assert_eq!(
            serde_json::from_str::<ProbeSpec>(r#"{"kind":"udp","payload":"0A"}"#).unwrap(),
            ProbeSpec::Udp { payload: Hex(vec![10]), expect: None }
        );
        for bad in [
            r#"{"kind":"tcp","path":"/"}"#,
            r#"{"kind":"http","payload":"00"}"#,
            r#"{"kind":"udp"}"#,
            r#"{"kind":"udp","payload":"abc"}"#,
            r#"{"kind":"udp","payload":"zz"}"#,
            r#"{"kind":"icmp"}"#,
            r#"{}"#,
        ] {
            assert!(serde_json::from_str::<ProbeSpec>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn validation_names_the_field() {
        let message = |spec: ProbeSpec| spec.validate().unwrap_err().to_string();
        assert_eq!(message(http("health", 200, None)), "probe path: must start with '/'");
        assert!(message(http("/a b", 200, None)).starts_with("probe path: "));
        assert_eq!(message(http("/", 99, None)), "probe expect_status: must be in 100..=599");
        assert_eq!(message(http("/", 600, None)), "probe expect_status: must be in 100..=599");
        assert!(message(http("/", 200, Some("a\r\nX-Evil: 1"))).starts_with("probe host: "));
        assert!(message(http("/", 200, Some(""))).starts_with("probe host: "));
        let udp = |payload: usize, expect: Option<usize>| ProbeSpec::Udp {
            payload: Hex(vec![0; payload]),
            expect: expect.map(|n| Hex(vec![0; n])),
        };
        assert_eq!(message(udp(MAX_PAYLOAD + 1, None)), "probe payload: longer than 512 bytes");
        assert!(message(udp(1, Some(0))).starts_with("probe expect: empty"));
        for ok in
            [ProbeSpec::Tcp {}, http("/healthz?full=1", 599, Some("svc.example:8443")), udp(MAX_PAYLOAD, Some(MAX_PAYLOAD)), udp(0, None)]
        {
            assert_eq!(ok.validate(), Ok(()), "{ok:?}");
        }
    }

    #[test]
    fn from_parts_builds_each_kind_and_refuses_foreign_options() {
        let s = |v: &str| Some(v.to_owned());
        assert_eq!(ProbeSpec::from_parts("tcp", None, None, None, None, None), Ok(ProbeSpec::Tcp {}));
        assert_eq!(ProbeSpec::from_parts("http", None, None, None, None, None), Ok(http("/", 200, None)));
        assert_eq!(
            ProbeSpec::from_parts("https", s("/h"), Some(204), s("a.example"), None, None),
            Ok(ProbeSpec::Http { path: "/h".into(), expect_status: 204, host: s("a.example"), tls: true })
        );
        assert_eq!(
            ProbeSpec::from_parts("udp", None, None, None, s("0102"), s("03")),
            Ok(ProbeSpec::Udp { payload: Hex(vec![1, 2]), expect: Some(Hex(vec![3])) })
        );
        let error = |kind, path, status, host, payload, expect| {
            ProbeSpec::from_parts(kind, path, status, host, payload, expect).unwrap_err().to_string()
        };
        assert_eq!(error("tcp", s("/"), None, None, None, None), "probe path: not an option of tcp probes");
        assert_eq!(error("tcp", None, None, None, None, s("00")), "probe expect: not an option of tcp probes");
        assert_eq!(error("https", None, None, None, s("00"), None), "probe payload: not an option of https probes");
        assert_eq!(error("udp", None, Some(200), None, s("00"), None), "probe expect_status: not an option of udp probes");
        assert_eq!(error("udp", None, None, None, None, None), "probe payload: required by udp probes");
        assert_eq!(error("udp", None, None, None, s("0g"), None), "probe payload: not hex (an even number of digits 0-9, a-f)");
        assert_eq!(error("udp", None, None, None, s("00"), s("1")), "probe expect: not hex (an even number of digits 0-9, a-f)");
        assert_eq!(error("http", s("x"), None, None, None, None), "probe path: must start with '/'");
        assert_eq!(error("ping", None, None, None, None, None), "probe kind: unknown \"ping\" (one of tcp, http, https, udp)");
    }
}
