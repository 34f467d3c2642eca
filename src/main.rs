//! `rate-ctl`: the agent, the config store client and shared-memory tools.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
