//! Random identifiers: sandbox and command ids, terminal tickets, URL-safe
//! by construction. They come from the OS random source or not at all: an
//! id or ticket someone could predict is worse than a refused request.

/// The OS random source failed, so no id was made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the operating system's random source failed ({0}); no id was made")]
pub struct RandomUnavailable(String);

/// `n` random bytes as lowercase hex.
pub fn random_hex(n: usize) -> Result<String, RandomUnavailable> {
    hex_from(n, |b| getrandom::fill(b).map_err(|e| e.to_string()))
}

/// 64 random bits.
pub fn random_u64() -> Result<u64, RandomUnavailable> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|e| RandomUnavailable(e.to_string()))?;
    Ok(u64::from_le_bytes(b))
}

fn hex_from(
    n: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<(), String>,
) -> Result<String, RandomUnavailable> {
    let mut bytes = vec![0u8; n];
    fill(&mut bytes).map_err(RandomUnavailable)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// True for `len` lowercase hex digits.
pub fn is_hex_id(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_random_source_makes_no_id() {
        let failed = hex_from(12, |_| Err("ENOSYS".into()));
        assert_eq!(failed, Err(RandomUnavailable("ENOSYS".into())));
    }

    #[test]
    fn ids_are_hex_of_twice_the_bytes_and_differ() {
        let a = random_hex(12).expect("random");
        let b = random_hex(12).expect("random");
        assert!(is_hex_id(&a, 24) && is_hex_id(&b, 24));
        assert_ne!(a, b);
    }
}
