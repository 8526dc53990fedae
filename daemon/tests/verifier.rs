//! Every program stays within its verifier budget (`spillway_dataplane::verifier::BUDGETS`),
//! and its count is data: `xdp-ebpf/verifier-counts.json` records each program's processed
//! instructions on the kernel named there. A change that multiplies the verifier's walk fails
//! here, long before the kernel's 1M limit refuses the program at load; a change that moves a
//! count by more than a tenth on the recorded kernel fails until the file is recorded again
//! (`SPILLWAY_RECORD_VERIFIER=1 cargo test -p spillway-daemon --test verifier`), so the
//! cost of a change to the data path shows in its diff. Needs root.

use std::{collections::BTreeMap, path::PathBuf};

use serde_json::{Value, json};
use spillway_dataplane::verifier::{BUDGETS, verified_insns};

/// How far a count may move on the recorded kernel before the record must be renewed.
const DRIFT: f64 = 0.10;

fn record_file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../xdp-ebpf/verifier-counts.json")
}

/// `major.minor` of the running kernel.
fn kernel() -> String {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    release.trim().split('.').take(2).collect::<Vec<_>>().join(".")
}

#[test]
fn every_program_stays_within_its_budget_and_its_recorded_count() {
    let counts: BTreeMap<&str, u32> = verified_insns()
        .unwrap()
        .into_iter()
        .map(|(name, count)| (name, count.unwrap_or_else(|| panic!("the kernel does not report {name}'s verified_insns"))))
        .collect();
    if std::env::var_os("SPILLWAY_RECORD_VERIFIER").is_some() {
        let record = json!({ "kernel": kernel(), "counts": counts });
        std::fs::write(record_file(), format!("{}\n", serde_json::to_string_pretty(&record).unwrap())).unwrap();
    }
    let record: Value = serde_json::from_str(&std::fs::read_to_string(record_file()).unwrap()).unwrap();
    let same_kernel = record["kernel"].as_str() == Some(kernel().as_str());
    let mut problems = Vec::new();
    for (name, budget) in BUDGETS {
        let count = counts[name];
        let recorded = record["counts"][name].as_u64();
        println!("{name}: {count} verified instructions (budget {budget}, recorded {recorded:?} on {})", record["kernel"]);
        if count > budget {
            problems.push(format!("{name}: {count} > its budget {budget}"));
        }
        match recorded {
            None => problems.push(format!("{name} has no recorded count")),
            Some(recorded) if same_kernel && (f64::from(count) - recorded as f64).abs() > DRIFT * recorded as f64 => {
                problems.push(format!("{name}: {count}, recorded {recorded}: record it again if the change is meant"))
            }
            Some(_) => {}
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("; "));
}
