//! A sandbox's metadata: string pairs its creator gives it (who it is
//! for, what it runs), kept in its container's labels for as long as it
//! lives (so across restarts of sandboxd), shown with it and filtered on
//! in the list. Bounded in count and size; keys are plain names, so that
//! each is a label of its own and a list filter can name it.

use std::collections::BTreeMap;

use crate::field_error::FieldError;

/// Keys to values.
pub type Metadata = BTreeMap<String, String>;

/// Most pairs.
pub const MAX_ENTRIES: usize = 32;
/// Longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 64;
/// Longest value, in bytes.
pub const MAX_VALUE_BYTES: usize = 1024;

/// Why `key` is no metadata key: 1–64 bytes of `A–Z a–z 0–9 . _ -`.
pub fn key_error(key: &str) -> Option<String> {
    let fits = !key.is_empty() && key.len() <= MAX_KEY_BYTES;
    let plain = key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    (!fits || !plain)
        .then(|| format!("keys are 1 to {MAX_KEY_BYTES} bytes of A-Z a-z 0-9 . _ - (got {key:?})"))
}

/// Why `value` is no metadata value: more than 1024 bytes, or a NUL.
pub fn value_error(value: &str) -> Option<String> {
    if value.len() > MAX_VALUE_BYTES {
        Some(format!(
            "values are at most {MAX_VALUE_BYTES} bytes (got {})",
            value.len()
        ))
    } else if value.contains('\0') {
        Some("values contain no NUL".into())
    } else {
        None
    }
}

/// `metadata` of a create request, checked; the field named is
/// `metadata` or `metadata.KEY`.
pub fn parse(given: Option<Metadata>) -> Result<Metadata, FieldError> {
    let given = given.unwrap_or_default();
    if given.len() > MAX_ENTRIES {
        return Err(FieldError::new(
            "metadata",
            format!("at most {MAX_ENTRIES} entries (got {})", given.len()),
        ));
    }
    for (k, v) in &given {
        if let Some(why) = key_error(k) {
            return Err(FieldError::new("metadata", why));
        }
        if let Some(why) = value_error(v) {
            return Err(FieldError::new(format!("metadata.{k}"), why));
        }
    }
    Ok(given)
}

/// A list filter from query parameters `metadata.KEY=VALUE` (all must
/// hold); any other parameter, or a key that could not be one, is
/// refused naming it.
pub fn filter_of(query: Vec<(String, String)>) -> Result<Metadata, FieldError> {
    query
        .into_iter()
        .map(|(name, value)| {
            let Some(key) = name.strip_prefix("metadata.") else {
                return Err(FieldError::new(
                    name.clone(),
                    "unknown query parameter; filter with metadata.KEY=VALUE",
                ));
            };
            match key_error(key) {
                Some(why) => Err(FieldError::new(name.clone(), why)),
                None => Ok((key.to_string(), value)),
            }
        })
        .collect()
}

/// Whether `metadata` holds every pair of `wanted`.
pub fn matches(metadata: &Metadata, wanted: &Metadata) -> bool {
    wanted.iter().all(|(k, v)| metadata.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(pairs: &[(&str, &str)]) -> Option<Metadata> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn keys_are_plain_names_and_everything_is_bounded() {
        let ok = parse(of(&[("user-id", "42"), ("app.name", "ünïcode value")])).expect("ok");
        assert_eq!(ok.len(), 2);
        assert_eq!(parse(None).expect("none"), Metadata::new());
        for bad in ["", "a b", "a/b", "ä", &"k".repeat(65)] {
            let e = parse(of(&[(bad, "v")])).expect_err(bad);
            assert_eq!(e.field, "metadata", "{bad:?}");
        }
        assert!(parse(of(&[(&"k".repeat(64), "v")])).is_ok());
        let e = parse(of(&[("k", &"v".repeat(1025))])).expect_err("long value");
        assert_eq!(e.field, "metadata.k");
        assert!(parse(of(&[("k", &"v".repeat(1024))])).is_ok());
        assert!(parse(of(&[("k", "a\0b")])).is_err());
        let many: Vec<(String, String)> = (0..33).map(|i| (format!("k{i}"), "v".into())).collect();
        assert!(parse(Some(many.iter().take(32).cloned().collect())).is_ok());
        assert!(parse(Some(many.into_iter().collect())).is_err());
    }

    #[test]
    fn a_filter_is_made_of_metadata_parameters_only() {
        let q = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>()
        };
        let f = filter_of(q(&[("metadata.a", "1"), ("metadata.b-c", "")])).expect("ok");
        assert_eq!(f, parse(of(&[("a", "1"), ("b-c", "")])).expect("ok"));
        assert_eq!(filter_of(q(&[])).expect("none"), Metadata::new());
        for bad in ["a", "metadata.", "metadata.a b", "metadataa"] {
            let e = filter_of(q(&[(bad, "1")])).expect_err(bad);
            assert_eq!(e.field, bad);
        }
    }

    #[test]
    fn a_filter_matches_when_every_pair_is_there() {
        let m = parse(of(&[("a", "1"), ("b", "2")])).expect("ok");
        assert!(matches(&m, &Metadata::new()));
        assert!(matches(&m, &parse(of(&[("a", "1")])).expect("ok")));
        assert!(!matches(&m, &parse(of(&[("a", "2")])).expect("ok")));
        assert!(!matches(
            &m,
            &parse(of(&[("a", "1"), ("c", "3")])).expect("ok")
        ));
    }
}
