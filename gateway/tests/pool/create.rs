//! `/api/create`, `/api/blobs/:digest` and `/api/push` end to end on a real
//! `hypura serve` of SmolLM2, with Open WebUI's request shapes (its GGUF
//! upload: `POST /api/blobs/sha256:…` with the file, then `/api/create` with
//! `files`; its "create model": `from`/`system`/`parameters`, or the legacy
//! `modelfile`) and the Python `ollama` client's `create`.
#[path = "../common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{client, ndjson, Server, MODEL};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const NOT_A_MODEL: &[u8] = b"<html><body>Not a model</body></html>\n";
const PROMPT: &str = "What is the capital of Germany?";
/// A Jinja template that is not SmolLM2's ChatML: its prompts have other tokens.
const PLAIN_TEMPLATE: &str =
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:";

fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_file(path: &Path) -> String {
    let mut hasher = Sha256::new();
    std::io::copy(&mut std::fs::File::open(path).unwrap(), &mut hasher).unwrap();
    hex(&hasher.finalize())
}

/// The names in `dir`, hidden ones included, sorted; none when it does not exist.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn empty_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hypura-create-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn head(s: &Server, path: &str) -> u16 {
    client().head(s.url(path)).send().unwrap().status().as_u16()
}

/// POSTs raw bytes as Open WebUI's `requests.post(url, data=f)` does; status and body.
fn upload(s: &Server, digest: &str, body: Vec<u8>) -> (u16, String) {
    let r = client()
        .post(s.url(&format!("/api/blobs/{digest}")))
        .body(body)
        .send()
        .unwrap();
    (r.status().as_u16(), r.text().unwrap())
}

fn error_of(s: &Server, path: &str, body: Value, status: u16) -> String {
    let r = s.post(path, body.clone());
    assert_eq!(r.status().as_u16(), status, "{path} {body}");
    r.json::<Value>().unwrap()["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error in the answer to {body}"))
        .to_string()
}

/// A create with `stream` left out: Ollama's NDJSON status lines.
fn create_streamed(s: &Server, body: Value) -> Vec<Value> {
    let r = s.post("/api/create", body.clone());
    assert_eq!(r.status(), 200, "{body}");
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    let lines = ndjson(&r.text().unwrap());
    assert_eq!(
        lines.last().unwrap(),
        &json!({"status": "success"}),
        "{lines:?}"
    );
    lines
}

fn generate(s: &Server, body: Value) -> Value {
    let mut body = body;
    body["stream"] = json!(false);
    s.post_json("/api/generate", body, 200)
}

