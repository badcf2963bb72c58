//! `hypura stop NAME`: unloads a model now, as `ollama stop` does (a
//! generate request with an empty prompt and `keep_alive: 0`).
use anyhow::bail;
use clap::Args;
use serde_json::json;

use super::{print_json, Client};

#[derive(Args, Debug)]
pub struct StopArgs {
    /// The model's name (`name[:tag]`).
    name: String,
    /// Print the server's reply object.
    #[arg(long)]
    json: bool,
}

pub fn stop(args: StopArgs) -> anyhow::Result<()> {
    let body = json!({"model": args.name, "prompt": "", "keep_alive": 0, "stream": false});
    let reply = match Client::from_env()?.post("/api/generate", &body) {
        Ok(reply) => reply,
        Err(e) if e.to_string().contains("not found") => {
            bail!("couldn't find model \"{}\" to stop", args.name)
        }
        Err(e) => return Err(e),
    };
    if args.json {
        print_json(&reply)?;
    }
    Ok(())
}
