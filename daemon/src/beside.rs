//! Running beside other XDP programs on the interface's one hook: the balancer attached
//! nowhere, its entry program pinned for the operator's root program (`--xdp-attach none`,
//! `--root-array`), and the frames it does not serve handed on to the operator's program
//! (`--pass-to`). The kernel side is `spillway_dataplane::{entry, pass_to}`.

use std::path::Path;

use spillway_dataplane::entry::{self, EntryError};
use spillway_dataplane::pass_to::{Followed, PassTo, PassToError};
use spillway_dataplane::pins::PinLayout;
use spillway_dataplane::uplinks::Uplinks;
use spillway_dataplane::{Balancer, DataplaneError};
use spillway_logging::{error_chain, event};

use crate::args::{DaemonArgs, XdpAttach};
use crate::core::Counters;
use crate::server::{self, SharedCore};
use crate::store::Store;
use spillway_reconcile::Maps;

#[derive(Debug, thiserror::Error)]
pub enum BesideError {
    #[error("--root-array needs --xdp-attach none: attached to the interface, the balancer is no root program's to call")]
    RootArrayAttached,
    #[error("--root-index names a slot of --root-array, which is not set")]
    RootIndexAlone,
    #[error(transparent)]
    Entry(#[from] EntryError),
    #[error(transparent)]
    PassTo(#[from] PassToError),
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
}

/// Refuses options that contradict each other, before anything changes.
pub fn check_args(args: &DaemonArgs) -> Result<(), BesideError> {
    if args.root_array.is_some() && args.xdp_attach == XdpAttach::Interface {
        return Err(BesideError::RootArrayAttached);
    }
    if args.root_array.is_none() && args.root_index != 0 {
        return Err(BesideError::RootIndexAlone);
    }
    Ok(())
}

/// `--xdp-attach none`: pins the entry program (and puts it in `--root-array`), attaching
/// nothing.
pub fn go_live_unattached(uplinks: &mut Uplinks, args: &DaemonArgs, layout: &PinLayout, iface: &str) -> Result<(), BesideError> {
    entry::refuse_pinned_links(layout)?;
    let path = layout.entry_program();
    let program = uplinks.program()?;
    entry::pin_entry(program, &path)?;
    let program_id = program.info().map(|i| i.id()).unwrap_or_default();
    match &args.root_array {
        Some(array) => {
            entry::fill_root_slot(program, array, args.root_index)?;
            event!(
                info,
                "entry_program_pinned",
                path = path.display(),
                program_id = program_id,
                root_array = array.display(),
                root_index = args.root_index,
                message = format!("attached to no interface; your root program on {iface} tail-calls it from its program array")
            );
        }
        None => event!(
            info,
            "entry_program_pinned",
            path = path.display(),
            program_id = program_id,
            message = format!(
                "attached to no interface: put it in your root program's program array on {iface} \
                 (bpftool map update pinned ARRAY key INDEX 0 0 0 value pinned {})",
                path.display()
            )
        ),
    }
    Ok(())
}

/// `--pass-to`: fills `spw_pass_to` from the pin (or empties it without the option).
pub fn start_pass_to(balancer: &mut Balancer, pin: Option<&Path>) -> Result<PassTo, BesideError> {
    let mut pass_to = PassTo::take(balancer, pin)?;
    if let (Some(id), Some(pin)) = (pass_to.fill()?, pin) {
        let pin = pin.display();
        event!(info, "pass_to", pin = pin, program_id = id, message = "frames the balancer does not serve go to this program");
    }
    Ok(pass_to)
}

/// How often the `--pass-to` pin is looked at again.
const FOLLOW_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

/// Keeps `spw_pass_to` holding what is pinned at `--pass-to` (one log line per change, and
/// an ALERT in the core while nothing is pinned there).
pub async fn follow_pass_to<M, S>(core: SharedCore<M, S>, mut pass_to: PassTo)
where
    M: Maps + Counters + Send + 'static,
    S: Store + Send + 'static,
{
    let Some(pin) = pass_to.pin().map(|p| p.display().to_string()) else { return };
    let mut tick = tokio::time::interval(FOLLOW_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let looked = tokio::task::spawn_blocking(move || {
            let followed = pass_to.follow();
            (pass_to, followed)
        })
        .await;
        let Ok((back, followed)) = looked else {
            event!(error, "pass_to_check_failed", pin = pin, error = "the check panicked");
            return;
        };
        pass_to = back;
        match followed {
            Ok(Followed::Unchanged) => {}
            Ok(Followed::Replaced { id }) => {
                event!(info, "pass_to", pin = pin, program_id = id, message = "another program is pinned there");
                server::lock(&core).set_pass_to_gone(None);
            }
            Ok(Followed::Gone) => {
                event!(
                    warn,
                    "pass_to_missing",
                    pin = pin,
                    message = "ALERT: nothing is pinned at --pass-to: the frames the balancer does not serve pass to the kernel, \
                               counted as pass_to_missing, until a program is pinned there again"
                );
                server::lock(&core).set_pass_to_gone(Some(pin.clone()));
            }
            Err(e) => event!(warn, "pass_to_check_failed", pin = pin, error = error_chain(&e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn args(extra: &[&str]) -> DaemonArgs {
        crate::args::LbdArgs::try_parse_from(["lbd", "--iface", "eth0"].iter().chain(extra)).unwrap().daemon
    }

    #[test]
    fn a_root_array_needs_the_balancer_unattached() {
        let refused = check_args(&args(&["--root-array", "/sys/fs/bpf/edge/root"])).unwrap_err();
        assert!(refused.to_string().starts_with("--root-array needs --xdp-attach none"), "{refused}");
        check_args(&args(&["--root-array", "/sys/fs/bpf/edge/root", "--xdp-attach", "none"])).unwrap();
        check_args(&args(&["--xdp-attach", "none"])).unwrap();
        let refused = check_args(&args(&["--xdp-attach", "none", "--root-index", "1"])).unwrap_err();
        assert!(refused.to_string().contains("--root-array, which is not set"), "{refused}");
    }
}
