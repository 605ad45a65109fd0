//! JSON for scripts (`--json`): pretty, on stdout.

/// Prints `v` as pretty JSON on stdout.
pub fn print(v: &serde_json::Value) {
    println!("{}", pretty(v));
}

/// `v` as pretty JSON (what [`print`] prints, without the newline).
pub fn pretty(v: &serde_json::Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}
