//! Call-data templates: the JSON data of a gRPC call, an HTTP URL's path and query, an HTTP
//! body, with placeholders filled per call so calls can differ.
//!
//! Placeholders (anything else between `{{` and `}}` is refused when the template is parsed):
//!
//! - `{{index}}`: the call's index in the phase (0, 1, 2, …; warm-up calls count too);
//! - `{{worker}}`: the index of the worker making the call (0 to concurrency − 1);
//! - `{{rand_int LO HI}}`: a random integer from LO to HI inclusive;
//! - `{{rand_string N}}`: N random letters and digits (`[A-Za-z0-9]`, safe inside JSON strings
//!   and URLs).
//!
//! Random values come from `--seed` and the call's index only, so a call's data is the same in
//! every run with that seed, whichever worker makes it. Text is inserted as is (no quoting): a
//! number placeholder inside a JSON string needs the quotes around it, `"id-{{index}}"`.

use std::fmt::Write as _;

use rand::distr::Alphanumeric;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A parsed template: fixed text and placeholders.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Clone, Debug, PartialEq)]
enum Part {
    Text(String),
    Index,
    Worker,
    RandInt(i64, i64),
    RandString(usize),
}

/// Longest `{{rand_string N}}`: a typo of a few more digits must not ask for gigabytes a call.
pub(crate) const MAX_RAND_STRING: usize = 1 << 20;

/// Why a text is not a template: each names the placeholder at fault (without its braces
/// here; the messages put them back).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("`{{{{` without a closing `}}}}` in \"{0}\"")]
    Unclosed(String),
    #[error("`{{{{{placeholder}}}}}`: \"{word}\" is not an integer")]
    NotAnInteger { placeholder: String, word: String },
    #[error("`{{{{{placeholder}}}}}`: {lo} is above {hi}")]
    Reversed {
        placeholder: String,
        lo: i64,
        hi: i64,
    },
    #[error("`{{{{{0}}}}}`: the length must be a number from 0 to {MAX_RAND_STRING}")]
    Length(String),
    #[error(
        "unknown placeholder `{{{{{0}}}}}` (use {{{{index}}}}, {{{{worker}}}}, \
         {{{{rand_int LO HI}}}} or {{{{rand_string N}}}})"
    )]
    Unknown(String),
}

impl Template {
    /// Parses `text`; an unknown or malformed placeholder is an error naming it.
    pub fn parse(text: &str) -> Result<Template, TemplateError> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find("{{") {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_string()));
            }
            let after = &rest[open + 2..];
            let close = after
                .find("}}")
                .ok_or_else(|| TemplateError::Unclosed(text.to_string()))?;
            parts.push(placeholder(after[..close].trim())?);
            rest = &after[close + 2..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_string()));
        }
        Ok(Template { parts })
    }

    /// True when the template has no placeholders: every call carries the same text.
    pub(crate) fn is_constant(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Text(_)))
    }

    /// The text of call `index` made by worker `worker`, its random values drawn from `seed`
    /// and `index`.
    pub(crate) fn render(&self, seed: u64, index: u64, worker: usize) -> String {
        // Made on the first random placeholder only: most templates have none.
        let mut rng: Option<ChaCha8Rng> = None;
        // Decorrelates neighbouring (seed, index) pairs (splitmix64's constant).
        let seeded = || ChaCha8Rng::seed_from_u64(seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Index => write!(out, "{index}").expect("a String takes any write"),
                Part::Worker => write!(out, "{worker}").expect("a String takes any write"),
                Part::RandInt(lo, hi) => {
                    let r = rng.get_or_insert_with(seeded);
                    write!(out, "{}", r.random_range(*lo..=*hi)).expect("a String takes any write")
                }
                Part::RandString(n) => {
                    let r = rng.get_or_insert_with(seeded);
                    out.extend(r.sample_iter(Alphanumeric).take(*n).map(char::from));
                }
            }
        }
        out
    }
}

fn placeholder(inner: &str) -> Result<Part, TemplateError> {
    let words: Vec<&str> = inner.split_whitespace().collect();
    let int = |s: &str| {
        s.parse::<i64>().map_err(|_| TemplateError::NotAnInteger {
            placeholder: inner.to_string(),
            word: s.to_string(),
        })
    };
    match words.as_slice() {
        ["index"] => Ok(Part::Index),
        ["worker"] => Ok(Part::Worker),
        ["rand_int", lo, hi] => {
            let (lo, hi) = (int(lo)?, int(hi)?);
            if lo > hi {
                return Err(TemplateError::Reversed {
                    placeholder: inner.to_string(),
                    lo,
                    hi,
                });
            }
            Ok(Part::RandInt(lo, hi))
        }
        ["rand_string", n] => match n.parse::<usize>() {
            Ok(n) if n <= MAX_RAND_STRING => Ok(Part::RandString(n)),
            _ => Err(TemplateError::Length(inner.to_string())),
        },
        _ => Err(TemplateError::Unknown(inner.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_render_per_call_and_reproducibly() {
        let t = Template::parse(r#"{"id": {{index}}, "w": {{ worker }}, "n": {{rand_int 5 7}}, "s": "{{rand_string 6}}"}"#)
            .unwrap();
        assert!(!t.is_constant());
        let a = t.render(1, 42, 3);
        assert!(a.starts_with(r#"{"id": 42, "w": 3, "n": "#), "{a}");
        let v: serde_json::Value = serde_json::from_str(&a).unwrap();
        assert!((5..=7).contains(&v["n"].as_i64().unwrap()));
        let s = v["s"].as_str().unwrap();
        assert!(s.len() == 6 && s.chars().all(|c| c.is_ascii_alphanumeric()));
        // Same seed and index: same values, whichever worker; another index or seed: others.
        assert_eq!(t.render(1, 42, 3), a);
        assert_eq!(t.render(1, 42, 0).replace("\"w\": 0", "\"w\": 3"), a);
        let others: std::collections::HashSet<String> =
            (0..20).map(|i| t.render(1, i, 0)).collect();
        assert!(others.len() > 15, "random parts vary with the index");
        assert_ne!(t.render(2, 42, 3), a);
    }

    #[test]
    fn constant_text_stays_as_is() {
        let t = Template::parse(r#"{"name": "x"}"#).unwrap();
        assert!(t.is_constant());
        assert_eq!(t.render(9, 9, 9), r#"{"name": "x"}"#);
        assert_eq!(Template::parse("").unwrap().render(0, 0, 0), "");
    }

    #[test]
    fn bad_placeholders_are_named() {
        for (text, says) in [
            ("{{idx}}", "unknown placeholder `{{idx}}`"),
            ("a {{index", "without a closing"),
            ("{{rand_int 9 1}}", "9 is above 1"),
            ("{{rand_int x 1}}", "\"x\" is not an integer"),
            ("{{rand_string 99999999}}", "the length must be"),
            ("{{rand_int 1}}", "unknown placeholder"),
        ] {
            let e = Template::parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
