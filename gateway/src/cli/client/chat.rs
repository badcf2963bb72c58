//! `hypura run NAME [PROMPT]` when NAME is not a file: chat through the
//! server (`/api/chat`, or `/api/generate` with `--raw`), streaming the reply
//! to stdout and a summary to stderr as the file mode does. Without a prompt:
//! a REPL keeping the conversation (`/clear`, `/bye`); with stdin not a
//! terminal, stdin is the prompt (as `ollama run` reads it).
use std::io::{BufRead, IsTerminal, Read, Write};

use anyhow::Context as _;
use serde_json::{json, Map, Value};

use super::{print_json, Client};

/// What `run` asks of the server.
#[derive(Debug, Clone)]
pub struct ChatOptions {
    pub model: String,
    pub prompt: Option<String>,
    pub system: Option<String>,
    /// Send the prompt as is (`/api/generate` with `raw`).
    pub raw: bool,
    pub interactive: bool,
    /// One JSON object (the server's reply with `stream: false`).
    pub json: bool,
    /// Ollama `options` (temperature, top_k, num_predict, …).
    pub options: Map<String, Value>,
}

pub fn run(opts: ChatOptions) -> anyhow::Result<()> {
    let client = Client::from_env()?;
    let mut prompt = opts.prompt.clone();
    if prompt.is_none() && !opts.interactive && !std::io::stdin().is_terminal() {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading stdin")?;
        prompt = Some(text.trim_end().to_string());
    }
    let mut history: Vec<Value> = opts
        .system
        .iter()
        .map(|s| json!({"role": "system", "content": s}))
        .collect();
    if let Some(prompt) = &prompt {
        if opts.raw {
            return generate_raw(&client, &opts, prompt);
        }
        history.push(json!({"role": "user", "content": prompt}));
        turn(&client, &opts, &mut history)?;
        if !opts.interactive {
            return Ok(());
        }
    }
    repl(&client, &opts, &mut history)
}

fn repl(client: &Client, opts: &ChatOptions, history: &mut Vec<Value>) -> anyhow::Result<()> {
    let stdin = std::io::stdin();
    loop {
        eprint!(">>> ");
        std::io::stderr().flush().ok();
        let mut line = String::new();
        if stdin.lock().read_line(&mut line).context("reading stdin")? == 0 {
            return Ok(());
        }
        match line.trim() {
            "" => continue,
            "/bye" | "/exit" => return Ok(()),
            "/clear" => {
                history.retain(|m| m["role"] == "system");
                eprintln!("Cleared session context");
                continue;
            }
            text => history.push(json!({"role": "user", "content": text})),
        }
        turn(client, opts, history)?;
    }
}

/// One exchange: the reply streamed out and added to `history`.
fn turn(client: &Client, opts: &ChatOptions, history: &mut Vec<Value>) -> anyhow::Result<()> {
    let mut body = json!({
        "model": opts.model,
        "messages": history,
        "options": opts.options,
        "stream": !opts.json,
    });
    if opts.json {
        let reply = client.post("/api/chat", &body)?;
        let content = reply["message"]["content"].clone();
        history.push(json!({"role": "assistant", "content": content}));
        return print_json(&reply);
    }
    let mut reply = String::new();
    body["stream"] = json!(true);
    client.post_ndjson("/api/chat", &body, |chunk| {
        let piece = chunk["message"]["content"].as_str().unwrap_or_default();
        reply.push_str(piece);
        print_piece(piece)?;
        if chunk["done"] == true {
            println!();
            eprintln!("{}", summary(chunk));
        }
        Ok(())
    })?;
    history.push(json!({"role": "assistant", "content": reply}));
    Ok(())
}

fn generate_raw(client: &Client, opts: &ChatOptions, prompt: &str) -> anyhow::Result<()> {
    let body = json!({
        "model": opts.model,
        "prompt": prompt,
        "raw": true,
        "options": opts.options,
        "stream": !opts.json,
    });
    if opts.json {
        return print_json(&client.post("/api/generate", &body)?);
    }
    client.post_ndjson("/api/generate", &body, |chunk| {
        print_piece(chunk["response"].as_str().unwrap_or_default())?;
        if chunk["done"] == true {
            println!();
            eprintln!("{}", summary(chunk));
        }
        Ok(())
    })
}

fn print_piece(piece: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(piece.as_bytes())
        .and_then(|_| out.flush())
        .context("writing to stdout")
}

/// The file mode's summary line, from a final chunk's counts and durations (ns).
fn summary(done: &Value) -> String {
    let rate = |count: &str, nanos: &str| {
        let n = done[count].as_u64().unwrap_or(0);
        let ns = done[nanos].as_u64().unwrap_or(0);
        let per_second = if ns > 0 {
            n as f64 * 1e9 / ns as f64
        } else {
            0.0
        };
        (n, per_second)
    };
    let (prompt, prompt_rate) = rate("prompt_eval_count", "prompt_eval_duration");
    let (generated, rate) = rate("eval_count", "eval_duration");
    format!(
        "prompt: {prompt} tokens, {prompt_rate:.1} tok/s | generated: {generated} tokens, {rate:.1} tok/s"
    )
}
