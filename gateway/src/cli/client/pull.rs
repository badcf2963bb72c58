//! `hypura pull MODEL`: asks the server to pull a model (an http(s) URL of a
//! `.gguf`, or a path on the server's machine) and shows its progress as
//! `ollama pull` does: one line per step, a progress bar while bytes move.
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Value};

use super::{print_json, Client};

#[derive(Args, Debug)]
pub struct PullArgs {
    /// An http(s) URL of a `.gguf` file, or a path of one on the server's machine.
    model: String,
    /// The name to serve it under (default: the file's stem, `:latest`).
    #[arg(long)]
    name: Option<String>,
    /// Accept a TLS certificate that does not verify.
    #[arg(long)]
    insecure: bool,
    /// Print the server's progress objects (NDJSON) instead of a progress bar.
    #[arg(long)]
    json: bool,
}

pub fn pull(args: PullArgs) -> anyhow::Result<()> {
    let mut body = json!({"model": args.model, "stream": true, "insecure": args.insecure});
    if let Some(name) = &args.name {
        body["name"] = json!(name);
    }
    let client = Client::from_env()?;
    if args.json {
        return client.post_ndjson("/api/pull", &body, print_json);
    }
    let mut progress = Progress::default();
    let result = client.post_ndjson("/api/pull", &body, |line| {
        progress.show(line);
        Ok(())
    });
    progress.finish();
    result
}

/// The current step: its status and, while bytes move, its bar.
#[derive(Default)]
struct Progress {
    status: String,
    bar: Option<ProgressBar>,
}

impl Progress {
    fn show(&mut self, line: &Value) {
        let status = line["status"].as_str().unwrap_or_default();
        let total = line["total"].as_u64();
        if status != self.status {
            self.finish();
            self.status = status.to_string();
            match total {
                Some(total) => self.bar = Some(bar(status, total)),
                None => eprintln!("{status}"),
            }
        }
        if let (Some(bar), Some(completed)) = (&self.bar, line["completed"].as_u64()) {
            bar.set_position(completed);
        }
    }

    /// Ends the current bar, leaving its last state on screen (or, when
    /// stderr is not a terminal and no bar was drawn, its status line).
    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            if bar.is_hidden() {
                eprintln!(
                    "{} {}/{}",
                    self.status,
                    bar.position(),
                    bar.length().unwrap_or(0)
                );
            } else {
                bar.finish();
            }
        }
    }
}

/// Ollama's pull bar: `status  45% ▕████      ▏ 44 MB/98 MB  12 MB/s 3s`.
fn bar(status: &str, total: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} {percent:>3}% ▕{bar:25}▏ {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec:>10} {eta}",
        )
        .expect("static template")
        .progress_chars("██ "),
    );
    bar.set_message(status.to_string());
    bar
}
