//! `hypura list` (`ls`): the models the server can serve, as `ollama list`.
use clap::Args;
use serde_json::Value;

use super::format::{human_bytes, human_time_text, short_id, table};
use super::{print_json, Client};

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Print the server's `/api/tags` object instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn list(args: ListArgs) -> anyhow::Result<()> {
    let reply = Client::from_env()?.get("/api/tags")?;
    if args.json {
        return print_json(&reply);
    }
    print!("{}", render(&reply, chrono::Utc::now()));
    Ok(())
}

/// NAME ID SIZE MODIFIED, one row per model.
pub fn render(reply: &Value, now: chrono::DateTime<chrono::Utc>) -> String {
    let models = reply["models"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let rows: Vec<Vec<String>> = models
        .iter()
        .map(|m| {
            vec![
                m["name"].as_str().unwrap_or_default().to_string(),
                short_id(m["digest"].as_str().unwrap_or_default()),
                human_bytes(m["size"].as_u64().unwrap_or(0)),
                m["modified_at"]
                    .as_str()
                    .map_or("-".into(), |t| human_time_text(t, now)),
            ]
        })
        .collect();
    table(&["NAME", "ID", "SIZE", "MODIFIED"], &rows)
}
