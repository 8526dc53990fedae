//! The `lbctl` binary on its own, without an `lbd`: refusals that name what is wrong and the
//! exit statuses scripts rely on. (That it reaches neither aya nor tokio is the architecture
//! check's `KEPT_APART`.) These tests also make `cargo test` build `lbctl`, which the
//! daemon's integration tests run from beside `lbd`.

use std::process::{Command, Output};

const LBCTL: &str = env!("CARGO_BIN_EXE_lbctl");

fn lbctl(args: &[&str]) -> Output {
    Command::new(LBCTL).args(args).env_remove("SPILLWAY_API").output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn no_lbd_behind_the_socket_is_an_error_naming_the_socket() {
    let out = lbctl(&["status", "--api", "/nonexistent/spillway/api.sock"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("/nonexistent/spillway/api.sock"), "{}", stderr(&out));
}

#[test]
fn a_malformed_vip_is_refused_naming_it() {
    let out = lbctl(&["vips", "add", "10.0.0.1:http/tcp", "--api", "/nonexistent/api.sock"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("10.0.0.1:http/tcp"), "{}", stderr(&out));
}

#[test]
fn diff_reports_trouble_as_two_not_as_a_difference() {
    let out = lbctl(&["diff", "-f", "/nonexistent/spillway.toml", "--api", "/nonexistent/api.sock"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}
