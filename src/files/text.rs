//! Content as an editor sees it: its SHA-256 (what `ifMatch` compares), a
//! range of its lines, and whether it is text at all. Pure functions on
//! bytes, so that what a model reads is exactly what the file holds.

use sha2::{Digest, Sha256};

/// Lowercase hex of the SHA-256 of `content`.
pub fn sha256_hex(content: &[u8]) -> String {
    hex(&Sha256::digest(content).into())
}

/// A SHA-256 fed piece by piece, as lowercase hex at the end.
#[derive(Default)]
pub struct Sha256Hex(Sha256);

impl std::fmt::Debug for Sha256Hex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sha256Hex")
    }
}

impl Sha256Hex {
    pub fn update(&mut self, piece: &[u8]) {
        self.0.update(piece);
    }

    pub fn finish(self) -> String {
        hex(&self.0.finalize().into())
    }
}

/// Standard base64 with padding, encoded piece by piece: whole groups of
/// three bytes as they come, the last one or two at the end.
#[derive(Debug, Default)]
pub struct Base64Writer {
    out: String,
    carry: Vec<u8>,
}

impl Base64Writer {
    pub fn push(&mut self, mut piece: &[u8]) {
        if !self.carry.is_empty() {
            let need = (3 - self.carry.len()).min(piece.len());
            self.carry.extend_from_slice(&piece[..need]);
            piece = &piece[need..];
            if self.carry.len() < 3 {
                return;
            }
            base64_simd::STANDARD.encode_append(&self.carry, &mut self.out);
            self.carry.clear();
        }
        let whole = piece.len() - piece.len() % 3;
        base64_simd::STANDARD.encode_append(&piece[..whole], &mut self.out);
        self.carry.extend_from_slice(&piece[whole..]);
    }

    pub fn finish(mut self) -> String {
        base64_simd::STANDARD.encode_append(&self.carry, &mut self.out);
        self.out
    }
}

/// Standard base64 with canonical padding, decoded; why not, when it is
/// not. The SIMD decoder takes 1 ms for 4 MiB where the `base64` crate
/// takes 5; both refuse the same input (see the test), and the latter
/// says where the fault is.
pub fn decode_base64(text: &str) -> Result<Vec<u8>, String> {
    base64_simd::STANDARD
        .decode_to_vec(text.as_bytes())
        .map_err(|_| {
            use base64::Engine;
            match base64::engine::general_purpose::STANDARD.decode(text.as_bytes()) {
                Err(e) => e.to_string(),
                Ok(_) => "not canonical".to_string(),
            }
        })
}

/// Lowercase hex of a hash.
pub fn hex(hash: &[u8; 32]) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