fn tag_names(s: &Server) -> Vec<String> {
    let tags: Value = s.get("/api/tags").json().unwrap();
    tags["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn create_upload_serve_and_delete() {
    let dir = empty_dir();
    let blobs = dir.join("blobs");
    let smol = common::smollm2();
    let smol_bytes = std::fs::read(&smol).unwrap();
    let hex = sha256_file(&smol);
    let digest = format!("sha256:{hex}");
    let s = Server::start(&["--models-dir", dir.to_str().unwrap()]);

    // Uploads: checked digests, GGUF only, nothing left by a failure.
    assert_eq!(head(&s, &format!("/api/blobs/{digest}")), 404);
    let other = format!("sha256:{}", sha256_hex(b"something else"));
    let (status, text) = upload(&s, &other, smol_bytes.clone());
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("digest mismatch"), "{text}");
    assert_eq!(listing(&blobs), Vec::<String>::new());
    for bad in [
        hex.clone(),
        format!("sha256-{hex}"),
        format!("sha256:{}", hex.to_uppercase()),
        format!("sha256:{}", &hex[..63]),
        "sha256:..%2F..%2Fetc%2Fpasswd".to_string(),
    ] {
        let (status, text) = upload(&s, &bad, b"GGUF".to_vec());
        assert_eq!(status, 400, "{bad}: {text}");
        assert!(text.contains("invalid blob digest"), "{text}");
        assert_eq!(head(&s, &format!("/api/blobs/{bad}")), 400, "{bad}");
    }
    let html = format!("sha256:{}", sha256_hex(NOT_A_MODEL));
    let (status, text) = upload(&s, &html, NOT_A_MODEL.to_vec());
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("not a GGUF file"), "{text}");
    assert_eq!(listing(&blobs), Vec::<String>::new());
    let (status, _) = upload(&s, &digest, smol_bytes.clone());
    assert_eq!(status, 201);
    assert_eq!(listing(&blobs), [format!("sha256-{hex}")]);
    assert_eq!(sha256_file(&blobs.join(format!("sha256-{hex}"))), hex);
    assert_eq!(head(&s, &format!("/api/blobs/{digest}")), 200);
    assert_eq!(upload(&s, &digest, smol_bytes).0, 200, "already there");

    // Open WebUI's GGUF upload: the file's name → the blob's digest.
    let lines = create_streamed(
        &s,
        json!({"model": "smol-upload", "files": {"smol-upload.gguf": digest}}),
    );
    assert!(lines.contains(&json!({"status": format!("using existing layer {digest}")})));
    assert!(tag_names(&s).contains(&"smol-upload:latest".to_string()));

    // From the blob, with a system prompt and default options.
    let system = "Answer in one word.";
    let terse = json!({"model": "smol-terse", "from": digest, "system": system,
        "parameters": {"num_predict": 5, "temperature": 0}, "stream": false});
    assert_eq!(
        s.post_json("/api/create", terse, 200),
        json!({"status": "success"})
    );
    // Prompt lengths are compared: nothing read from the prompt cache.
    let created = generate(
        &s,
        json!({"model": "smol-terse", "prompt": PROMPT, "cache_prompt": false}),
    );
    let by_hand = generate(
        &s,
        json!({"model": MODEL, "prompt": PROMPT, "system": system, "cache_prompt": false,
            "options": {"num_predict": 5, "temperature": 0}}),
    );
    assert_eq!(created["eval_count"], 5, "{created}");
    assert_eq!(created["done_reason"], "length");
    assert_eq!(created["response"], by_hand["response"]);
    assert_eq!(created["prompt_eval_count"], by_hand["prompt_eval_count"]);
    let overridden = generate(
        &s,
        json!({"model": "smol-terse", "prompt": PROMPT, "options": {"num_predict": 2}}),
    );
    assert_eq!(overridden["eval_count"], 2, "the request's options win");
    let chat = s.post_json(
        "/v1/chat/completions",
        json!({"model": "smol-terse", "messages": [{"role": "user", "content": PROMPT}]}),
        200,
    );
    assert_eq!(chat["usage"]["completion_tokens"], 5, "{chat}");
    let show = s.post_json("/api/show", json!({"model": "smol-terse"}), 200);
    assert_eq!(show["system"], system);
    assert_eq!(show["details"]["parent_model"], digest);
    let parameters = show["parameters"].as_str().unwrap();
    assert!(
        parameters.contains(&format!("{:<30} 5", "num_predict")),
        "{parameters}"
    );
    assert!(
        parameters.contains(&format!("{:<30} 0", "temperature")),
        "{parameters}"
    );
    let modelfile = show["modelfile"].as_str().unwrap();
    for line in [
        format!("FROM {}", blobs.join(format!("sha256-{hex}")).display()),
        format!("SYSTEM {system}"),
        "PARAMETER num_predict 5".to_string(),
    ] {
        assert!(modelfile.contains(&line), "{line} not in {modelfile}");
    }

    // A Modelfile (Open WebUI's legacy shape) naming a served model, with a template.
    let plain = format!(
        "FROM {MODEL}\nTEMPLATE \"\"\"{PLAIN_TEMPLATE}\"\"\"\nPARAMETER num_predict 4\n\
         PARAMETER temperature 0\n"
    );
    create_streamed(&s, json!({"name": "smol-plain", "modelfile": plain}));
    let created = generate(
        &s,
        json!({"model": "smol-plain", "prompt": PROMPT, "cache_prompt": false}),
    );
    let by_hand = generate(
        &s,
        json!({"model": MODEL, "prompt": PROMPT, "template": PLAIN_TEMPLATE, "cache_prompt": false,
            "options": {"num_predict": 4, "temperature": 0}}),
    );
    let chatml = generate(
        &s,
        json!({"model": MODEL, "prompt": PROMPT, "cache_prompt": false,
            "options": {"num_predict": 4, "temperature": 0}}),
    );
    assert_eq!(created["response"], by_hand["response"]);
    assert_eq!(created["prompt_eval_count"], by_hand["prompt_eval_count"]);
    assert_ne!(created["prompt_eval_count"], chatml["prompt_eval_count"]);
    let show = s.post_json("/api/show", json!({"model": "smol-plain"}), 200);
    assert_eq!(show["template"], PLAIN_TEMPLATE);
    assert!(show["modelfile"].as_str().unwrap().contains("TEMPLATE"));
    let copy = json!({"source": "smol-plain", "destination": "smol-plain-copy"});
    assert_eq!(s.post("/api/copy", copy).status(), 200);

    // What cannot be created says why.
    for (body, status, words) in [
        (
            json!({"model": "q", "from": MODEL, "quantize": "q4_K_M"}),
            501,
            "no quantizer",
        ),
        (
            json!({"model": "q", "from": "llama9"}),
            400,
            "no model of that name",
        ),
        (
            json!({"model": "q", "from": "/etc/passwd"}),
            400,
            "not found or not allowed",
        ),
        (
            json!({"model": "q", "from": format!("sha256:{}", "0".repeat(64))}),
            400,
            "upload it first",
        ),
        (
            json!({"model": "q", "from": MODEL, "template": "{{ .Prompt }}"}),
            400,
            "Go templates are not supported",
        ),
        (
            json!({"model": "q", "from": MODEL, "parameters": {"temperature": "hot"}}),
            400,
            "parameters.temperature",
        ),
        (
            json!({"model": MODEL, "from": "smol-terse"}),
            400,
            "is taken by",
        ),
    ] {
        let error = error_of(&s, "/api/create", body.clone(), status);
        assert!(error.contains(words), "{body}: {error}");
    }
    assert!(!tag_names(&s).contains(&"q:latest".to_string()));
    let push = error_of(&s, "/api/push", json!({"model": "smol-terse"}), 501);
    assert!(push.contains("not supported"), "{push}");

    python_client_creates(&s, &smol);

    // Deleting created models: the manifest goes, the shared blob stays
    // while a model uses it, the base model keeps working.
    let manifests = dir.join("manifests");
    assert!(listing(&manifests).contains(&"smol-terse@latest.json".to_string()));
    let delete = |name: &str| {
        let r = client()
            .delete(s.url("/api/delete"))
            .json(&json!({"model": name}))
            .send()
            .unwrap();
        assert_eq!(r.status(), 200, "{name}");
    };
    delete("smol-terse");
    assert!(!listing(&manifests).contains(&"smol-terse@latest.json".to_string()));
    delete("smol-py");
    assert_eq!(
        head(&s, &format!("/api/blobs/{digest}")),
        200,
        "smol-upload uses it"
    );
    delete("smol-upload");
    assert_eq!(
        head(&s, &format!("/api/blobs/{digest}")),
        404,
        "unused: pruned"
    );
    assert_eq!(listing(&blobs), Vec::<String>::new());
    let base = generate(
        &s,
        json!({"model": MODEL, "prompt": PROMPT, "options": {"num_predict": 4, "temperature": 0}}),
    );
    assert_eq!(base["response"], chatml["response"]);
    let kept = [MODEL, "smol-plain-copy:latest", "smol-plain:latest"];
    assert_eq!(tag_names(&s), kept);
    drop(s);

    // Created models come back after a restart; the blob routes need the admin key.
    let s = Server::start(&[
        "--models-dir",
        dir.to_str().unwrap(),
        "--admin-key",
        "admin-secret",
    ]);
    assert_eq!(tag_names(&s), kept);
    for name in ["smol-plain", "smol-plain-copy"] {
        let again = generate(&s, json!({"model": name, "prompt": PROMPT}));
        assert_eq!(again["response"], created["response"], "{name}");
    }
    assert_eq!(head(&s, &format!("/api/blobs/{digest}")), 401);
    let keyed = client()
        .head(s.url(&format!("/api/blobs/{digest}")))
        .bearer_auth("admin-secret")
        .send()
        .unwrap();
    assert_eq!(keyed.status(), 404);
    drop(s);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The `ollama` package's `create_blob` and `create` (streamed and not)
