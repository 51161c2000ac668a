//! A sandbox's environment: variables its creator gives every process
//! started in it (commands and terminal sessions, through any dialect),
//! under the process's own: a process's `env` wins for a name both give.
//! Kept in the sandbox's labels like its metadata (its container's, or for
//! a claimed pool member its claim volume's), so it is fixed at create and
//! survives restarts of sandboxd. The API never shows the values (they are
//! often keys); whoever can inspect the engine's objects can read them, as
//! they could a container's own environment.

use std::collections::BTreeMap;

use crate::field_error::FieldError;
use crate::process_fields;

/// Names to values.
pub type Environment = BTreeMap<String, String>;

/// Most variables.
pub const MAX_ENTRIES: usize = 64;
/// Most bytes of names and values together: each is a label, and the
/// engine keeps a container's labels in every inspect answer.
pub const MAX_TOTAL_BYTES: usize = 32 * 1024;

/// `env` of a create request, checked as a process's `env` is (names of
/// `A–Z a–z 0–9 _` not starting with a digit, no NUL in a value) and
/// bounded.
pub fn parse(given: Option<Environment>) -> Result<Environment, FieldError> {
    let given = given.unwrap_or_default();
    if given.len() > MAX_ENTRIES {
        return Err(FieldError::new(
            "env",
            format!("at most {MAX_ENTRIES} variables (got {})", given.len()),
        ));
    }
    let total: usize = given.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > MAX_TOTAL_BYTES {
        return Err(FieldError::new(
            "env",
            format!("names and values are at most {MAX_TOTAL_BYTES} bytes in all (got {total})"),
        ));
    }
    Ok(process_fields::env_vars(Some(given))?.into_iter().collect())
}

/// A process's variables `own` over the sandbox's `base`: every name once,
/// the process's value where both give one.
pub fn under(base: &Environment, own: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut merged = base.clone();
    merged.extend(own);
    merged.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_value_wins_and_each_name_is_given_once() {
        let base = Environment::from([("A".into(), "sandbox".into()), ("B".into(), "b".into())]);
        let merged = under(
            &base,
            vec![("A".into(), "process".into()), ("C".into(), "c".into())],
        );
        assert_eq!(
            merged,
            [("A", "process"), ("B", "b"), ("C", "c")].map(|(k, v)| (k.to_string(), v.to_string()))
        );
        assert_eq!(under(&Environment::new(), vec![]), vec![]);
    }

    #[test]
    fn names_count_and_size_are_checked() {
        assert!(parse(None).expect("none").is_empty());
        let ok = parse(Some(Environment::from([("_A1".into(), "x y=z".into())]))).expect("ok");
        assert_eq!(ok["_A1"], "x y=z");
        for bad in ["1A", "A-B", "", "A B"] {
            let e = parse(Some(Environment::from([(bad.into(), "v".into())]))).expect_err(bad);
            assert_eq!(e.field, "env", "{bad:?}");
        }
        let e = parse(Some(Environment::from([("A".into(), "a\0b".into())]))).expect_err("nul");
        assert!(e.field.starts_with("env"), "{}", e.field);
        let many: Environment = (0..=MAX_ENTRIES)
            .map(|i| (format!("V{i}"), String::new()))
            .collect();
        assert!(
            parse(Some(many))
                .expect_err("many")
                .message
                .contains("at most 64")
        );
        let big = Environment::from([("A".into(), "x".repeat(MAX_TOTAL_BYTES))]);
        assert!(
            parse(Some(big))
                .expect_err("big")
                .message
                .contains("bytes in all")
        );
    }
}
