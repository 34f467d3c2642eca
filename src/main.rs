//! `rate-ctl`: the agent, the config store, its REST service, the API
//! client and the command line (docs/ARCHITECTURE.md has the code map).

mod agent;
mod cli;
mod client;
mod fleet;
mod serve;
mod signal;
mod store;

fn main() -> std::process::ExitCode {
    cli::main()
}