/// against `s`; leaves `smol-py` created.
fn python_client_creates(s: &Server, smol: &Path) {
    let script = r#"
import os, ollama
c = ollama.Client(host=os.environ["HOST"])
digest = c.create_blob(os.environ["SMOL"])
assert digest.startswith("sha256:"), digest
r = c.create(model="smol-py", from_=digest, system="You are terse.",
             parameters={"num_predict": 3, "temperature": 0})
assert r.status == "success", r
out = c.generate(model="smol-py", prompt="Hi")
assert out.eval_count == 3, out
statuses = [p.status for p in c.create(model="smol-py", from_="smol-py",
                                       parameters={"num_predict": 2}, stream=True)]
assert statuses[-1] == "success", statuses
out = c.generate(model="smol-py", prompt="Hi")
assert out.eval_count == 2, out
show = c.show("smol-py")
assert "SYSTEM You are terse." in show.modelfile, show.modelfile
assert "num_predict                    2" in show.parameters, show.parameters
try:
    c.create(model="bad", from_="no-such-model")
    raise SystemExit("expected an error")
except ollama.ResponseError as e:
    assert e.status_code == 400, e
"#;
    let status = Command::new("python3")
        .args(["-c", script])
        .env("HOST", &s.base)
        .env("SMOL", smol)
        .status()
        .expect("python3 with the ollama package (gateway/tests/clients/requirements.txt)");
    assert!(
        status.success(),
        "the ollama client's create failed: {status:?}"
    );
}

