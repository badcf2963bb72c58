//! `hypura run NAME [PROMPT]` when NAME is not a file: chat through the
//! server (`/api/chat`, or `/api/generate` with `--raw`), streaming the reply
//! to stdout, as `ollama run` does; `--verbose` prints Ollama's statistics
//! on stderr after each reply. With stdin not a terminal and no prompt,
//! stdin is the prompt (as `ollama run` reads it).
//!
//! `--interactive` (or no prompt on a terminal) is `ollama run`'s prompt:
//! the conversation is kept; Ctrl-C stops the reply being written (what was
//! written stays in the conversation) and asks for the next message;
//! `"""` opens and closes a message of several lines; the commands are in
//! [`HELP`].
use std::io::{BufRead, IsTerminal, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

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
    /// Ollama's statistics on stderr after each reply.
    pub verbose: bool,
    /// Ollama `options` the command line set (temperature, num_predict, …).
    pub options: Map<String, Value>,
}

const HELP: &str = "Available Commands:
  /set            Set session variables
  /show           Show model information
  /load <model>   Load a session or model
  /save <model>   Save your current session
  /clear          Clear session context
  /bye            Exit
  /?, /help       Help for a command

Use \"\"\" to begin a multi-line message.
";

const SET_HELP: &str = "Available Commands:
  /set parameter ...     Set a parameter
  /set system <string>   Set system message
  /set verbose           Show LLM stats
  /set quiet             Disable LLM stats
";

const SHOW_HELP: &str = "Available Commands:
  /show info         Show details for this model
  /show license      Show model license
  /show modelfile    Show Modelfile for this model
  /show parameters   Show parameters for this model
  /show system       Show system message
  /show template     Show prompt template
";

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
    let mut session = Session {
        model: opts.model.clone(),
        system: opts.system.clone(),
        messages: Vec::new(),
        options: opts.options.clone(),
        verbose: opts.verbose,
    };
    let interactive = opts.interactive || prompt.is_none();
    if let Some(prompt) = &prompt {
        if opts.raw {
            return generate_raw(&client, &opts, prompt);
        }
        if opts.json {
            return session.turn_json(&client, prompt);
        }
        if !interactive {
            session.messages.push(message("user", prompt));
            return session.turn(&client, &Interrupts::none());
        }
    }
    let interrupts = Interrupts::install()?;
    if let Some(prompt) = &prompt {
        session.messages.push(message("user", prompt));
        session.turn(&client, &interrupts)?;
    }
    repl(&client, &mut session, &interrupts)
}

/// The conversation and the settings `/set` changes.
struct Session {
    model: String,
    system: Option<String>,
    /// The turns, the system prompt aside.
    messages: Vec<Value>,
    options: Map<String, Value>,
    verbose: bool,
}

fn message(role: &str, content: &str) -> Value {
    json!({"role": role, "content": content})
}

impl Session {
    fn request_messages(&self) -> Vec<Value> {
        let system = self.system.iter().map(|s| message("system", s));
        system.chain(self.messages.iter().cloned()).collect()
    }

    fn body(&self, stream: bool) -> Value {
        json!({
            "model": self.model,
            "messages": self.request_messages(),
            "options": self.options,
            "stream": stream,
        })
    }

    fn turn_json(&mut self, client: &Client, prompt: &str) -> anyhow::Result<()> {
        self.messages.push(message("user", prompt));
        print_json(&client.post("/api/chat", &self.body(false))?)
    }

