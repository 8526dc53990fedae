//! Keeps a Grafana dashboard readable for a fleet: every panel's unit is the unit of what its
//! queries compute, every selector is narrowed by the `$instance` variable, and every series
//! a query returns has a legend of its own. What a query computes comes from a small PromQL
//! parser (the subset dashboards use) and the metric naming conventions: `_total` counters,
//! `_seconds`, `_bytes`, `_ratio` and `_per_second` suffixes, `packets` in the name.

use std::collections::BTreeSet;

use crate::promql::Series;

/// What a value counts; `per_second` when it is a rate of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quantity {
    Packets,
    Count,
    Bytes,
    Seconds,
    Ratio,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Scalar,
    Of { quantity: Quantity, per_second: bool },
}

impl Unit {
    /// The Grafana units that display this one.
    pub fn grafana(self) -> &'static [&'static str] {
        use Quantity::*;
        match self {
            Unit::Scalar => &[],
            Unit::Of { quantity, per_second } => match (quantity, per_second) {
                (Packets | Count, false) => &["short", "none"],
                (Packets, true) => &["pps"],
                (Count, true) => &["ops", "cps", "reqps", "rps", "wps", "iops"],
                (Bytes, false) => &["bytes", "decbytes"],
                (Bytes, true) => &["Bps", "binBps"],
                (Seconds, false) => &["s"],
                (Ratio, false) => &["percentunit"],
                (Seconds | Ratio, true) => &[],
            },
        }
    }
}

/// A label matcher: label, operator (`=`, `!=`, `=~`, `!~`), value.
pub type Matcher = (String, String, String);

#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Number,
    Selector { metric: String, matchers: Vec<Matcher> },
    Range(Box<Expr>),
    Call { func: String, args: Vec<Expr> },
    Aggregate { op: String, grouping: Option<(bool, Vec<String>)>, args: Vec<Expr> },
    Binary { op: String, lhs: Box<Expr>, rhs: Box<Expr>, group_right: bool },
}

const AGGREGATIONS: [&str; 12] =
    ["sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values", "group"];
const BINARY: [(&str, u8); 15] = [
    ("or", 1),
    ("and", 2),
    ("unless", 2),
    ("==", 3),
    ("!=", 3),
    ("<=", 3),
    (">=", 3),
    ("<", 3),
    (">", 3),
    ("+", 4),
    ("-", 4),
    ("*", 5),
    ("/", 5),
    ("%", 5),
    ("^", 6),
];

struct Parser<'a> {
    s: &'a str,
}

