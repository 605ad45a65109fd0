//! Comparing secrets (tokens, credentials, access keys) without telling an
//! attacker, through timing, how much of a guess was right. Pure: this
//! module never holds, stores or logs a secret.

/// Compares two secrets in time that depends only on their lengths: every
/// byte is looked at (`black_box` keeps the optimizer from stopping at the
/// first difference). Every comparison of a token, credential or access
/// key goes through here.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .fold(0u8, |acc, (x, y)| std::hint::black_box(acc | (x ^ y)))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_only_when_every_byte_and_the_length_agree() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"abcd"));
        assert!(ct_eq(b"", b""));
    }
}
