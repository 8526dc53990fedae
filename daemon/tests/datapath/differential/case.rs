//! A case: a declared state (and the one before it), the config knobs the model covers, and the frames sent with the
//! clock's steps between them. Cases found by the fuzzer are kept, minimized, as JSON files in
//! `cases/` and replayed by `kept_cases_agree`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use spillway_model::DesiredState;

/// Where the next hop sends: the static one (`lbd --static-nexthop`) back out of the ingress
/// (XDP_TX), to an interface of the redirect map, or to one outside it (the kernel forwards);
/// or the one the packet lab's routes give.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Egress {
    Ingress,
    TxPort,
    Kernel,
    Routes,
}

/// The balancer's config as a case sets it (the rest is fixed: see `Lab::configure`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Knobs {
    pub hostmask_v4: u32,
    pub hostmask_v6: u32,
    /// Host order.
    pub gue_port: u16,
    pub egress: Egress,
    pub table_seed: u32,
    pub tcp_idle_timeout_s: u32,
    pub udp_idle_timeout_s: u32,
    /// Echo answers a second per source and in all (`lbd --echo-per-source`, `--echo-total`).
    #[serde(default)]
    pub echo_per_source: u32,
    #[serde(default)]
    pub echo_total: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// How far the frozen clock moves before the frame.
    pub advance_ms: u64,
    /// A new declared state, applied before the frame (the connection table keeps its
    /// entries, and changed VIPs get a second-chance table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declare: Option<DesiredState>,
    #[serde(with = "hex")]
    pub frame: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Case {
    /// What the case found, for whoever reads the file.
    #[serde(default)]
    pub found: String,
    /// Declared first, so that the VIPs whose tables `state` changes have a second-chance
    /// table (the table before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<DesiredState>,
    pub state: DesiredState,
    pub knobs: Knobs,
    pub steps: Vec<Step>,
}

/// The kept cases' folder.
pub fn folder() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/datapath/differential/cases")
}

/// Every kept case, by file name.
pub fn kept() -> Vec<(String, Case)> {
    let mut files: Vec<_> =
        std::fs::read_dir(folder()).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "json")).collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let case = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (path.file_name().unwrap().to_string_lossy().into_owned(), case)
        })
        .collect()
}

/// Writes `case` as a new kept case; returns its path.
pub fn keep(case: &Case, seed: u64) -> PathBuf {
    let path = folder().join(format!("found-{seed:016x}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(case).unwrap() + "\n").unwrap();
    path
}

/// Frames as hex strings, so a case reads (and diffs) as text.
mod hex {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        if text.len() % 2 != 0 {
            return Err(D::Error::custom("odd number of hex digits"));
        }
        (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).map_err(D::Error::custom)).collect()
    }
}
