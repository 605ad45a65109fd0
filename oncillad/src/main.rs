//! `oncillad`: the Oncilla node daemon (see the library for what it runs).

fn main() -> std::process::ExitCode {
    oncillad::main_with(std::env::args_os())
}
