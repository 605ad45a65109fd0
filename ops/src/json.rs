//! JSON for scripts (`--json`): pretty, on stdout.

/// Prints `v` as pretty JSON on stdout.
pub fn print(v: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}