    /// One exchange, its reply streamed out and added to the conversation;
    /// a stopped reply keeps what was written (none written: the message
    /// that asked for it goes too).
    fn turn(&mut self, client: &Client, interrupts: &Interrupts) -> anyhow::Result<()> {
        let mut reply = String::new();
        let mut done = None;
        let finished = interrupts.while_generating(|stop| {
            client.post_ndjson_until("/api/chat", &self.body(true), stop, |chunk| {
                let piece = chunk["message"]["content"].as_str().unwrap_or_default();
                reply.push_str(piece);
                print_piece(piece)?;
                if chunk["done"] == true {
                    done = Some(chunk.clone());
                }
                Ok(())
            })
        });
        match finished {
            Ok(_) => {
                println!();
                if let Some(done) = done.as_ref().filter(|_| self.verbose) {
                    eprint!("{}", summary(done));
                }
                if reply.is_empty() && done.is_none() {
                    self.messages.pop();
                } else {
                    self.messages.push(message("assistant", &reply));
                }
                Ok(())
            }
            Err(e) => {
                if !reply.is_empty() {
                    println!();
                }
                self.messages.pop();
                Err(e)
            }
        }
    }
}

/// SIGINT while a reply is written stops it; at the prompt it says how to
/// leave. `None` installs nothing (a one-shot `run`: Ctrl-C ends it).
struct Interrupts {
    stop: Arc<AtomicBool>,
    generating: Arc<AtomicBool>,
}

impl Interrupts {
    fn none() -> Interrupts {
        Interrupts {
            stop: Arc::new(AtomicBool::new(false)),
            generating: Arc::new(AtomicBool::new(false)),
        }
    }

    fn install() -> anyhow::Result<Interrupts> {
        let interrupts = Interrupts::none();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("handling Ctrl-C")?;
        // Registered before this returns: a SIGINT from now on is ours.
        let mut signals = runtime
            .block_on(async {
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            })
            .context("handling Ctrl-C")?;
        let (stop, generating) = (
            Arc::clone(&interrupts.stop),
            Arc::clone(&interrupts.generating),
        );
        std::thread::spawn(move || {
            runtime.block_on(async move {
                while signals.recv().await.is_some() {
                    if generating.load(Ordering::SeqCst) {
                        stop.store(true, Ordering::SeqCst);
                    } else {
                        eprint!("\nUse Ctrl + d or /bye to exit.\n>>> ");
                    }
                }
            })
        });
        Ok(interrupts)
    }

    /// Runs `work` with the stop flag that a SIGINT sets from now until it returns.
    fn while_generating<T>(&self, work: impl FnOnce(&AtomicBool) -> T) -> T {
        self.stop.store(false, Ordering::SeqCst);
        self.generating.store(true, Ordering::SeqCst);
        let result = work(&self.stop);
        self.generating.store(false, Ordering::SeqCst);
        result
    }
}

/// What one line (or a `"""` block) of input asks for.
#[derive(Debug, PartialEq)]
enum Input {
    Message(String),
    Command(String),
    Nothing,
    End,
}

/// Reads the next input: a line, or the lines of a `"""` block joined by
/// newlines (Ollama's rule: `"""` opens a block that ends at a line ending
/// in `"""`; one line may open and close it).
fn read_input(lines: &mut impl BufRead) -> anyhow::Result<Input> {
    prompt(">>> ");
    let Some(line) = read_line(lines)? else {
        return Ok(Input::End);
    };
    let trimmed = line.trim();
    if let Some(rest) = trimmed.strip_prefix("\"\"\"") {
        return Ok(match read_block(lines, rest)? {
            Some(text) if text.trim().is_empty() => Input::Nothing,
            Some(text) => Input::Message(text.trim().to_string()),
            None => Input::End,
        });
    }
    Ok(match trimmed {
        "" => Input::Nothing,
        text if text.starts_with('/') => Input::Command(text.to_string()),
        text => Input::Message(text.to_string()),
    })
}