impl Parser<'_> {
    fn skip(&mut self) {
        self.s = self.s.trim_start();
    }

    fn eat(&mut self, token: &str) -> bool {
        self.skip();
        let word = token.chars().all(|c| c.is_alphabetic() || c == '_');
        let boundary = |rest: &str| !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_');
        if self.s.starts_with(token) && (!word || boundary(&self.s[token.len()..])) {
            self.s = &self.s[token.len()..];
            true
        } else {
            false
        }
    }

    fn expect(&mut self, token: &str) -> Result<(), String> {
        if self.eat(token) { Ok(()) } else { Err(format!("expected {token:?} at {:?}", self.s)) }
    }

    fn ident(&mut self) -> Option<String> {
        self.skip();
        let end = self.s.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(self.s.len());
        if end == 0 || self.s.starts_with(|c: char| c.is_ascii_digit()) {
            return None;
        }
        let (word, rest) = self.s.split_at(end);
        self.s = rest;
        Some(word.to_owned())
    }

    fn string(&mut self) -> Result<String, String> {
        self.expect("\"")?;
        let mut out = String::new();
        let mut chars = self.s.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    self.s = &self.s[i + 1..];
                    return Ok(out);
                }
                '\\' => out.extend(chars.next().map(|(_, c)| c)),
                c => out.push(c),
            }
        }
        Err("unterminated string".into())
    }

    fn labels(&mut self) -> Result<Vec<String>, String> {
        self.expect("(")?;
        let mut labels = Vec::new();
        while !self.eat(")") {
            labels.push(self.ident().ok_or_else(|| format!("expected a label at {:?}", self.s))?);
            self.eat(",");
        }
        Ok(labels)
    }

    fn expr(&mut self, min: u8) -> Result<Expr, String> {
        let mut lhs = self.unary()?;
        loop {
            self.skip();
            let Some((op, prec)) = BINARY.iter().copied().find(|(op, p)| *p >= min && self.s.starts_with(op)) else {
                return Ok(lhs);
            };
            self.eat(op);
            self.eat("bool");
            if self.eat("on") || self.eat("ignoring") {
                self.labels()?;
            }
            let group_right = self.eat("group_right");
            if group_right || self.eat("group_left") {
                self.skip();
                if self.s.starts_with('(') {
                    self.labels()?;
                }
            }
            // `^` is right-associative, the others left.
            let rhs = self.expr(if op == "^" { prec } else { prec + 1 })?;
            lhs = Expr::Binary { op: op.to_owned(), lhs: Box::new(lhs), rhs: Box::new(rhs), group_right };
        }
    }

    fn unary(&mut self) -> Result<Expr, String> {
        let e = self.primary()?;
        self.skip();
        if self.s.starts_with('[') {
            let end = self.s.find(']').ok_or("unterminated range")?;
            self.s = &self.s[end + 1..];
            return Ok(Expr::Range(Box::new(e)));
        }
        Ok(e)
    }

    fn args(&mut self) -> Result<Vec<Expr>, String> {
        self.expect("(")?;
        let mut args = Vec::new();
        while !self.eat(")") {
            args.push(self.expr(0)?);
            self.eat(",");
        }
        Ok(args)
    }

    fn primary(&mut self) -> Result<Expr, String> {
        self.skip();
        if self.eat("(") {
            let e = self.expr(0)?;
            self.expect(")")?;
            return Ok(e);
        }
        if self.s.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
            let end = self.s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '.')).unwrap_or(self.s.len());
            self.s = &self.s[end..];
            return Ok(Expr::Number);
        }
        let name = self.ident().ok_or_else(|| format!("unexpected {:?}", self.s))?;
        if AGGREGATIONS.contains(&name.as_str()) {
            let grouping = |p: &mut Self| -> Result<_, String> {
                let without = p.eat("without");
                Ok(if without || p.eat("by") { Some((without, p.labels()?)) } else { None })
            };
            let before = grouping(self)?;
            let args = self.args()?;
            let grouping = match before {
                Some(g) => Some(g),
                None => grouping(self)?,
            };
            return Ok(Expr::Aggregate { op: name, grouping, args });
        }
        self.skip();
        if self.s.starts_with('(') {
            return Ok(Expr::Call { func: name, args: self.args()? });
        }
        let mut matchers = Vec::new();
        if self.eat("{") {
            while !self.eat("}") {
                let label = self.ident().ok_or_else(|| format!("expected a label at {:?}", self.s))?;
                let op = ["=~", "!~", "!=", "="].into_iter().find(|op| self.eat(op)).ok_or("expected a matcher")?;
                matchers.push((label, op.to_owned(), self.string()?));
                self.eat(",");
            }
        }
        Ok(Expr::Selector { metric: name, matchers })
    }
}

pub fn parse(expr: &str) -> Result<Expr, String> {
    let mut p = Parser { s: expr };
    let e = p.expr(0)?;
    p.skip();
    if p.s.is_empty() { Ok(e) } else { Err(format!("trailing {:?}", p.s)) }
}

/// Name parts of metrics that count packets (`observed_would_drop`'s help says it does).
const PACKETS: [&str; 2] = ["packets", "would_drop"];

