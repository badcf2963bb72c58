//! `hypura` as a drop-in for the `ollama` command line, driving the real
//! binary against a live server of SmolLM2: `serve` listening where
//! `HYPURA_HOST`/`OLLAMA_HOST` say (a client given `0.0.0.0:PORT` dials
//! loopback); `rm`, `cp`, `create -f Modelfile`, `push`; `run`'s prompt
//! (`/set`, `/show`, `/save`, `/clear`, `"""`, Ctrl-C stopping a reply and
//! keeping the chat, `--verbose`); the default model's short names.
#[path = "../common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{profile_cache_dir, smollm2, wait_until, Server, MODEL};
use hypura::api::modelfile;
use serde_json::{json, Value};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `hypura ARGS` with only the `env` given of HYPURA_HOST, OLLAMA_HOST and
/// HYPURA_API_KEY, `stdin` written to it.
fn hypura(env: &[(&str, &str)], args: &[&str], stdin: &str) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hypura"));
    cmd.args(args)
        .env_remove("HYPURA_HOST")
        .env_remove("OLLAMA_HOST")
        .env_remove("HYPURA_API_KEY")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn hypura");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// `hypura ARGS` against `server`; asserts success; its stdout and stderr.
fn ok(server: &Server, args: &[&str], stdin: &str) -> (String, String) {
    let out = hypura(&[("HYPURA_HOST", &server.base)], args, stdin);
    assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    (text(&out.stdout), text(&out.stderr))
}

/// `hypura serve ARGS` with `env`, in `dir`; killed when dropped.
struct Served {
    child: Child,
    /// `http://ADDR:PORT` as it says it listens.
    listening: String,
}

