//! Command-line interface: one module per subcommand.
mod bench;
mod client;
mod gpu;
mod inspect;
mod keys;
mod output;
mod profile;
mod progress;
mod run;
mod runner;
mod serve;
pub mod threads;

use clap::{Parser, Subcommand};

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
    /// Serve a model under a second name (client).
    Cp(client::cp::CpArgs),
    /// Make a model from a Modelfile: a template, system prompt, parameters
    /// over a GGUF file or a served model (client).
    Create(client::create::CreateArgs),
    /// Show what a GGUF model holds: architecture, parameters, bytes per tensor role.
    Inspect(inspect::InspectArgs),
    /// Named API keys of a keys file: add (prints the key once), list, remove.
    Keys(keys::KeysArgs),
    /// List the models a running server serves (client of HYPURA_HOST / OLLAMA_HOST).
    #[command(visible_alias = "ls")]
    List(client::list::ListArgs),
    /// Measure this machine (CPU, RAM, GPUs, disk) once and cache the result.
    Profile(profile::ProfileArgs),
    /// List the models in memory: residency, bytes per tier, slots (client).
    Ps(client::ps::PsArgs),
    /// Have a running server pull a model from a URL or a path (client).
    Pull(client::pull::PullArgs),
    /// Push a model to a registry: not supported (hypura serves local files).
    Push(PushArgs),
    /// Remove models from a running server (the files stay) (client).
    Rm(client::rm::RmArgs),
    /// Generate text from a prompt, or chat with --interactive; a model name
    /// instead of a file chats through a running server.
    Run(run::RunArgs),
    /// Run one model for a server (started by `hypura serve`, not by hand).
    #[command(hide = true)]
    Runner(runner::RunnerArgs),
    /// Serve models over Ollama- and OpenAI-compatible HTTP APIs.
    Serve(Box<serve::ServeArgs>),
    /// Show a served model's facts, capabilities and parameters (client).
    Show(client::show::ShowArgs),
    /// Unload a model from a running server now (client).
    Stop(client::stop::StopArgs),
}

pub fn dispatch(cli: Cli) -> anyhow::Result<()> {
    // `serve` installs its own, in the format its flags and file ask for,
    // and a runner the one its server passes on.
    if !matches!(cli.command, Command::Serve(_) | Command::Runner(_)) {
        crate::telemetry::init_text_logs();
    }
    match cli.command {
        Command::Bench(args) => bench::bench(args),
        Command::Cp(args) => client::cp::cp(args),
        Command::Create(args) => client::create::create(args),
        Command::Inspect(args) => inspect::inspect(args),
        Command::Keys(args) => keys::keys(args),
        Command::List(args) => client::list::list(args),
        Command::Profile(args) => profile::profile(args),
        Command::Ps(args) => client::ps::ps(args),
        Command::Pull(args) => client::pull::pull(args),
        Command::Push(args) => push(args),
        Command::Rm(args) => client::rm::rm(args),
        Command::Run(args) => run::run(args),
        Command::Runner(args) => runner::runner(args),
        Command::Serve(args) => serve::serve(*args),
        Command::Show(args) => client::show::show(args),
        Command::Stop(args) => client::stop::stop(args),
    }
}

/// `ollama push`'s arguments, accepted so that scripts get the reason.
#[derive(clap::Args, Debug)]
pub struct PushArgs {
    /// The model's name.
    name: String,
    /// (ignored)
    #[arg(long)]
    insecure: bool,
}

fn push(args: PushArgs) -> anyhow::Result<()> {
    anyhow::bail!(
        "cannot push {}: pushing models to a registry is not supported; hypura serves local \
         GGUF files (`hypura show {} --modelfile` names the file to copy)",
        args.name,
        args.name
    )
}
