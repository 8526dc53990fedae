//! `lbd --metrics-listen`: the core's sample and the balancer's own port report, rendered by
//! `crate::metrics` on its bounded listener. A scrape takes the core's lock once a second
//! at most (the listener caches the text), on a blocking thread.

use super::{
    core::Counters,
    server::{self, SharedCore},
};
use crate::{
    metrics::{self, Limits, MetricsListen, Serving},
    store::Store,
};
use spillway_logging::error_chain;
use spillway_logging::event;
use spillway_reconcile::Maps;

/// Serves the metrics on `listen`; a port that cannot be bound is logged and skipped
/// (forwarding does not depend on it).
pub async fn start<M, S>(listen: MetricsListen, core: SharedCore<M, S>) -> Option<Serving>
where
    M: Maps + Counters + Send + 'static,
    S: Store + Send + 'static,
{
    let source = move || {
        let mut core = server::lock(&core);
        let ports = core.local_ports();
        match core.sample() {
            Ok(sample) => metrics::balancer(&sample, ports.as_ref().map_err(String::as_str)),
            Err(e) => {
                event!(warn, "metrics_sample_failed", error = error_chain(&e));
                // An empty exposition: the scrape succeeds, every series goes stale.
                metrics::Exposition { openmetrics: "# EOF\n".to_owned(), text: String::new() }
            }
        }
    };
    match metrics::spawn(listen, Limits::default(), source).await {
        Ok(Some((addr, serving))) => {
            event!(info, "metrics_listening", url = format!("http://{addr}{}", metrics::PATH));
            Some(serving)
        }
        Ok(None) => {
            event!(info, "metrics_off");
            None
        }
        Err(e) => {
            event!(error, "metrics_listen_failed", listen = listen, error = e, message = "serving no metrics (--metrics-listen)");
            None
        }
    }
}
