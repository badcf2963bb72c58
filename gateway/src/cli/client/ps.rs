//! `hypura ps`: the models in memory, as `ollama ps` lists them, plus where
//! their weights are (residency, bytes per tier) and their slots; with an
//! admin key (or on a server that asks for none), who holds each model's
//! slots and how many of each user's requests wait (`GET /api/usage`).
use clap::Args;
use serde_json::Value;

use super::format::{human_bytes, human_time_text, processor, short_id, table};
use super::{print_json, Client};

#[derive(Args, Debug)]
pub struct PsArgs {
    /// Print the server's `/api/ps` object instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn ps(args: PsArgs) -> anyhow::Result<()> {
    let client = Client::from_env()?;
    let reply = client.get("/api/ps")?;
    if args.json {
        return print_json(&reply);
    }
    print!("{}", render(&reply, chrono::Utc::now()));
    // Admins only where keys are in use, and hypura's alone: a refusal or an
    // Ollama server (404) leaves the users out.
    if let Ok(usage) = client.get("/api/usage") {
        print!("{}", render_users(&usage));
    }
    Ok(())
}

/// Who holds each model's slots and who waits for them, from
/// `/api/usage`'s `models`: a row per model and user with requests running
/// or waiting, after a blank line; nothing when nobody has any.
pub fn render_users(usage: &Value) -> String {
    let models = usage["models"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let rows: Vec<Vec<String>> = models
        .iter()
        .flat_map(|m| {
            let users = m["users"].as_array().map(Vec::as_slice).unwrap_or(&[]);
            users.iter().filter_map(move |u| {
                let running = u["running"].as_u64().unwrap_or(0);
                let waiting = u["waiting"].as_u64().unwrap_or(0);
                (running + waiting > 0).then(|| {
                    vec![
                        text(&m["model"]),
                        text(&u["user"]),
                        running.to_string(),
                        waiting.to_string(),
                    ]
                })
            })
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    format!(
        "\n{}",
        table(&["MODEL", "USER", "RUNNING", "WAITING"], &rows)
    )
}

/// The columns of `ollama ps` (NAME ID SIZE PROCESSOR … CONTEXT UNTIL) with
/// hypura's RESIDENCY, GPU, RAM, STREAM (weight bytes per tier), SLOTS
/// (requests decoding/slots, then `+N` waiting) and TOK/S (recent decode
/// rate) between them; a column the server does not report is `-`.
pub fn render(reply: &Value, now: chrono::DateTime<chrono::Utc>) -> String {
    let models = reply["models"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let rows: Vec<Vec<String>> = models
        .iter()
        .map(|m| {
            let size = m["size"].as_u64().unwrap_or(0);
            let size_vram = m["size_vram"].as_u64().unwrap_or(0);
            let tier = |t: &str| m["tier_bytes"][t].as_u64().map_or("-".into(), human_bytes);
            let until = match m["expires_at"].as_str() {
                Some(t) => match chrono::DateTime::parse_from_rfc3339(t) {
                    Ok(at) if at < now => "Stopping...".to_string(),
                    _ => human_time_text(t, now),
                },
                None => "-".into(),
            };
            vec![
                text(&m["name"]),
                short_id(m["digest"].as_str().unwrap_or_default()),
                human_bytes(size),
                processor(size, size_vram),
                m["residency"].as_str().unwrap_or("-").to_string(),
                tier("gpu"),
                tier("ram"),
                tier("stream"),
                slots(&m["slots"]),
                m["slots"]["decode_tokens_per_second"]
                    .as_f64()
                    .map_or("-".into(), |r| format!("{r:.1}")),
                m["context_length"]
                    .as_u64()
                    .map_or("-".into(), |n| n.to_string()),
                until,
            ]
        })
        .collect();
    table(
        &[
            "NAME",
            "ID",
            "SIZE",
            "PROCESSOR",
            "RESIDENCY",
            "GPU",
            "RAM",
            "STREAM",
            "SLOTS",
            "TOK/S",
            "CONTEXT",
            "UNTIL",
        ],
        &rows,
    )
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// `active/parallel`, with `+queued` when requests wait.
fn slots(s: &Value) -> String {
    let (Some(active), Some(parallel)) = (s["active"].as_u64(), s["parallel"].as_u64()) else {
        return "-".into();
    };
    match s["queued"].as_u64().unwrap_or(0) {
        0 => format!("{active}/{parallel}"),
        queued => format!("{active}/{parallel} +{queued}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_row_per_model_with_tier_bytes_and_slots() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-12-01T05:00:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let reply = json!({"models": [{
            "name": "SmolLM2-135M-Instruct.Q4_1:latest", "digest": "b179c9523d0e6a0f98a3",
            "size": 98_000_000u64, "size_vram": 0, "residency": "full",
            "tier_bytes": {"gpu": 0, "ram": 98_000_000u64, "stream": 0},
            "slots": {"active": 1, "queued": 2, "parallel": 4, "decode_tokens_per_second": 41.26},
            "context_length": 4096, "expires_at": "2026-12-01T05:04:59.5Z"
        }]});
        assert_eq!(
            render(&reply, now),
            "NAME                                 ID              SIZE     PROCESSOR    RESIDENCY    GPU    RAM      STREAM    SLOTS     TOK/S    CONTEXT    UNTIL\n\
             SmolLM2-135M-Instruct.Q4_1:latest    b179c9523d0e    98 MB    100% CPU     full         0 B    98 MB    0 B       1/4 +2    41.3     4096       4 minutes from now\n"
        );
    }

    #[test]
    fn a_row_per_user_holding_or_waiting_for_a_slot() {
        let usage = json!({"users": [], "models": [
            {"model": "smol:latest", "users": [
                {"user": "alice", "running": 1, "waiting": 0},
                {"user": "batch", "running": 1, "waiting": 38},
                {"user": "idle", "running": 0, "waiting": 0}
            ]},
            {"model": "quiet:latest", "users": [{"user": "bob", "running": 0, "waiting": 0}]}
        ]});
        assert_eq!(
            render_users(&usage),
            "\nMODEL          USER     RUNNING    WAITING\n\
             smol:latest    alice    1          0\n\
             smol:latest    batch    1          38\n"
        );
        let nobody = json!({"users": [], "models": [{"model": "quiet:latest", "users": []}]});
        assert_eq!(render_users(&nobody), "");
    }
}
