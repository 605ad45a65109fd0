//! Quoting what a peer sent inside an error message, bounded: a message
//! must never grow with the input (a 100 kB name once made the reply too
//! large for an HTTP/2 header and the client saw a protocol error instead
//! of the reason). This module only formats; it never decides validity.

use std::fmt;

/// The most characters of peer input an error message quotes.
pub const ECHO_CHARS: usize = 64;

/// Peer input as an error message quotes it: `"text"` when at most
/// [`ECHO_CHARS`] characters, else the first ones quoted and
/// `... (N bytes)`. Its `Display` is bounded whatever the input.
#[derive(Clone, Copy)]
pub struct Echo<'a>(pub &'a str);

impl fmt::Display for Echo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.char_indices().nth(ECHO_CHARS) {
            None => write!(f, "{:?}", self.0),
            Some((cut, _)) => write!(f, "{:?}... ({} bytes)", &self.0[..cut], self.0.len()),
        }
    }
}

/// [`Echo`] as a string, for errors that keep their message.
pub fn echo(input: &str) -> String {
    Echo(input).to_string()
}

/// The first [`ECHO_CHARS`] characters of `input`, unquoted: for a field
/// a client reads back (a node named in a status's details), where short
/// input must come back as it was.
pub fn clip(input: &str) -> &str {
    input
        .char_indices()
        .nth(ECHO_CHARS)
        .map_or(input, |(cut, _)| &input[..cut])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_input_is_quoted_whole() {
        assert_eq!(echo("node-1"), "\"node-1\"");
        assert_eq!(echo(""), "\"\"");
    }

    #[test]
    fn long_input_is_cut_and_sized() {
        let long = "x".repeat(100_000);
        let e = echo(&long);
        assert_eq!(e, format!("\"{}\"... (100000 bytes)", "x".repeat(64)));
        // Multi-byte characters are never split.
        let wide = "é".repeat(100);
        assert!(echo(&wide).ends_with("... (200 bytes)"));
        assert!(echo(&wide).len() < 200);
        assert_eq!(clip("node-1"), "node-1");
        assert_eq!(clip(&long).len(), ECHO_CHARS);
    }
}
