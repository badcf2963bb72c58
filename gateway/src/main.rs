//! `hypura`: the command-line entry point (the subcommands live in `hypura::cli`).
//!
//! - `hypura inspect MODEL`: what a GGUF file holds.
//! - `hypura run MODEL`: generate text from a prompt or chat interactively.
//! - `hypura serve [MODEL|DIR ...]`: Ollama- and OpenAI-compatible HTTP APIs over a pool of
//!   models; with no model, SmolLM2 is fetched; `--config FILE` reads the settings from TOML.
use clap::Parser;

fn main() {
    // The log subscriber is installed by `dispatch`: `serve` chooses its format.
    let args = hypura::cli::Cli::parse();
    if let Err(e) = hypura::cli::dispatch(args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
