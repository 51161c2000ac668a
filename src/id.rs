//! Random identifiers: sandbox and command ids, URL-safe by construction.

use std::sync::atomic::{AtomicU64, Ordering};

/// `n` random bytes as lowercase hex.
pub fn random_hex(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    // getrandom only fails without an OS entropy source; fall back to time
    // and a counter, unique per process, rather than refuse the request.
    if getrandom::fill(&mut bytes).is_err() {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mix = crate::clock::now_ms() ^ COUNTER.fetch_add(1, Ordering::Relaxed).rotate_left(40);
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (mix >> ((i % 8) * 8)) as u8 ^ i as u8;
        }
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// True for `len` lowercase hex digits.
pub fn is_hex_id(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}
