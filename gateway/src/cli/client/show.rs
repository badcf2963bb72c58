//! `hypura show NAME`: a model's facts, capabilities and parameters, as
//! `ollama show` prints them; `--modelfile`, `--template`, `--parameters`
//! print only that piece.
use clap::Args;
use serde_json::{json, Value};

use super::{print_json, Client};

#[derive(Args, Debug)]
pub struct ShowArgs {
    /// The model's name (`name[:tag]`).
    name: String,
    /// Print the server's `/api/show` object.
    #[arg(long, conflicts_with_all = ["modelfile", "template", "parameters"])]
    json: bool,
    /// Print only the Modelfile.
    #[arg(long)]
    modelfile: bool,
    /// Print only the chat template.
    #[arg(long)]
    template: bool,
    /// Print only the parameters.
    #[arg(long)]
    parameters: bool,
}

pub fn show(args: ShowArgs) -> anyhow::Result<()> {
    let reply = Client::from_env()?.post("/api/show", &json!({"model": args.name}))?;
    if args.json {
        return print_json(&reply);
    }
    let piece = |key: &str| reply[key].as_str().unwrap_or_default().to_string();
    if args.modelfile {
        println!("{}", piece("modelfile"));
    } else if args.template {
        println!("{}", piece("template"));
    } else if args.parameters {
        println!("{}", piece("parameters"));
    } else {
        print!("{}", render(&reply));
    }
    Ok(())
}

/// Ollama's sections: Model (architecture, parameters, context length,
/// embedding length, quantization), Capabilities, Parameters.
pub fn render(reply: &Value) -> String {
    let info = &reply["model_info"];
    let details = &reply["details"];
    let arch = info["general.architecture"]
        .as_str()
        .or_else(|| details["family"].as_str())
        .unwrap_or_default();
    let arch_key = |k: &str| scalar(&info[format!("{arch}.{k}")]);
    let model = vec![
        ("architecture", arch.to_string()),
        ("parameters", scalar(&details["parameter_size"])),
        ("context length", arch_key("context_length")),
        ("embedding length", arch_key("embedding_length")),
        ("quantization", scalar(&details["quantization_level"])),
    ];
    let mut out = section("Model", &model);
    let capabilities: Vec<(&str, String)> = reply["capabilities"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[])
        .iter()
        .filter_map(Value::as_str)
        .map(|c| (c, String::new()))
        .collect();
    out.push_str(&section("Capabilities", &capabilities));
    let parameters: Vec<(&str, String)> = reply["parameters"]
        .as_str()
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(char::is_whitespace))
        .map(|(k, v)| (k, v.trim().to_string()))
        .collect();
    out.push_str(&section("Parameters", &parameters));
    out
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// `  Title` then `    key    value` rows (keys padded to the widest), then a
/// blank line; nothing for an empty section. Rows without a value are dropped
/// from two-column sections.
fn section(title: &str, rows: &[(&str, String)]) -> String {
    let rows: Vec<&(&str, String)> = rows
        .iter()
        .filter(|(_, v)| !v.is_empty() || rows.iter().all(|(_, v)| v.is_empty()))
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let width = rows
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = format!("  {title}\n");
    for (key, value) in rows {
        let line = format!("    {key:<width$}    {value}");
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_as_ollama_prints_them() {
        let reply = json!({
            "details": {"family": "llama", "parameter_size": "135M", "quantization_level": "Q4_1"},
            "model_info": {"general.architecture": "llama", "llama.context_length": 8192,
                           "llama.embedding_length": 576},
            "capabilities": ["completion", "tools"],
            "parameters": "num_ctx 4096",
        });
        assert_eq!(
            render(&reply),
            "  Model\n    architecture        llama\n    parameters          135M\n    \
             context length      8192\n    embedding length    576\n    quantization        Q4_1\n\n  \
             Capabilities\n    completion\n    tools\n\n  Parameters\n    num_ctx    4096\n\n"
        );
    }
}
