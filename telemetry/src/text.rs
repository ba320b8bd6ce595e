//! A parser of the Prometheus text format (version 0.0.4) as [`crate::Metrics`] writes
//! it, for `tessera top` and the tests: samples with their labels, and each family's
//! type. Timestamps and exemplars are not written by the exporter and not read here.

use crate::TelemetryError;
use std::collections::HashMap;

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The sample's name (a histogram's are `_bucket`, `_sum`, `_count`).
    pub name: String,
    /// Its labels, in the order written.
    pub labels: Vec<(String, String)>,
    /// Its value.
    pub value: f64,
}

impl Sample {
    /// The value of label `key`, if the sample has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn matches(&self, want: &[(&str, &str)]) -> bool {
        want.iter().all(|(k, v)| self.label(k) == Some(*v))
    }
}

/// A parsed scrape.
#[derive(Clone, Debug, Default)]
pub struct Scrape {
    /// Each family's type (`counter`, `gauge`, `histogram`, ...), by family name.
    pub types: HashMap<String, String>,
    /// Every sample, in the order written.
    pub samples: Vec<Sample>,
}

impl Scrape {
    /// The type of family `family`.
    pub fn kind(&self, family: &str) -> Option<&str> {
        self.types.get(family).map(String::as_str)
    }

    /// The value of the one sample `name` whose labels include `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| s.name == name && s.matches(labels))
            .map(|s| s.value)
    }

    /// The sum of every sample `name` (over all its label sets); 0 if there is none.
    pub fn sum(&self, name: &str) -> f64 {
        self.sum_where(name, &[])
    }

    /// The sum of the samples `name` whose labels include `labels`.
    pub fn sum_where(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name && s.matches(labels))
            .map(|s| s.value)
            .sum()
    }

    /// The samples named `name`.
    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }

    /// The cumulative buckets `(upper bound, count)` of histogram `family` summed over
    /// the label sets that include `labels`, in increasing bound order.
    pub fn buckets(&self, family: &str, labels: &[(&str, &str)]) -> Vec<(f64, f64)> {
        let mut by_le: Vec<(f64, f64)> = Vec::new();
        let name = format!("{family}_bucket");
        for s in self
            .samples
            .iter()
            .filter(|s| s.name == name && s.matches(labels))
        {
            let Some(le) = s.label("le").and_then(parse_value) else {
                continue;
            };
            match by_le.iter_mut().find(|(b, _)| *b == le) {
                Some(slot) => slot.1 += s.value,
                None => by_le.push((le, s.value)),
            }
        }
        by_le.sort_by(|a, b| a.0.total_cmp(&b.0));
        by_le
    }
}

/// The `q` quantile (0..=1) of cumulative `buckets`, interpolated linearly inside the
/// bucket it falls in, as PromQL's `histogram_quantile` does; `None` when empty.
pub fn quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower);
            }
            let inside = count - below;
            let frac = if inside > 0.0 {
                (rank - below) / inside
            } else {
                1.0
            };
            return Some(lower + (le - lower) * frac);
        }
        (lower, below) = (le, count);
    }
    Some(lower)
}

/// Parses a whole text exposition.
pub fn parse(text: &str) -> Result<Scrape, TelemetryError> {
    let mut out = Scrape::default();
    for (n, line) in text.lines().enumerate() {
        let err = |msg: &str| TelemetryError::Parse {
            line: n + 1,
            msg: format!("{msg}: {line:?}"),
        };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest
                .split_once(' ')
                .ok_or_else(|| err("TYPE without a type"))?;
            out.types.insert(name.to_string(), kind.trim().to_string());
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        out.samples
            .push(parse_sample(line).ok_or_else(|| err("not a sample"))?);
    }
    Ok(out)
}

fn parse_value(v: &str) -> Option<f64> {
    match v {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        v => v.parse().ok(),
    }
}

/// `name{k="v",...} value`, with `\\`, `\"` and `\n` escapes in label values.
fn parse_sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_string();
    let mut labels = Vec::new();
    let mut rest = &line[name_end..];
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices().peekable();
        loop {
            while chars.peek().is_some_and(|(_, c)| *c == ',' || *c == ' ') {
                chars.next();
            }
            let &(start, c) = chars.peek()?;
            if c == '}' {
                rest = &body[start + 1..];
                break;
            }
            let eq = body[start..].find('=')? + start;
            let key = body[start..eq].trim().to_string();
            while chars.next_if(|(i, _)| *i <= eq).is_some() {}
            if chars.next()?.1 != '"' {
                return None;
            }
            let mut value = String::new();
            loop {
                match chars.next()?.1 {
                    '"' => break,
                    '\\' => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        c => value.push(c),
                    },
                    c => value.push(c),
                }
            }
            labels.push((key, value));
        }
    }
    let value = parse_value(rest.split_whitespace().next()?)?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_types_and_escaped_labels_parse() {
        let text = "# HELP a_total A.\n# TYPE a_total counter\na_total 3\n\
                    # TYPE h histogram\nh_bucket{x=\"q\\\"u,o}te\",le=\"0.5\"} 1\n\
                    h_bucket{x=\"q\\\"u,o}te\",le=\"+Inf\"} 4\nh_count{x=\"q\\\"u,o}te\"} 4\n";
        let s = parse(text).unwrap();
        assert_eq!(s.kind("a_total"), Some("counter"));
        assert_eq!(s.kind("h"), Some("histogram"));
        assert_eq!(s.sum("a_total"), 3.0);
        assert_eq!(s.value("h_count", &[("x", "q\"u,o}te")]), Some(4.0));
        assert_eq!(s.buckets("h", &[]), vec![(0.5, 1.0), (f64::INFINITY, 4.0)]);
        assert!(parse("a_total{x=\"open 3").is_err());
    }

    #[test]
    fn quantiles_interpolate_inside_their_bucket() {
        let b = [(1.0, 10.0), (2.0, 20.0), (f64::INFINITY, 20.0)];
        assert_eq!(quantile(&b, 0.5), Some(1.0));
        assert_eq!(quantile(&b, 0.75), Some(1.5));
        assert_eq!(quantile(&b, 1.0), Some(2.0));
        assert_eq!(quantile(&[], 0.5), None);
        // Everything above the last finite bound: the bound is all that is known.
        assert_eq!(
            quantile(&[(1.0, 0.0), (f64::INFINITY, 3.0)], 0.5),
            Some(1.0)
        );
    }
}
