//! Command-line interface: one module per subcommand.
mod bench;
mod inspect;
mod profile;
mod progress;
mod run;
mod serve;

use clap::{Parser, Subcommand};

pub(crate) use inspect::find_profile;

#[derive(Parser, Debug)]
#[command(
    name = "hypura",
    version,
    about = "Run GGUF models bigger than memory, several at once, on one box"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Measure decode speed as planned, beside the planner's prediction.
    Bench(bench::BenchArgs),
    /// Show what a GGUF model holds: architecture, parameters, bytes per tensor role.
    Inspect(inspect::InspectArgs),
    /// Measure this machine (CPU, RAM, GPUs, disk) once and cache the result.
    Profile(profile::ProfileArgs),
    /// Generate text from a prompt, or chat with --interactive.
    Run(run::RunArgs),
    /// Serve models over Ollama- and OpenAI-compatible HTTP APIs.
    Serve(serve::ServeArgs),
}

pub fn dispatch(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Bench(args) => bench::bench(args),
        Command::Inspect(args) => inspect::inspect(args),
        Command::Profile(args) => profile::profile(args),
        Command::Run(args) => run::run(args),
        Command::Serve(args) => serve::serve(args),
    }
}