/// The text of a `"""` block whose first line's rest is `first`; `None`
/// when input ends before its closing `"""`.
fn read_block(lines: &mut impl BufRead, first: &str) -> anyhow::Result<Option<String>> {
    if let Some(text) = first.strip_suffix("\"\"\"") {
        return Ok(Some(text.to_string()));
    }
    let mut text = format!("{first}\n");
    loop {
        prompt("... ");
        let Some(line) = read_line(lines)? else {
            return Ok(None);
        };
        let line = line.trim_end_matches(['\n', '\r']);
        match line.strip_suffix("\"\"\"") {
            Some(before) => {
                text.push_str(before);
                return Ok(Some(text));
            }
            None => {
                text.push_str(line);
                text.push('\n');
            }
        }
    }
}

fn read_line(lines: &mut impl BufRead) -> anyhow::Result<Option<String>> {
    let mut line = String::new();
    let n = lines.read_line(&mut line).context("reading stdin")?;
    Ok((n > 0).then_some(line))
}

fn prompt(text: &str) {
    eprint!("{text}");
    std::io::stderr().flush().ok();
}

fn repl(client: &Client, session: &mut Session, interrupts: &Interrupts) -> anyhow::Result<()> {
    let stdin = std::io::stdin();
    let mut lines = stdin.lock();
    loop {
        match read_input(&mut lines)? {
            Input::End => return Ok(()),
            Input::Nothing => continue,
            Input::Message(text) => {
                session.messages.push(message("user", &text));
                if let Err(e) = session.turn(client, interrupts) {
                    eprintln!("error: {e:#}");
                }
            }
            Input::Command(line) => {
                if line == "/bye" || line == "/exit" {
                    return Ok(());
                }
                if let Err(e) = command(client, session, &line, &mut lines) {
                    eprintln!("error: {e:#}");
                }
            }
        }
    }
}

/// A `/` command of the prompt.
fn command(
    client: &Client,
    session: &mut Session,
    line: &str,
    lines: &mut impl BufRead,
) -> anyhow::Result<()> {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["/?"] | ["/help"] => eprint!("{HELP}"),
        ["/?" | "/help", "set"] | ["/set"] => eprint!("{SET_HELP}"),
        ["/?" | "/help", "show"] | ["/show"] => eprint!("{SHOW_HELP}"),
        ["/clear"] => {
            session.messages.clear();
            eprintln!("Cleared session context");
        }
        ["/set", "verbose"] => {
            session.verbose = true;
            eprintln!("Set 'verbose' mode.");
        }
        ["/set", "quiet"] => {
            session.verbose = false;
            eprintln!("Set 'quiet' mode.");
        }
        ["/set", "parameter", name, values @ ..] if !values.is_empty() => {
            match parameter(name, values) {
                Ok(value) => {
                    session.options.insert(name.to_string(), value);
                    eprintln!("Set parameter '{name}' to '{}'", values.join(", "));
                }
                Err(why) => eprintln!("Couldn't set parameter: {why}"),
            }
        }
        ["/set", "parameter", ..] => eprint!("{}", PARAMETER_HELP),
        ["/set", "system", ..] => {
            let text = line
                .trim_start()
                .strip_prefix("/set")
                .map(str::trim_start)
                .and_then(|l| l.strip_prefix("system"))
                .unwrap_or_default()
                .trim();
            let text = match text.strip_prefix("\"\"\"") {
                Some(rest) => read_block(lines, rest)?.unwrap_or_default(),
                None => text.to_string(),
            };
            let text = text.trim();
            session.system = (!text.is_empty()).then(|| text.to_string());
            eprintln!("Set system message.");
        }
        ["/show", what] => show(client, session, what)?,
        ["/save", name] => {
            let mut body = json!({
                "model": name, "from": session.model, "messages": session.messages,
                "parameters": session.options, "stream": false,
            });
            if let Some(system) = &session.system {
                body["system"] = json!(system);
            }
            client.post("/api/create", &body)?;
            eprintln!("Created new model '{name}'");
        }
        ["/load", name] => {
            client.post("/api/show", &json!({ "model": name }))?;
            eprintln!("Loading model '{name}'");
            session.model = name.to_string();
            session.messages.clear();
        }
        _ => eprintln!(
            "Unknown command '{}'. Type /? for help",
            words.first().unwrap_or(&line)
        ),
    }
    Ok(())
}

