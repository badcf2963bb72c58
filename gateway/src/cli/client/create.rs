//! `hypura create NAME [-f Modelfile]`: makes a model from a Modelfile on a
//! running server, as `ollama create` does. The Modelfile is read here; a
//! `FROM` naming a GGUF file on this machine (relative to the Modelfile's
//! folder, `~/` for the home folder) is uploaded as a blob first (`HEAD`,
//! then `POST /api/blobs/sha256:…` when the server lacks it) and named in
//! `files`; any other `FROM` (a served model, a blob digest) goes as
//! `from`. The template, system prompt, parameters and messages go as
//! `/api/create`'s fields; its status lines are printed on stderr.
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use clap::Args;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use super::Client;
use crate::api::modelfile::{self, Modelfile};

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// The new model's name (`name[:tag]`).
    name: String,
    /// The Modelfile.
    #[arg(long, short = 'f', default_value = "Modelfile")]
    file: PathBuf,
    /// Quantize the weights (not supported: the server says so).
    #[arg(long, short = 'q')]
    quantize: Option<String>,
}

pub fn create(args: CreateArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading the Modelfile {}", args.file.display()))?;
    let file = modelfile::parse(&text)?;
    if !file.adapters.is_empty() {
        bail!("ADAPTER: LoRA adapters are not supported");
    }
    let client = Client::from_env()?;
    eprintln!("gathering model components");
    let folder = args.file.parent().unwrap_or(Path::new("."));
    let mut body = request(&args.name, &file);
    match local_file(folder, &file.from)? {
        Some(path) => {
            let digest = upload(&client, &path)?;
            let file_name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model.gguf".into());
            let mut files = Map::new();
            files.insert(file_name, json!(digest));
            body["files"] = Value::Object(files);
        }
        None => body["from"] = json!(file.from),
    }
    if let Some(quantize) = &args.quantize {
        body["quantize"] = json!(quantize);
    }
    client.post_ndjson("/api/create", &body, |line| {
        if let Some(status) = line["status"].as_str() {
            eprintln!("{status}");
        }
        Ok(())
    })
}

/// `/api/create`'s fields from the Modelfile, `from`/`files` aside.
fn request(name: &str, file: &Modelfile) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(name));
    body.insert("stream".into(), json!(true));
    if let Some(template) = &file.template {
        body.insert("template".into(), json!(template));
    }
    if let Some(system) = &file.system {
        body.insert("system".into(), json!(system));
    }
    if !file.parameters.is_empty() {
        body.insert("parameters".into(), Value::Object(file.parameters.clone()));
    }
    if !file.messages.is_empty() {
        let messages: Vec<Value> = file
            .messages
            .iter()
            .map(|(role, content)| json!({"role": role, "content": content}))
            .collect();
        body.insert("messages".into(), json!(messages));
    }
    Value::Object(body)
}

/// The file `from` names on this machine, if it names one (a served
/// model's name or a digest names none).
fn local_file(folder: &Path, from: &str) -> anyhow::Result<Option<PathBuf>> {
    if from.starts_with("sha256:") || from.starts_with("@sha256:") {
        return Ok(None);
    }
    let path = match from.strip_prefix("~/") {
        Some(rest) => match std::env::var_os("HOME") {
            Some(home) => PathBuf::from(home).join(rest),
            None => bail!("FROM {from}: HOME is not set"),
        },
        None => folder.join(from),
    };
    if path.is_dir() {
        bail!("FROM {from}: a folder; hypura creates models from one GGUF file");
    }
    Ok(path.is_file().then_some(path))
}

/// Uploads `path` as a blob unless the server has it; its digest.
fn upload(client: &Client, path: &Path) -> anyhow::Result<String> {
    let open = || std::fs::File::open(path).with_context(|| format!("reading {}", path.display()));
    let mut hasher = Sha256::new();
    std::io::copy(&mut open()?, &mut hasher)
        .with_context(|| format!("reading {}", path.display()))?;
    let hex: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let digest = format!("sha256:{hex}");
    let route = format!("/api/blobs/{digest}");
    if !client.exists(&route)? {
        let bytes = std::fs::metadata(path)?.len();
        client.post_file(&route, open()?, bytes)?;
    }
    eprintln!("copying file {digest} 100%");
    Ok(digest)
}
