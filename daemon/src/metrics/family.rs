//! Metric families built from a snapshot, encoded by `prometheus-client` as a collector (the
//! values are constants of this scrape, not live instruments).

use super::Exposition;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, NoLabelSet, prometheus_text, text},
    metrics::MetricType,
    registry::{Registry, Unit},
};

pub type Labels = Vec<(&'static str, String)>;

#[derive(Debug)]
enum Value {
    Counter(u64),
    Gauge(f64),
    Histogram { buckets: Vec<(f64, u64)>, sum: f64, count: u64 },
    Info,
}

#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    unit: Option<Unit>,
    kind: MetricType,
    samples: Vec<(Labels, Value)>,
}

/// The families of one scrape, in the order they are declared.
#[derive(Debug, Default)]
pub struct Families(Vec<Family>);

impl Families {
    fn family(&mut self, name: &'static str, help: &'static str, unit: Option<Unit>, kind: MetricType) -> &mut Family {
        self.0.push(Family { name, help, unit, kind, samples: Vec::new() });
        self.0.last_mut().expect("just pushed")
    }

    /// A counter family (`_total` is appended, after the unit).
    pub fn counter(&mut self, name: &'static str, help: &'static str, unit: Option<Unit>) -> Samples<'_> {
        Samples(self.family(name, help, unit, MetricType::Counter))
    }

    pub fn gauge(&mut self, name: &'static str, help: &'static str, unit: Option<Unit>) -> Samples<'_> {
        Samples(self.family(name, help, unit, MetricType::Gauge))
    }

    pub fn histogram(&mut self, name: &'static str, help: &'static str, unit: Unit, buckets: Vec<(f64, u64)>, sum: f64, count: u64) {
        let family = self.family(name, help, Some(unit), MetricType::Histogram);
        family.samples.push((Labels::new(), Value::Histogram { buckets, sum, count }));
    }

    /// An info metric (`<name>_info{labels} 1`).
    pub fn info(&mut self, name: &'static str, help: &'static str, labels: Labels) {
        self.family(name, help, None, MetricType::Info).samples.push((labels, Value::Info));
    }

    /// Every family under `prefix`, in both exposition formats.
    pub fn encode(self, prefix: &str) -> Exposition {
        let mut registry = Registry::with_prefix(prefix);
        registry.register_collector(Box::new(self));
        let (mut openmetrics, mut text) = (String::new(), String::new());
        text::encode(&mut openmetrics, &registry).expect("writing to a String cannot fail");
        prometheus_text::encode(&mut text, &registry).expect("writing to a String cannot fail");
        Exposition { openmetrics, text }
    }
}

/// Adds samples to the family just declared.
pub struct Samples<'a>(&'a mut Family);

impl Samples<'_> {
    pub fn counter(&mut self, labels: Labels, value: u64) -> &mut Self {
        self.0.samples.push((labels, Value::Counter(value)));
        self
    }

    pub fn gauge(&mut self, labels: Labels, value: f64) -> &mut Self {
        self.0.samples.push((labels, Value::Gauge(value)));
        self
    }
}

impl Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in &self.0 {
            let mut metric = encoder.encode_descriptor(family.name, family.help, family.unit.as_ref(), family.kind)?;
            for (labels, value) in &family.samples {
                match value {
                    Value::Info => metric.encode_info(labels)?,
                    Value::Counter(v) => metric.encode_family(labels)?.encode_counter::<NoLabelSet, _, u64>(v, None)?,
                    Value::Gauge(v) => metric.encode_family(labels)?.encode_gauge(v)?,
                    Value::Histogram { buckets, sum, count } => {
                        metric.encode_family(labels)?.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None)?
                    }
                }
            }
        }
        Ok(())
    }
}
