//! `hypura`: the command-line entry point (the subcommands live in `hypura::cli`).
//!
//! - `hypura inspect MODEL`: what a GGUF file holds.
//! - `hypura run MODEL`: generate text from a prompt or chat interactively.
//! - `hypura serve [MODEL|DIR ...]`: Ollama- and OpenAI-compatible HTTP APIs over a pool of
//!   models; with no model, SmolLM2 is fetched; `--config FILE` reads the settings from TOML.
use clap::Parser;

fn main() {
    // First: libgomp has read its spin count by now; start again with a
    // short one unless the user set one (`cli::threads`).
    hypura::cli::threads::start_with_short_openmp_spin();
    // Before any thread starts (the environment is process-wide):
    // HYPURA_PIN_STREAM=1 lets the stream cache register the layers a
    // prompt pass finds whole with the GPU's driver, so a prompt's copies of
    // them run at the pinned speed (`llama_tiered::tiered::pinning`, off by
    // default: on the H200 it did not pay). Runners inherit it.
    if std::env::var_os("HYPURA_PIN_STREAM").is_some_and(|v| v == "1") {
        std::env::set_var(llama_tiered::llama::device::REGISTER_HOST_ENV, "1");
    }
    // The log subscriber is installed by `dispatch`: `serve` chooses its format.
    let args = hypura::cli::Cli::parse();
    if let Err(e) = hypura::cli::dispatch(args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
