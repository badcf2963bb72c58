//! `hypura runner --socket PATH`: one model for a server, in a process of
//! its own (started by `hypura serve`; see [`crate::pool::runner`]).
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;

#[derive(Args, Debug)]
pub struct RunnerArgs {
    /// The server's Unix socket to connect to.
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// How to write log lines (the server's format).
    #[arg(long, value_enum, default_value = "text")]
    log_format: crate::telemetry::LogFormat,
}

pub fn runner(args: RunnerArgs) -> anyhow::Result<()> {
    let _telemetry = crate::telemetry::init(&crate::telemetry::TelemetrySettings {
        log_format: args.log_format,
        otlp: None,
    })?;
    // Die with the server, even if it is killed: the signal follows the
    // server's thread that started this process (one that lives as long
    // as the server). If it is already gone, go now.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .context("setting the parent-death signal")?;
    if nix::unistd::getppid() == nix::unistd::Pid::from_raw(1) {
        anyhow::bail!("the server that started this runner is gone");
    }
    // llama.cpp's backends (a GPU context included) before the server
    // measures this idle runner: they are part of every runner's overhead.
    let devices = llama_tiered::llama::gpu_devices();
    tracing::debug!(
        "runner {}: {} GPU device(s)",
        std::process::id(),
        devices.len()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    {
        // A hangup (the terminal of a server run in the foreground closed)
        // reaches the runners too: they live and die with the server.
        let _in_runtime = runtime.enter();
        // Registered for good: dropping the listener keeps the handler.
        let _ = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("handling SIGHUP")?;
    }
    runtime
        .block_on(crate::pool::runner::host::serve(&args.socket))
        .with_context(|| format!("serving the server at {}", args.socket.display()))
}