const PARAMETER_HELP: &str = "Available Parameters:
  /set parameter seed <int>             Random number seed
  /set parameter num_predict <int>      Max number of tokens to predict
  /set parameter top_k <int>            Pick from top k num of tokens
  /set parameter top_p <float>          Pick token based on sum of probabilities
  /set parameter min_p <float>          Pick token based on top token probability * min_p
  /set parameter num_ctx <int>          Set the context size
  /set parameter temperature <float>    Set creativity level
  /set parameter repeat_penalty <float> How strongly to penalize repetitions
  /set parameter repeat_last_n <int>    Set how far back to look for repetitions
  /set parameter num_gpu <int>          The number of layers to send to the GPU
  /set parameter stop <string> <string> ...   Set the stop parameters
";

/// Ollama's options by type (api.Options), as `/set parameter` checks them.
const INT_OPTIONS: &[&str] = &[
    "num_keep",
    "seed",
    "num_predict",
    "top_k",
    "repeat_last_n",
    "mirostat",
    "num_ctx",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "num_thread",
];
const FLOAT_OPTIONS: &[&str] = &[
    "typical_p",
    "top_p",
    "min_p",
    "temperature",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "mirostat_tau",
    "mirostat_eta",
    "tfs_z",
];
const BOOL_OPTIONS: &[&str] = &[
    "penalize_newline",
    "numa",
    "low_vram",
    "f16_kv",
    "vocab_only",
    "use_mmap",
    "use_mlock",
];

/// A `/set parameter` value typed as Ollama's option `name` is.
fn parameter(name: &str, values: &[&str]) -> Result<Value, String> {
    let one = values.join(" ");
    if name == "stop" {
        return Ok(json!(values));
    }
    if INT_OPTIONS.contains(&name) {
        return one
            .parse::<i64>()
            .map(Value::from)
            .map_err(|_| format!("invalid int value [{one}]"));
    }
    if FLOAT_OPTIONS.contains(&name) {
        return one
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .map(Value::from)
            .ok_or_else(|| format!("invalid float value [{one}]"));
    }
    if BOOL_OPTIONS.contains(&name) {
        return one
            .parse::<bool>()
            .map(Value::from)
            .map_err(|_| format!("invalid bool value [{one}]"));
    }
    Err(format!("unknown parameter '{name}'"))
}

/// `/show WHAT`, from the server's `/api/show` and the session.
fn show(client: &Client, session: &Session, what: &str) -> anyhow::Result<()> {
    let reply = client.post("/api/show", &json!({ "model": session.model }))?;
    let text = |key: &str| reply[key].as_str().unwrap_or_default().to_string();
    match what {
        "info" => print!("{}", super::show::render(&reply)),
        "template" => println!("{}", text("template")),
        "modelfile" => println!("{}", text("modelfile")),
        "license" => match reply["license"].as_str() {
            Some(license) if !license.is_empty() => println!("{license}"),
            _ => println!("No license was specified for this model."),
        },
        "system" => match session
            .system
            .clone()
            .or_else(|| Some(text("system")).filter(|s| !s.is_empty()))
        {
            Some(system) => println!("{system}"),
            None => println!("No system message was specified for this model."),
        },
        "parameters" => print!("{}", parameters(&text("parameters"), &session.options)),
        _ => eprintln!("Unknown command '/show {what}'. Type /? for help"),
    }
    Ok(())
}

/// Ollama's `/show parameters`: the model's, then the session's.
fn parameters(model: &str, session: &Map<String, Value>) -> String {
    let mut out = String::from("Model defined parameters:\n");
    if model.trim().is_empty() {
        out.push_str("  No additional parameters were specified for this model.\n");
    }
    for line in model.lines().filter(|l| !l.trim().is_empty()) {
        out.push_str(&format!("  {line}\n"));
    }
    out.push('\n');
    if !session.is_empty() {
        out.push_str("User defined parameters:\n");
        let mut sorted: Vec<(&String, &Value)> = session.iter().collect();
        sorted.sort_by_key(|(name, _)| *name);
        for (name, value) in sorted {
            out.push_str(&format!("  {name:<30} {}\n", go_value(value)));
        }
        out.push('\n');
    }
    out
}

