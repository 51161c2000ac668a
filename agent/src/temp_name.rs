//! The names of the agent's own temporary files: a write makes its file
//! beside the target under such a name and renames it in, so a reader
//! never sees half of it. They are the agent's, not the user's: watches
//! leave them out.

/// Temporary files of a write are named this plus 16 lowercase hex digits.
pub(crate) const TEMP_PREFIX: &str = ".sandboxd-";

/// Whether `name` is one of a write's temporary files: [`TEMP_PREFIX`]
/// and 16 lowercase hex digits.
pub(crate) fn is_temp_name(name: &[u8]) -> bool {
    name.strip_prefix(TEMP_PREFIX.as_bytes())
        .is_some_and(|hex| {
            hex.len() == 16
                && hex
                    .iter()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
        })
}

#[cfg(test)]
mod tests {
    use super::is_temp_name;

    #[test]
    fn only_the_prefix_and_16_lowercase_hex_digits_are_a_temporary_name() {
        assert!(is_temp_name(b".sandboxd-0123456789abcdef"));
        assert!(!is_temp_name(b".sandboxd-0123456789ABCDEF"));
        assert!(!is_temp_name(b".sandboxd-0123456789abcde"));
        assert!(!is_temp_name(b".sandboxd-0123456789abcdef0"));
        assert!(!is_temp_name(b".sandboxd-notatemp"));
        assert!(!is_temp_name(b"x.txt"));
    }
}