/// A metric's unit by its name; `counter` when it is a `_total` counter or part of a histogram.
fn named(metric: &str) -> (Quantity, bool) {
    let counter = ["_total", "_bucket", "_count", "_sum"].iter().find_map(|s| metric.strip_suffix(s).map(|base| (base, *s)));
    let (base, suffix) = counter.unwrap_or((metric, ""));
    let quantity = if suffix == "_count" {
        Quantity::Count
    } else if base.ends_with("_seconds") {
        Quantity::Seconds
    } else if base.ends_with("_bytes") {
        Quantity::Bytes
    } else if base.ends_with("_ratio") {
        Quantity::Ratio
    } else if PACKETS.iter().any(|p| base.contains(p)) {
        Quantity::Packets
    } else {
        Quantity::Count
    };
    (quantity, counter.is_some())
}

fn selectors(e: &Expr, out: &mut Vec<(String, Vec<Matcher>)>) {
    match e {
        Expr::Number => {}
        Expr::Selector { metric, matchers } => out.push((metric.clone(), matchers.clone())),
        Expr::Range(e) => selectors(e, out),
        Expr::Call { args, .. } | Expr::Aggregate { args, .. } => args.iter().for_each(|a| selectors(a, out)),
        Expr::Binary { lhs, rhs, .. } => {
            selectors(lhs, out);
            selectors(rhs, out);
        }
    }
}

/// The unit of what `e` computes, or why it has none.
pub fn unit(e: &Expr) -> Result<Unit, String> {
    let of = |quantity, per_second| Unit::Of { quantity, per_second };
    match e {
        Expr::Number => Ok(Unit::Scalar),
        Expr::Selector { metric, .. } => Ok(of(named(metric).0, metric.ends_with("_per_second"))),
        Expr::Range(e) => unit(e),
        Expr::Call { func, args } => {
            let value = args.iter().rev().find(|a| **a != Expr::Number).ok_or_else(|| format!("{func}() of nothing"))?;
            let mut inner = Vec::new();
            selectors(value, &mut inner);
            match func.as_str() {
                "rate" | "irate" | "increase" => {
                    let counter = inner.iter().all(|(m, _)| named(m).1);
                    match unit(value)? {
                        Unit::Of { quantity, per_second: false } if counter => Ok(of(quantity, func != "increase")),
                        u => Err(format!("{func}() of {u:?}, not of a counter")),
                    }
                }
                "histogram_quantile" => match inner.as_slice() {
                    [(m, _)] if m.ends_with("_bucket") => Ok(of(named(m).0, false)),
                    _ => Err("histogram_quantile() of something other than one _bucket metric".into()),
                },
                _ => unit(value),
            }
        }
        Expr::Aggregate { op, args, .. } if op.starts_with("count") => {
            args.last().map(|_| of(Quantity::Count, false)).ok_or("count()".into())
        }
        Expr::Aggregate { op, args, .. } => args.last().map(unit).unwrap_or_else(|| Err(format!("{op}() of nothing"))),
        Expr::Binary { op, lhs, rhs, .. } => {
            let (l, r) = (unit(lhs)?, unit(rhs)?);
            match op.as_str() {
                _ if r == Unit::Scalar => Ok(l),
                _ if l == Unit::Scalar => Ok(r),
                "/" if l == r => Ok(of(Quantity::Ratio, false)),
                "and" | "unless" | "==" | "!=" | "<" | ">" | "<=" | ">=" => Ok(l),
                "+" | "-" | "or" if l == r => Ok(l),
                _ => Err(format!("{l:?} {op} {r:?} has no unit this check knows")),
            }
        }
    }
}

