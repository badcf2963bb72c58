//! `hypura`: the command-line entry point.
//!
//! - `hypura inspect MODEL`: what a GGUF file holds (see `cli/inspect.rs`).
//! - `hypura run MODEL`: generate text from a prompt or chat interactively (see `cli/run.rs`).
//! - `hypura serve [MODEL|DIR ...]`: Ollama- and OpenAI-compatible HTTP APIs over a pool of
//!   models (see `cli/serve.rs`, `server/`); with no model, SmolLM2 is fetched (`fetch.rs`);
//!   `--config FILE` reads the settings from TOML (`config.rs`).
mod cli;
mod config;
mod fetch;
mod server;

use clap::Parser;

fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,llama.cpp=error"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();

    let args = cli::Cli::parse();
    if let Err(e) = cli::dispatch(args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