/// A hash from 64 hex digits (either case), or `None`.
pub fn parse_hex(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Text is what has no NUL byte and is valid UTF-8.
pub fn is_text(content: &[u8]) -> bool {
    !content.contains(&0) && std::str::from_utf8(content).is_ok()
}

/// How many lines `content` has: each `\n` ends one, and text after the
/// last `\n` is one more. An empty file has none.
pub fn count_lines(content: &[u8]) -> u64 {
    let newlines = content.iter().filter(|b| **b == b'\n').count() as u64;
    match content.last() {
        Some(b'\n') | None => newlines,
        Some(_) => newlines + 1,
    }
}

/// Lines `start..=end` (1-based) of `content`, exactly as in the file
/// (line endings, `\r\n` too, kept), with the range actually returned:
/// `end` is lowered to the last line; past the end the slice is empty and
/// the range is `start..=start-1`.
pub fn line_range(content: &[u8], start: u64, end: u64) -> (&[u8], u64, u64) {
    let total = count_lines(content);
    let end = end.min(total);
    if start > end {
        return (&[], start, start.saturating_sub(1));
    }
    // Byte offset where line `n` (1-based) starts.
    let mut offsets = content
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .map(|(i, _)| i + 1);
    let from = if start <= 1 {
        0
    } else {
        offsets
            .nth(usize::try_from(start - 2).unwrap_or(usize::MAX))
            .unwrap_or(content.len())
    };
    let mut rest = content[from..]
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .map(|(i, _)| from + i + 1);
    let to = rest
        .nth(usize::try_from(end - start).unwrap_or(usize::MAX))
        .unwrap_or(content.len());
    (&content[from..to], start, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Pieces of any sizes give what one encoding and one hash of the
        /// whole give.
        #[test]
        fn base64_and_hash_by_pieces_are_those_of_the_whole(
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2000),
            cuts in proptest::collection::vec(0usize..2000, 0..12),
        ) {
            use base64::Engine;
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(data.len())).collect();
            cuts.push(0);
            cuts.push(data.len());
            cuts.sort_unstable();
            let (mut b64, mut hash) = (Base64Writer::default(), Sha256Hex::default());
            for w in cuts.windows(2) {
                b64.push(&data[w[0]..w[1]]);
                hash.update(&data[w[0]..w[1]]);
            }
            proptest::prop_assert_eq!(
                b64.finish(),
                base64::engine::general_purpose::STANDARD.encode(&data)
            );
            proptest::prop_assert_eq!(hash.finish(), sha256_hex(&data));
        }

        /// The fast decoder takes back what the `base64` crate encodes.
        #[test]
        fn decode_base64_takes_back_any_encoding(
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2000),
        ) {
            use base64::Engine;
            let text = base64::engine::general_purpose::STANDARD.encode(&data);
            proptest::prop_assert_eq!(decode_base64(&text), Ok(data));
        }
    }

    /// The SIMD decoder refuses exactly what the `base64` crate refuses
    /// (padding, trailing bits, symbols), and the message says where.
    #[test]
    fn decode_base64_is_as_strict_as_the_base64_crate() {
        use base64::Engine;
        let cases = [
            "",
            "QQ==",
            "QR==",
            "QQ=",
            "QQ",
            "QUI=",
            "QUJ=",
            "QUJD",
            "QUJD\n",
            " QUJD",
            "QU=D",
            "QUJD====",
            "Q===",
            "QQ==QQ==",
            "-_8=",
            "/+8=",
            "QUJDRA",
            "QUJDRA==",
            "QUJD\r\nQUJD",
        ];
        for case in cases {
            let strict = base64::engine::general_purpose::STANDARD.decode(case);
            assert_eq!(
                decode_base64(case).ok(),
                strict.as_ref().ok().cloned(),
                "{case:?}"
            );
            if let Err(e) = strict {
                assert_eq!(decode_base64(case), Err(e.to_string()), "{case:?}");
            }
        }
        assert_eq!(
            decode_base64("QUJD QUJD"),
            Err("Invalid symbol 32, offset 4.".to_string())
        );
    }

    #[test]
    fn hashes_are_lowercase_hex_and_parse_back() {
        let h = sha256_hex(b"abc");
        assert_eq!(
            h,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(parse_hex(&h).map(|b| hex(&b)), Some(h.clone()));
        assert_eq!(parse_hex(&h.to_uppercase()).map(|b| hex(&b)), Some(h));
        for bad in ["", "ab", &"g".repeat(64), &"a".repeat(63), &"é".repeat(32)] {
            assert_eq!(parse_hex(bad), None, "{bad}");
        }
    }

    #[test]
    fn lines_are_counted_like_an_editor() {
        assert_eq!(count_lines(b""), 0);
        assert_eq!(count_lines(b"a"), 1);
        assert_eq!(count_lines(b"a\n"), 1);
        assert_eq!(count_lines(b"a\nb"), 2);
        assert_eq!(count_lines(b"\n\n"), 2);
        assert_eq!(count_lines(b"a\r\nb\r\n"), 2);
    }

    #[test]
    fn ranges_are_exact() {
        let t = b"one\ntwo\nthree\nfour";
        assert_eq!(line_range(t, 1, 1), (&b"one\n"[..], 1, 1));
        assert_eq!(line_range(t, 4, 4), (&b"four"[..], 4, 4));
        assert_eq!(line_range(t, 2, 3), (&b"two\nthree\n"[..], 2, 3));
        assert_eq!(line_range(t, 3, 99), (&b"three\nfour"[..], 3, 4));
        assert_eq!(line_range(t, 5, 9), (&b""[..], 5, 4));
        assert_eq!(line_range(t, 1, u64::MAX), (&t[..], 1, 4));
        let crlf = b"a\r\nb\r\nc\r\n";
        assert_eq!(line_range(crlf, 2, 2), (&b"b\r\n"[..], 2, 2));
        assert_eq!(line_range(crlf, 3, 3), (&b"c\r\n"[..], 3, 3));
        assert_eq!(line_range(b"", 1, 1), (&b""[..], 1, 0));
    }

    #[test]
    fn text_is_utf8_without_nul() {
        assert!(is_text("héllo\n".as_bytes()));
        assert!(!is_text(b"a\0b"));
        assert!(!is_text(&[0xff, 0xfe]));
    }
}