/// The labels that tell `e`'s series apart: a metric's labels (and the `instance` Prometheus
/// adds) less those an exact matcher fixes, narrowed by aggregation.
pub fn labels(e: &Expr, served: &[Series]) -> BTreeSet<String> {
    match e {
        Expr::Number => BTreeSet::new(),
        Expr::Selector { metric, matchers } => {
            let fixed: BTreeSet<&str> = matchers.iter().filter(|(_, op, _)| op == "=").map(|(l, _, _)| l.as_str()).collect();
            let all = served.iter().filter(|s| s.name == *metric).flat_map(|s| s.labels.iter().map(|(k, _)| k.clone()));
            all.chain(["instance".to_owned()]).filter(|l| !fixed.contains(l.as_str())).collect()
        }
        Expr::Range(e) => labels(e, served),
        Expr::Call { func, args } => {
            let mut out = args.iter().rev().find(|a| **a != Expr::Number).map(|a| labels(a, served)).unwrap_or_default();
            if func == "histogram_quantile" {
                out.remove("le");
            }
            out
        }
        Expr::Aggregate { grouping, args, .. } => match grouping {
            None => BTreeSet::new(),
            Some((false, by)) => by.iter().cloned().collect(),
            Some((true, without)) => {
                let mut out = args.last().map(|a| labels(a, served)).unwrap_or_default();
                out.retain(|l| !without.contains(l));
                out
            }
        },
        // One-to-one and group_left matching keep the left side's labels.
        Expr::Binary { lhs, rhs, group_right, .. } => {
            if *group_right || **lhs == Expr::Number {
                labels(rhs, served)
            } else {
                labels(lhs, served)
            }
        }
    }
}

/// Everything wrong with `dashboard`'s panels for a fleet, each naming its panel (empty: none).
/// `served` gives the metrics' labels (a scrape of every endpoint the dashboard reads).
pub fn problems(dashboard: &serde_json::Value, served: &[Series]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut panels: Vec<&serde_json::Value> = dashboard["panels"].as_array().map(|p| p.iter().collect()).unwrap_or_default();
    while let Some(panel) = panels.pop() {
        panels.extend(panel["panels"].as_array().into_iter().flatten());
        let Some(targets) = panel["targets"].as_array() else { continue };
        let title = panel["title"].as_str().unwrap_or_default();
        let mut problem = |what: String| problems.push(format!("panel {title:?}: {what}"));
        let default = panel["fieldConfig"]["defaults"]["unit"].as_str();
        let mut legends = BTreeSet::new();
        for target in targets {
            let (Some(expr), Some(ref_id)) = (target["expr"].as_str(), target["refId"].as_str()) else { continue };
            let e = match parse(expr) {
                Ok(e) => e,
                Err(e) => {
                    problem(format!("{ref_id} does not parse ({e}): {expr}"));
                    continue;
                }
            };
            let shown = overridden_unit(panel, ref_id).or(default);
            match (unit(&e), shown) {
                (Err(why), _) => problem(format!("{ref_id}: {why}: {expr}")),
                (Ok(u), Some(shown)) if u.grafana().contains(&shown) => {}
                (Ok(u), shown) => problem(format!("{ref_id} computes {u:?} (units {:?}), shown as {shown:?}: {expr}", u.grafana())),
            }
            let mut found = Vec::new();
            selectors(&e, &mut found);
            for (metric, matchers) in found {
                if !matchers.iter().any(|m| *m == ("instance".into(), "=~".into(), "$instance".into())) {
                    problem(format!("{ref_id}: {metric} is not narrowed by instance=~\"$instance\""));
                }
            }
            let legend = target["legendFormat"].as_str().unwrap_or_default();
            let shown: BTreeSet<String> =
                legend.split("{{").skip(1).filter_map(|s| s.split_once("}}")).map(|(l, _)| l.trim().to_owned()).collect();
            let unshown: Vec<String> = labels(&e, served).difference(&shown).cloned().collect();
            if !unshown.is_empty() {
                problem(format!("{ref_id}'s legend {legend:?} lacks {unshown:?}, which tell its series apart"));
            }
            if !legends.insert(legend) {
                problem(format!("two queries have the legend {legend:?}"));
            }
        }
    }
    problems
}