impl Served {
    fn start(args: &[&str], env: &[(&str, &str)], dir: &Path) -> Served {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hypura"))
            .arg("serve")
            .args(args)
            .current_dir(dir)
            .env_remove("HYPURA_HOST")
            .env_remove("OLLAMA_HOST")
            .env_remove("HYPURA_API_KEY")
            .env("HYPURA_CACHE_DIR", profile_cache_dir())
            .env("RUST_LOG", "warn,llama.cpp=error")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn hypura serve");
        let mut log = String::new();
        for line in BufReader::new(child.stderr.take().unwrap()).lines() {
            let line = line.unwrap();
            log.push_str(&line);
            log.push('\n');
            if let Some(url) = line.strip_prefix("hypura: listening on ") {
                return Served {
                    child,
                    listening: url.trim().to_string(),
                };
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("hypura serve {args:?} did not start:\n{log}");
    }

    fn port(&self) -> &str {
        self.listening.rsplit(':').next().unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn serve_listens_where_hypura_host_then_ollama_host_say() {
    let smol = smollm2();
    let model = smol.to_str().unwrap();
    let here = std::env::temp_dir();
    // OLLAMA_HOST alone, `host:port` without a scheme.
    let s = Served::start(&[model], &[("OLLAMA_HOST", "127.0.0.2:0")], &here);
    assert!(
        s.listening.starts_with("http://127.0.0.2:"),
        "{}",
        s.listening
    );
    let at = format!("127.0.0.2:{}", s.port());
    let out = hypura(&[("OLLAMA_HOST", &at)], &["list"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(MODEL), "{}", text(&out.stdout));
    drop(s);
    // HYPURA_HOST wins over OLLAMA_HOST; a scheme is allowed.
    let env = [
        ("OLLAMA_HOST", "127.0.0.2:0"),
        ("HYPURA_HOST", "http://127.0.0.3:0"),
    ];
    let s = Served::start(&[model], &env, &here);
    assert!(
        s.listening.starts_with("http://127.0.0.3:"),
        "{}",
        s.listening
    );
    drop(s);
    // --host wins over both (the port still comes from HYPURA_HOST).
    let s = Served::start(&[model, "--host", "127.0.0.4"], &env, &here);
    assert!(
        s.listening.starts_with("http://127.0.0.4:"),
        "{}",
        s.listening
    );
    assert_ne!(s.port(), "11434");
    drop(s);
    // A host it cannot listen on names the variable it came from.
    let out = Command::new(env!("CARGO_BIN_EXE_hypura"))
        .args(["serve", model])
        .env("OLLAMA_HOST", "no-such-host.invalid:0")
        .env_remove("HYPURA_HOST")
        .env("HYPURA_CACHE_DIR", profile_cache_dir())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains(
            "error: host no-such-host.invalid (from OLLAMA_HOST): not an address or a known host name"
        ),
        "{}",
        text(&out.stderr)
    );

    // The whole LAN (an API key needed): clients given 0.0.0.0 dial loopback.
    let key = ("HYPURA_API_KEY", "sesame");
    let s = Served::start(&[model], &[("OLLAMA_HOST", "0.0.0.0:0"), key], &here);
    assert!(
        s.listening.starts_with("http://0.0.0.0:"),
        "{}",
        s.listening
    );
    for host in [
        format!("0.0.0.0:{}", s.port()),
        format!("http://0.0.0.0:{}", s.port()),
    ] {
        let out = hypura(&[("OLLAMA_HOST", &host), key], &["list", "--json"], "");
        assert!(out.status.success(), "{host}: {}", text(&out.stderr));
        let tags: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
        assert_eq!(tags["models"][0]["name"], MODEL);
    }
}

/// A folder of its own for `what`, empty.
fn temp_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hypura-cli-ollama-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn tag_names(server: &Server) -> Vec<String> {
    let tags: Value = server.get("/api/tags").json().unwrap();
    tags["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_string())
        .collect()
}

/// `ollama run --verbose`'s `eval count:` figures in `stderr`.
fn eval_counts(stderr: &str) -> Vec<u64> {
    stderr
        .lines()
        .filter_map(|l| {
            l.strip_prefix("eval count:")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

#[test]
fn rm_cp_create_and_push_as_ollama() {
    let dir = temp_dir("create");
    let server = Server::start(&["--models-dir", dir.join("models").to_str().unwrap()]);

    let (said, _) = ok(&server, &["cp", MODEL, "twin"], "");
    assert_eq!(said, format!("copied '{MODEL}' to 'twin'\n"));
    assert!(tag_names(&server).contains(&"twin:latest".to_string()));
    let (said, _) = ok(&server, &["rm", "twin"], "");
    assert_eq!(said, "deleted 'twin'\n");
    assert!(!tag_names(&server).contains(&"twin:latest".to_string()));
    let out = hypura(&[("HYPURA_HOST", &server.base)], &["rm", "twin"], "");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr), "error: model 'twin' not found\n");

    // FROM a GGUF file beside the Modelfile: uploaded as a blob, then created.
    std::os::unix::fs::symlink(smollm2(), dir.join("smol.gguf")).unwrap();
    std::fs::write(
        dir.join("Modelfile"),
        "FROM ./smol.gguf\nSYSTEM \"\"\"Answer in\none word.\"\"\"\nPARAMETER num_predict 3\n\
         PARAMETER temperature 0\nMESSAGE user Hi\nMESSAGE assistant Ahoy\n",
    )
    .unwrap();
    let modelfile = dir.join("Modelfile");
    let (said, err) = ok(
        &server,
        &["create", "pirate", "-f", modelfile.to_str().unwrap()],
        "",
    );
    assert_eq!(said, "");
    let digest = format!("sha256:{}", sha256_file(&smollm2()));
    assert_eq!(
        err,
        format!(
            "gathering model components\ncopying file {digest} 100%\nparsing GGUF\n\
             using existing layer {digest}\nwriting manifest\nsuccess\n"
        )
    );
    let show = server.post_json("/api/show", json!({"model": "pirate"}), 200);
    assert_eq!(show["system"], "Answer in\none word.");
    let file = modelfile::parse(show["modelfile"].as_str().unwrap()).unwrap();
    assert_eq!(
        file.messages,
        [
            ("user".into(), "Hi".into()),
            ("assistant".into(), "Ahoy".into())
        ]
    );
    // The created model's defaults hold: `run` sends only what it is told.
    let (_, err) = ok(
        &server,
        &["run", "pirate", "Name a colour.", "--verbose"],
        "",
    );
    assert_eq!(eval_counts(&err), [3], "{err}");
    let (_, err) = ok(
        &server,
        &[
            "run",
            "pirate",
            "Name a colour.",
            "--verbose",
            "--max-tokens",
            "2",
        ],
        "",
    );
    assert_eq!(eval_counts(&err), [2], "{err}");

    // FROM a served model, from the current folder's Modelfile.
    std::fs::write(
        dir.join("Modelfile"),
        format!("FROM {MODEL}\nSYSTEM Arr.\n"),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hypura"))
        .args(["create", "parrot"])
        .current_dir(&dir)
        .env("HYPURA_HOST", &server.base)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stderr),
        "gathering model components\nwriting manifest\nsuccess\n"
    );
    let show = server.post_json("/api/show", json!({"model": "parrot"}), 200);
    assert_eq!(show["system"], "Arr.");
    // A server's refusal is the error; a missing Modelfile is named.
    std::fs::write(dir.join("Modelfile"), "FROM nosuch\n").unwrap();
    let out = hypura(
        &[("HYPURA_HOST", &server.base)],
        &["create", "x", "-f", modelfile.to_str().unwrap()],
        "",
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).starts_with(
            "gathering model components\nerror: cannot create from 'nosuch': no model of that name"
        ),
        "{}",
        text(&out.stderr)
    );
    let out = hypura(&[], &["create", "x", "-f", "/nonexistent/Modelfile"], "");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).starts_with("error: reading the Modelfile /nonexistent/Modelfile: "),
        "{}",
        text(&out.stderr)
    );

    // push: a clear refusal, no server needed.
    let out = hypura(&[("HYPURA_HOST", "127.0.0.1:1")], &["push", "pirate"], "");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "error: cannot push pirate: pushing models to a registry is not supported; hypura \
         serves local GGUF files (`hypura show pirate --modelfile` names the file to copy)\n"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn sha256_file(path: &Path) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    std::io::copy(&mut std::fs::File::open(path).unwrap(), &mut hasher).unwrap();
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The messages a created model starts with, from its Modelfile.
fn saved_messages(server: &Server, name: &str) -> (Value, Vec<(String, String)>) {
    let show = server.post_json("/api/show", json!({ "model": name }), 200);
    let file = modelfile::parse(show["modelfile"].as_str().unwrap()).unwrap();
    (show, file.messages)
}

#[test]
fn the_run_prompt_takes_ollamas_commands() {
    let server = Server::start(&["--models-dir", temp_dir("repl").to_str().unwrap()]);
    let script = "/set parameter num_predict 3\n\
                  /set parameter temperature 0\n\
                  /set parameter num_ctx big\n\
                  /set parameter wizardry 1\n\
                  /set system Answer in one word.\n\
                  /show parameters\n\
                  /show template\n\
                  /show info\n\
                  \"\"\"\nName a\ncolour.\n\"\"\"\n\
                  /save session-a\n\
                  /clear\n\
                  /save session-b\n\
                  /bogus\n\
                  /set quiet\n\
                  Hello\n\
                  /bye\n\
                  never read\n";
    let (said, err) = ok(
        &server,
        &["run", MODEL, "--interactive", "--verbose"],
        script,
    );
    for line in [
        "Set parameter 'num_predict' to '3'",
        "Set parameter 'temperature' to '0'",
        "Couldn't set parameter: invalid int value [big]",
        "Couldn't set parameter: unknown parameter 'wizardry'",
        "Set system message.",
        "Created new model 'session-a'",
        "Cleared session context",
        "Created new model 'session-b'",
        "Unknown command '/bogus'. Type /? for help",
        "Set 'quiet' mode.",
    ] {
        assert!(err.lines().any(|l| l.ends_with(line)), "{line:?} in\n{err}");
    }
    // One reply with statistics, 3 tokens (`/set parameter num_predict 3`);
    // after `/set quiet`, one without.
    assert_eq!(eval_counts(&err), [3], "{err}");
    let show = server.post_json("/api/show", json!({ "model": MODEL }), 200);
    let parameters = format!(
        "Model defined parameters:\n{}\n\nUser defined parameters:\n  {:<30} 3\n  {:<30} 0\n\n",
        show["parameters"]
            .as_str()
            .unwrap()
            .lines()
            .map(|l| format!("  {l}"))
            .collect::<Vec<_>>()
            .join("\n"),
        "num_predict",
        "temperature"
    );
    assert!(said.starts_with(&parameters), "{said}");
    let template = format!("{}\n", show["template"].as_str().unwrap());
    assert!(said[parameters.len()..].starts_with(&template), "{said}");
    assert!(
        said.contains("  Model\n    architecture        llama\n"),
        "{said}"
    );

    // `/save` keeps the session: its system prompt, parameters and turns
    // (the `"""` block one message of two lines).
    let (show, messages) = saved_messages(&server, "session-a");
    assert_eq!(show["system"], "Answer in one word.");
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(
        messages[0],
        ("user".to_string(), "Name a\ncolour.".to_string())
    );
    assert_eq!(messages[1].0, "assistant");
    let reply = &messages[1].1;
    assert!(
        said.contains(&format!("\n{reply}\n")),
        "{reply:?} in {said}"
    );
    let chat = server.post_json(
        "/api/chat",
        json!({"model": MODEL, "stream": false,
               "options": {"num_predict": 3, "temperature": 0},
               "messages": [{"role": "system", "content": "Answer in one word."},
                            {"role": "user", "content": "Name a\ncolour."}]}),
        200,
    );
    assert_eq!(&chat["message"]["content"], reply.as_str());
    let (_, messages) = saved_messages(&server, "session-b");
    assert_eq!(messages, [], "/clear empties the conversation");
}

/// A child's output as it comes, and the reader, which ends at the output's
/// end (join it after the child exits: its last bytes may still be in the
/// pipe).
fn collect(
    mut from: impl Read + Send + 'static,
) -> (Arc<Mutex<Vec<u8>>>, std::thread::JoinHandle<()>) {
    let sink = Arc::new(Mutex::new(Vec::new()));
    let into = Arc::clone(&sink);
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            into.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    (sink, reader)
}

fn now(sink: &Arc<Mutex<Vec<u8>>>) -> String {
    text(&sink.lock().unwrap())
}

fn interrupt(child: &Child) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
}

fn say(stdin: &mut ChildStdin, line: &str) {
    stdin.write_all(line.as_bytes()).unwrap();
    stdin.flush().unwrap();
}

#[test]
fn ctrl_c_stops_the_reply_and_keeps_the_chat() {
    let server = Server::start(&["--models-dir", temp_dir("ctrl-c").to_str().unwrap()]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_hypura"))
        .args(["run", MODEL, "--interactive", "--verbose"])
        .args(["--temperature", "0", "--max-tokens", "2000"])
        .env("HYPURA_HOST", &server.base)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let (stdout, stdout_read) = collect(child.stdout.take().unwrap());
    let (stderr, stderr_read) = collect(child.stderr.take().unwrap());
    say(
        &mut stdin,
        "Write the numbers from 1 to 1000, one per line.\n",
    );
    wait_until(Duration::from_secs(60), "the reply begins", || {
        now(&stdout).len() > 8
    });
    interrupt(&child);
    wait_until(Duration::from_secs(30), "the prompt comes back", || {
        now(&stderr).matches(">>> ").count() == 2
    });
    // Stopped server-side too: the connection closed, the server cancelled it.
    let cancelled =
        format!("hypura_request_aborted_total{{model=\"{MODEL}\",reason=\"cancelled\"}}");
    wait_until(
        Duration::from_secs(30),
        "the generation is cancelled",
        || server.metric(&cancelled) == Some(1.0),
    );
    let partial = now(&stdout);
    assert!(partial.ends_with('\n'), "{partial:?}");
    // Ctrl-C at the prompt says how to leave, and leaves nothing.
    interrupt(&child);
    wait_until(Duration::from_secs(30), "the hint", || {
        now(&stderr).contains("\nUse Ctrl + d or /bye to exit.\n>>> ")
    });
    assert_eq!(child.try_wait().unwrap(), None, "still running");

    // The chat holds the stopped reply as it was written.
    say(&mut stdin, "/save stopped\n");
    wait_until(Duration::from_secs(30), "the session is saved", || {
        now(&stderr).contains("Created new model 'stopped'")
    });
    let (_, messages) = saved_messages(&server, "stopped");
    assert_eq!(
        messages,
        [
            (
                "user".to_string(),
                "Write the numbers from 1 to 1000, one per line.".to_string()
            ),
            (
                "assistant".to_string(),
                partial.strip_suffix('\n').unwrap().to_string()
            )
        ]
    );

    // And goes on: the next reply runs to its end, with its statistics
    // (the stopped one printed none).
    say(
        &mut stdin,
        "/set parameter num_predict 4\nThank you.\n/bye\n",
    );
    drop(stdin);
    let status = child.wait().unwrap();
    stdout_read.join().unwrap();
    stderr_read.join().unwrap();
    let err = now(&stderr);
    assert!(status.success(), "{err}");
    assert_eq!(eval_counts(&err), [4], "{err}");
    assert!(now(&stdout).len() > partial.len() + 1, "{}", now(&stdout));
}

#[test]
fn the_default_model_answers_to_its_short_names() {
    // Served with no model named: the default model, found in the
    // repository's models/ (the models folder given is empty).
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let models = temp_dir("default");
    let s = Served::start(
        &["--port", "0"],
        &[("HYPURA_MODELS_DIR", models.to_str().unwrap())],
        &repo,
    );
    let env = [("HYPURA_HOST", s.listening.as_str())];
    let out = hypura(&env, &["list"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = text(&out.stdout);
    let names: Vec<&str> = listed
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        names,
        [
            "SmolLM2-135M-Instruct.Q4_1:latest",
            "smollm2:135m",
            "smollm2:latest"
        ],
        "{listed}"
    );
    let reply = |name: &str| {
        let out = hypura(
            &env,
            &[
                "run",
                name,
                "The capital of France is",
                "--raw",
                "--temperature",
                "0",
                "--max-tokens",
                "4",
            ],
            "",
        );
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    let full = reply("SmolLM2-135M-Instruct.Q4_1");
    assert!(full.starts_with(" Paris"), "{full:?}");
    assert_eq!(reply("smollm2"), full);
    assert_eq!(reply("smollm2:135m"), full);
    assert_eq!(reply("SmolLM2:135M"), full, "names are case-insensitive");
}
