//! What the end-to-end and fleet scenarios both read of a balancer through `lbctl -o json`,
//! written once: a [`Cluster`]'s `lbd` and a fleet's [`Balancer`] both answer.

use anyhow::Result;
use serde_json::Value;

use crate::cluster::Cluster;
use crate::fleet::Balancer;

/// One `lbd` that `lbctl ... -o json` can ask.
pub trait LbctlJson {
    /// Runs `lbctl ... -o json` and parses the output.
    fn lbctl_json(&self, args: &[&str]) -> Result<Value>;
}

impl LbctlJson for Cluster {
    fn lbctl_json(&self, args: &[&str]) -> Result<Value> {
        Cluster::lbctl_json(self, args)
    }
}

impl LbctlJson for Balancer {
    fn lbctl_json(&self, args: &[&str]) -> Result<Value> {
        Balancer::lbctl_json(self, args)
    }
}

/// A verdict counter of `lbctl stats` (a reason, or an observed would-drop); panics if
/// there is no such counter.
pub fn reason_count(lb: &impl LbctlJson, label: &str) -> u64 {
    let stats = lb.lbctl_json(&["stats"]).unwrap();
    let find = |list: &Value, key: &str| {
        list.as_array().and_then(|l| l.iter().find(|r| r[key] == label)).and_then(|r| r["packets"].as_u64().or(r["count"].as_u64()))
    };
    find(&stats["reasons"], "reason")
        .or_else(|| find(&stats["observed"], "reason"))
        .unwrap_or_else(|| panic!("no counter {label} in {stats}"))
}

/// The VIP as `lbctl vips list -o json` shows it.
pub fn vip_json(lb: &impl LbctlJson, vip: &str) -> Value {
    let list = lb.lbctl_json(&["vips", "list"]).unwrap();
    list["vips"].as_array().unwrap().iter().find(|v| v["vip"] == vip).cloned().unwrap_or_else(|| panic!("{vip} not in {list}"))
}