/// A value as Go's `%v` prints it: strings bare, lists `[a b]`, whole
/// floats without a point.
fn go_value(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Number(n) if n.is_f64() => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 1e21 => format!("{}", f as i64),
            _ => n.to_string(),
        },
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(go_value).collect::<Vec<_>>().join(" ")
        ),
        other => other.to_string(),
    }
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
            if opts.verbose {
                eprint!("{}", summary(chunk));
            }
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

/// Ollama's `--verbose` statistics (api.Metrics.Summary) from a final
/// chunk's counts and durations (ns): a line per figure the chunk has.
fn summary(done: &Value) -> String {
    let n = |key: &str| done[key].as_u64().unwrap_or(0);
    let rate = |count: u64, nanos: u64| count as f64 * 1e9 / nanos as f64;
    let mut out = String::new();
    if n("total_duration") > 0 {
        out += &format!(
            "total duration:       {}\n",
            go_duration(n("total_duration"))
        );
    }
    if n("load_duration") > 0 {
        out += &format!(
            "load duration:        {}\n",
            go_duration(n("load_duration"))
        );
    }
    let (prompt, prompt_ns) = (n("prompt_eval_count"), n("prompt_eval_duration"));
    if prompt > 0 {
        out += &format!("prompt eval count:    {prompt} token(s)\n");
    }
    if prompt_ns > 0 {
        out += &format!("prompt eval duration: {}\n", go_duration(prompt_ns));
        out += &format!(
            "prompt eval rate:     {:.2} tokens/s\n",
            rate(prompt, prompt_ns)
        );
    }
    let (eval, eval_ns) = (n("eval_count"), n("eval_duration"));
    if eval > 0 {
        out += &format!("eval count:           {eval} token(s)\n");
    }
    if eval_ns > 0 {
        out += &format!("eval duration:        {}\n", go_duration(eval_ns));
        out += &format!(
            "eval rate:            {:.2} tokens/s\n",
            rate(eval, eval_ns)
        );
    }
    out
}

