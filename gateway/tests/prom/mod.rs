//! Prometheus's text format, read back: series by name and labels.
#![allow(dead_code)]
use std::collections::BTreeMap;

/// One scrape of `/metrics`: every sample, by name and labels.
#[derive(Debug, Clone)]
pub struct Scrape {
    pub text: String,
    samples: Vec<Sample>,
}

#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Scrape {
    pub fn parse(text: &str) -> Scrape {
        let samples = text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|line| {
                let (series, value) = line.rsplit_once(' ').expect("a sample line");
                let value: f64 = match value {
                    "+Inf" => f64::INFINITY,
                    "-Inf" => f64::NEG_INFINITY,
                    v => v.parse().unwrap_or_else(|_| panic!("a value: {line}")),
                };
                let (name, labels) = match series.split_once('{') {
                    Some((name, rest)) => (name, labels(rest.trim_end_matches('}'))),
                    None => (series, BTreeMap::new()),
                };
                Sample {
                    name: name.to_string(),
                    labels,
                    value,
                }
            })
            .collect();
        Scrape {
            text: text.to_string(),
            samples,
        }
    }

    /// Samples of `name` whose labels include `labels`.
    pub fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// The sum of the samples of `name` whose labels include `labels` (0 when none).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    /// The one sample of `name` with `labels`; panics when absent.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<_> = self.matching(name, labels).collect();
        assert_eq!(found.len(), 1, "one {name} {labels:?} in:\n{}", self.text);
        found[0].value
    }

    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }

    /// Every metric family named in `# TYPE` lines, with its type.
    pub fn families(&self) -> BTreeMap<String, String> {
        self.text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' '))
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect()
    }
}

fn labels(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = text;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, e)) = chars.next() {
                        value.push(match e {
                            'n' => '\n',
                            other => other,
                        });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.insert(key.trim_start_matches(',').trim().to_string(), value);
        rest = &after[end..];
    }
    out
}