/// The unit an override gives the series of query `ref_id`.
fn overridden_unit<'a>(panel: &'a serde_json::Value, ref_id: &str) -> Option<&'a str> {
    panel["fieldConfig"]["overrides"].as_array()?.iter().find_map(|o| {
        let by_query = o["matcher"]["id"] == "byFrameRefID" && o["matcher"]["options"] == ref_id;
        let props = o["properties"].as_array().filter(|_| by_query)?;
        props.iter().find(|p| p["id"] == "unit").and_then(|p| p["value"].as_str())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use Quantity::*;

    fn unit_of(expr: &str) -> Result<Unit, String> {
        unit(&parse(expr).unwrap())
    }

    #[test]
    fn infers_units_and_labels() {
        let of = |quantity, per_second| Ok(Unit::Of { quantity, per_second });
        assert_eq!(unit_of(r#"sum by (vip) (rate(x_packets_total{vip=~"$vip"}[5m]))"#), of(Packets, true));
        assert_eq!(unit_of("rate(x_bytes_total[1m])"), of(Bytes, true));
        assert_eq!(unit_of("increase(x_panics_total[1h])"), of(Count, false));
        assert_eq!(unit_of("histogram_quantile(0.99, sum by (le) (rate(x_duration_seconds_bucket[1m])))"), of(Seconds, false));
        assert_eq!(unit_of("x_entries / x_max_entries"), of(Ratio, false));
        assert_eq!(unit_of("min by (vip) (x_ratio) < 0.5"), of(Ratio, false));
        assert_eq!(unit_of("x_budget_per_second"), of(Count, true));
        assert!(unit_of("rate(x_flow_entries[1m])").is_err(), "rate of a gauge");
        assert!(unit_of("rate(x_total[1m]) + x_seconds").is_err());
        assert!(parse("sum by (a (x)").is_err());

        let served = crate::promql::series("x_total{vip=\"v\",backend=\"b\",le=\"1\"} 1\n");
        let labels_of = |expr| labels(&parse(expr).unwrap(), &served).into_iter().collect::<Vec<_>>();
        assert_eq!(labels_of(r#"x_total{vip="v"}"#), ["backend", "instance", "le"]);
        assert_eq!(labels_of("sum without (le) (rate(x_total[1m]))"), ["backend", "instance", "vip"]);
        assert_eq!(labels_of("histogram_quantile(0.5, sum by (instance, le) (x_total))"), ["instance"]);
        assert_eq!(labels_of("sum by (vip, backend) (x_total) / ignoring(backend) group_left sum by (vip) (x_total)"), ["backend", "vip"]);
    }

    #[test]
    fn names_the_panel_of_each_problem() {
        let served = crate::promql::series("x_packets_total{vip=\"v\"} 1\n");
        let dashboard = serde_json::json!({"panels": [{"type": "row", "panels": [{
            "title": "Mixed",
            "fieldConfig": {"defaults": {"unit": "percentunit"}, "overrides": [
                {"matcher": {"id": "byFrameRefID", "options": "B"}, "properties": [{"id": "unit", "value": "pps"}]}
            ]},
            "targets": [
                {"refId": "A", "expr": "increase(x_packets_total{instance=~\"$instance\"}[1h])", "legendFormat": "{{instance}}"},
                {"refId": "B", "expr": "sum by (vip) (rate(x_packets_total{instance=~\"$instance\"}[1m]))", "legendFormat": "{{vip}}"},
                {"refId": "C", "expr": "rate(x_packets_total[1m])", "legendFormat": "c {{vip}}"}
            ]
        }]}]});
        let problems = problems(&dashboard, &served);
        assert_eq!(problems.len(), 5, "{problems:#?}");
        assert!(problems[0].starts_with("panel \"Mixed\": A computes Of { quantity: Packets, per_second: false }"), "{problems:#?}");
        assert!(problems[1].contains("A's legend \"{{instance}}\" lacks [\"vip\"]"), "{problems:#?}");
        assert!(problems[2].contains("C computes Of { quantity: Packets, per_second: true }"), "{problems:#?}");
        assert!(problems[3].contains("C: x_packets_total is not narrowed by instance"), "{problems:#?}");
        assert!(problems[4].contains("C's legend \"c {{vip}}\" lacks [\"instance\"]"), "{problems:#?}");
    }
}