/// `dir` made empty, named for this process and `what`.
fn empty_dir_for(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hypura-create-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_failed_create_removes_the_blobs_it_uploaded() {
    let dir = empty_dir_for("failed");
    let blobs = dir.join("blobs");
    let smol_bytes = std::fs::read(common::smollm2()).unwrap();
    let digest = format!("sha256:{}", sha256_hex(&smol_bytes));
    // A GGUF header, then the file cut short: a valid upload, not a model.
    let cut = smol_bytes[..1 << 20].to_vec();
    let cut_digest = format!("sha256:{}", sha256_hex(&cut));
    let s = Server::start(&["--models-dir", dir.to_str().unwrap()]);
    let nothing = Vec::<String>::new();

    // Each way a create fails, after its upload: the blob goes with it.
    let failures = [
        (
            json!({"model": "bad-template", "from": digest, "template": "{{ .System }}"}),
            400,
            "Go templates are not supported",
        ),
        (
            json!({"model": "bad-option", "files": {"smol.gguf": digest},
                   "parameters": {"temperature": "hot"}}),
            400,
            "parameters.temperature",
        ),
        (
            json!({"model": "bad-modelfile",
                   "modelfile": format!("FROM {digest}\nPARAMETER top_p 7")}),
            400,
            "top_p",
        ),
        (
            json!({"model": MODEL, "files": {"smol.gguf": digest}}),
            400,
            "is taken by the model served from",
        ),
        (
            json!({"model": "quantized", "from": digest, "quantize": "q4_K_M"}),
            501,
            "quantize is not supported",
        ),
        (
            json!({"model": "nested", "from": format!("@{digest}"), "messages":
                   [{"role": "wizard", "content": "hi"}]}),
            400,
            "the role 'wizard'",
        ),
    ];
    for (body, status, words) in failures {
        assert_eq!(upload(&s, &digest, smol_bytes.clone()).0, 201, "{body}");
        assert_eq!(listing(&blobs), [digest.replace(':', "-")]);
        let error = error_of(&s, "/api/create", body.clone(), status);
        assert!(error.contains(words), "{body}: {error}");
        assert_eq!(listing(&blobs), nothing, "after {body}");
        assert_eq!(head(&s, &format!("/api/blobs/{digest}")), 404);
    }
    assert_eq!(upload(&s, &cut_digest, cut).0, 201);
    let error = error_of(
        &s,
        "/api/create",
        json!({"model": "cut", "files": {"cut.gguf": cut_digest}}),
        400,
    );
    assert!(!error.contains(dir.to_str().unwrap()), "{error}");
    assert_eq!(listing(&blobs), nothing);

    // A blob a model uses stays when another create from it fails.
    assert_eq!(upload(&s, &digest, smol_bytes).0, 201);
    let kept = json!({"model": "kept", "from": digest, "stream": false});
    assert_eq!(
        s.post_json("/api/create", kept, 200),
        json!({"status": "success"})
    );
    let error = error_of(
        &s,
        "/api/create",
        json!({"model": "kept2", "from": digest, "template": "{% if %}"}),
        400,
    );
    assert!(error.starts_with("template: "), "{error}");
    assert_eq!(head(&s, &format!("/api/blobs/{digest}")), 200);
    assert_eq!(listing(&blobs), [digest.replace(':', "-")]);
    let reply = generate(
        &s,
        json!({"model": "kept", "prompt": PROMPT, "options": {"num_predict": 1}}),
    );
    assert_eq!(reply["eval_count"], 1, "{reply}");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The names `/api/ps` lists, as `name` and `model` (Ollama sets both).
fn ps_names(s: &Server) -> Vec<(String, String)> {
    let ps: Value = s.get("/api/ps").json().unwrap();
    ps["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let field = |key: &str| m[key].as_str().unwrap_or_default().to_string();
            (field("name"), field("model"))
        })
        .collect()
}

#[test]
fn ps_names_the_created_model_in_use_and_the_base_when_the_base_is_used() {
    let dir = empty_dir_for("ps");
    let s = Server::start(&["--models-dir", dir.to_str().unwrap()]);
    let modelfile = format!("FROM {MODEL}\nSYSTEM Answer in one word.\n");
    create_streamed(&s, json!({"model": "smol-terse", "modelfile": modelfile}));
    let ask = |model: &str| {
        let body = json!({"model": model, "prompt": PROMPT, "options": {"num_predict": 1}});
        assert_eq!(generate(&s, body)["eval_count"], 1, "{model}");
    };
    let listed = |name: &str| vec![(name.to_string(), name.to_string())];
    assert_eq!(ps_names(&s), [], "nothing loaded");

    // One load of the shared file, listed under the name asked for last.
    ask("smol-terse");
    assert_eq!(ps_names(&s), listed("smol-terse:latest"));
    ask(MODEL);
    assert_eq!(ps_names(&s), listed(MODEL));
    ask("Smol-Terse");
    assert_eq!(ps_names(&s), listed("smol-terse:latest"));
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}