/// Go's time.Duration.String(): `850ns`, `1.5µs`, `97.885315ms`,
/// `18.293521648s`, `2m43.589481292s`, `1h0m5s`.
fn go_duration(nanos: u64) -> String {
    /// `value / unit` with the remainder's digits, trailing zeros dropped.
    fn decimal(value: u64, unit: u64, digits: usize) -> String {
        let (whole, rest) = (value / unit, value % unit);
        if rest == 0 {
            return whole.to_string();
        }
        let fraction = format!("{rest:0digits$}");
        format!("{whole}.{}", fraction.trim_end_matches('0'))
    }
    const SECOND: u64 = 1_000_000_000;
    match nanos {
        0 => "0s".into(),
        1..=999 => format!("{nanos}ns"),
        1_000..=999_999 => format!("{}µs", decimal(nanos, 1_000, 3)),
        1_000_000..=999_999_999 => format!("{}ms", decimal(nanos, 1_000_000, 6)),
        _ => {
            let (hours, minutes) = (nanos / (3600 * SECOND), nanos / (60 * SECOND) % 60);
            let seconds = decimal(nanos % (60 * SECOND), SECOND, 9);
            match (hours, minutes) {
                (0, 0) => format!("{seconds}s"),
                (0, m) => format!("{m}m{seconds}s"),
                (h, m) => format!("{h}h{m}m{seconds}s"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_gos() {
        for (nanos, want) in [
            (0, "0s"),
            (850, "850ns"),
            (1_500, "1.5µs"),
            (97_885_315, "97.885315ms"),
            (105_000_000, "105ms"),
            (18_293_521_648, "18.293521648s"),
            (2_000_000_000, "2s"),
            (163_589_481_292, "2m43.589481292s"),
            (3_605_000_000_000, "1h0m5s"),
        ] {
            assert_eq!(go_duration(nanos), want, "{nanos}");
        }
    }

    #[test]
    fn verbose_statistics_read_as_ollamas() {
        let done = json!({"done": true, "total_duration": 1_500_000_000u64,
            "load_duration": 2_000_000, "prompt_eval_count": 26,
            "prompt_eval_duration": 130_000_000, "eval_count": 12,
            "eval_duration": 1_200_000_000u64});
        assert_eq!(
            summary(&done),
            "total duration:       1.5s\nload duration:        2ms\n\
             prompt eval count:    26 token(s)\nprompt eval duration: 130ms\n\
             prompt eval rate:     200.00 tokens/s\neval count:           12 token(s)\n\
             eval duration:        1.2s\neval rate:            10.00 tokens/s\n"
        );
        // A prompt read from the cache whole: no duration, no rate.
        let cached = json!({"eval_count": 1, "eval_duration": 1_000_000});
        assert_eq!(
            summary(&cached),
            "eval count:           1 token(s)\neval duration:        1ms\n\
             eval rate:            1000.00 tokens/s\n"
        );
    }

    fn input(text: &str) -> Vec<Input> {
        let mut lines = std::io::Cursor::new(text.as_bytes().to_vec());
        let mut out = Vec::new();
        loop {
            let next = read_input(&mut lines).unwrap();
            if next == Input::End {
                return out;
            }
            out.push(next);
        }
    }

    #[test]
    fn triple_quotes_hold_several_lines() {
        assert_eq!(
            input("\"\"\"\nline one\n  line two\n\"\"\"\nafter\n"),
            [
                Input::Message("line one\n  line two".into()),
                Input::Message("after".into())
            ]
        );
        assert_eq!(
            input("\"\"\"one line\"\"\"\n\"\"\"first\nlast\"\"\"\n"),
            [
                Input::Message("one line".into()),
                Input::Message("first\nlast".into())
            ]
        );
        assert_eq!(
            input("  \n/show info\n\"\"\"\nnever closed\n"),
            [Input::Nothing, Input::Command("/show info".into())]
        );
    }

    #[test]
    fn parameters_are_typed_as_ollamas_options() {
        assert_eq!(parameter("num_predict", &["3"]), Ok(json!(3)));
        assert_eq!(parameter("temperature", &["0.5"]), Ok(json!(0.5)));
        assert_eq!(parameter("stop", &["<a>", "b"]), Ok(json!(["<a>", "b"])));
        assert_eq!(parameter("use_mmap", &["false"]), Ok(json!(false)));
        assert_eq!(
            parameter("num_ctx", &["big"]),
            Err("invalid int value [big]".into())
        );
        assert_eq!(
            parameter("temperature", &["nan"]),
            Err("invalid float value [nan]".into())
        );
        assert_eq!(
            parameter("wizardry", &["1"]),
            Err("unknown parameter 'wizardry'".into())
        );
        let mut session = Map::new();
        session.insert("stop".into(), json!(["a", "b"]));
        session.insert("num_predict".into(), json!(3));
        session.insert("temperature".into(), json!(0.0));
        session.insert("top_p".into(), json!(0.5));
        assert_eq!(
            parameters(&format!("{:<30} 4096", "num_ctx"), &session),
            format!(
                "Model defined parameters:\n  {:<30} 4096\n\nUser defined parameters:\n  \
                 {:<30} 3\n  {:<30} [a b]\n  {:<30} 0\n  {:<30} 0.5\n\n",
                "num_ctx", "num_predict", "stop", "temperature", "top_p"
            )
        );
    }
}
