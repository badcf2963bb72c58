//! Issue 29, item 1's property test: random arrivals over 3–4 models under
//! a random RAM budget, against a real `hypura serve DIR --context 1024`
//! (SmolLM2 and small synthetic models, as in `budget_wedge.rs`). Each seed
//! draws a budget, `--parallel` and a schedule (which model, when, how many
//! tokens; some clients stream, some drop the stream after a few tokens,
//! some ask `keep_alive: 0`), runs it, and checks:
//! - **memory charged ≤ budget at every step**: the books' peak since start
//!   (`/api/status` `budget.*_peak_charged_bytes`, raised after every change
//!   of the books), and the charge sampled all along and after every event;
//! - **every request answered**: 200, or for a model the budget can never
//!   hold the 400 naming the least it needs (it is listed `unavailable`);
//! - **liveness**: each request answered within the work ahead of it when
//!   it came (until the last request that came before it ended; for
//!   requests that came at once, the server takes them in some order: those
//!   of its burst answered before it), its own work, and one load of every
//!   model (its own, and a move of each other one in its way), load times
//!   measured (each model's cold load alone), plus [`OVERHEAD`] for the
//!   HTTP round trips and the process switches of a busy 2-core machine;
//! - **afterwards**: nothing waits, `keep_alive: 0` unloads every model,
//!   the books come back to 0, and every model answers again.
//!
//! CI runs [`SEEDS`]; `HYPURA_BUDGET_SEEDS` runs others instead: a count
//! (`20`: seeds 1 to 20), a list (`5,9`) or a range (`10..40`).
#[path = "../common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{client, wait_until, Server};
use hypura_synth::{cached, SynthSpec};
use llama_tiered::llama::gguf_write::GgmlType;
use serde_json::{json, Value};

const SEEDS: &[u64] = &[1, 2, 3];
const SMOLLM2: &str = "smollm2:latest";
/// The synthetic models a schedule draws two or three of, beside SmolLM2.
const SYNTHETIC: [&str; 3] = ["tinyllama:latest", "tinymoe:latest", "tinyqwen:latest"];
/// What a request takes beyond load and work: its HTTP round trips and
/// the runner processes sharing two cores. Measured at most 1.7 s on a
/// 2-core machine busy with builds besides; the bound is not about speed
/// but about never waiting on something that is not running (the issue's
/// 60 s and 300 s waits).
const OVERHEAD: Duration = Duration::from_secs(3);
/// The least SmolLM2 needs under the budget at `--context 1024` is about
/// 433 MiB: budgets are drawn on both sides of it.
const BUDGET_MIB: (u64, u64) = (300, 1100);

/// SplitMix64: a seeded generator, the same sequence on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    /// True `percent` times in a hundred.
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// How a client asks and reads.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Client {
    /// One JSON reply.
    Whole,
    /// NDJSON, read to the end.
    Streamed,
    /// NDJSON, dropped after this many lines (the client goes away).
    Drops(usize),
    /// One JSON reply, `keep_alive: 0`: the model unloads after it.
    KeepAlive0,
}

#[derive(Debug)]
struct Arrival {
    /// From the start of the schedule.
    at: Duration,
    model: &'static str,
    tokens: u64,
    client: Client,
}

#[derive(Debug)]
struct Schedule {
    seed: u64,
    budget_mib: u64,
    parallel: u64,
    models: Vec<&'static str>,
    arrivals: Vec<Arrival>,
}

fn draw(seed: u64) -> Schedule {
    let mut rng = Rng(seed);
    let mut synthetic = SYNTHETIC.to_vec();
    let kept = rng.range(2, 3) as usize;
    while synthetic.len() > kept {
        let out = rng.range(0, synthetic.len() as u64 - 1) as usize;
        synthetic.remove(out);
    }
    let mut models = vec![SMOLLM2];
    models.extend(synthetic);
    let budget_mib = rng.range(BUDGET_MIB.0, BUDGET_MIB.1);
    let parallel = rng.range(1, 2);
    let mut at = Duration::ZERO;
    let arrivals = (0..rng.range(8, 14))
        .map(|_| {
            // A third come at once with the one before (a burst).
            if !rng.chance(33) {
                at += Duration::from_millis(rng.range(100, 1500));
            }
            let model = models[rng.range(0, models.len() as u64 - 1) as usize];
            let client = match rng.range(0, 9) {
                0 | 1 => Client::Drops(rng.range(1, 3) as usize),
                2 | 3 => Client::KeepAlive0,
                4 | 5 => Client::Streamed,
                _ => Client::Whole,
            };
            let tokens = match client {
                Client::Drops(_) => 400,
                _ => rng.range(1, 24),
            };
            Arrival {
                at,
                model,
                tokens,
                client,
            }
        })
        .collect();
    Schedule {
        seed,
        budget_mib,
        parallel,
        models,
        arrivals,
    }
}

/// The seeds to run: [`SEEDS`], or `HYPURA_BUDGET_SEEDS`'s.
fn seeds() -> Vec<u64> {
    let Ok(spec) = std::env::var("HYPURA_BUDGET_SEEDS") else {
        return SEEDS.to_vec();
    };
    let number = |s: &str| -> u64 { s.trim().parse().expect("HYPURA_BUDGET_SEEDS: numbers") };
    if let Some((from, to)) = spec.split_once("..") {
        (number(from)..number(to)).collect()
    } else if spec.contains(',') {
        spec.split(',').map(number).collect()
    } else {
        (1..=number(&spec)).collect()
    }
}

fn spec_of(model: &str) -> Option<SynthSpec> {
    match model {
        "tinyllama:latest" => Some(SynthSpec::tiny_llama().with_layers(24)),
        "tinymoe:latest" => Some(SynthSpec::tiny_mixtral().with_layers(24)),
        // Its experts' rows (64) take a type of 32-wide blocks.
        "tinyqwen:latest" => Some(SynthSpec::tiny_qwen3_moe().with_weight_type(GgmlType::Q8_0)),
        _ => None,
    }
}

/// The schedule's models in a directory of their own.
fn models_dir(schedule: &Schedule) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "hypura-budget-property-{}-{}",
        schedule.seed,
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    for model in &schedule.models {
        let file = format!("{}.gguf", model.trim_end_matches(":latest"));
        let kept =
            spec_of(model).map_or_else(common::smollm2, |spec| cached::model(&spec).unwrap());
        cached::link_into(&kept, &dir, &file).unwrap();
    }
    dir
}

fn serve(dir: &Path, schedule: &Schedule) -> Server {
    let args: Vec<String> = [
        "serve",
        dir.to_str().unwrap(),
        "--port",
        "0",
        "--context",
        "1024",
        "--parallel",
        &schedule.parallel.to_string(),
        "--ram-budget",
        &format!("{}MiB", schedule.budget_mib),
    ]
    .map(String::from)
    .to_vec();
    Server::start_logging(&args, "info,llama.cpp=error")
}

fn get(server: &Server, path: &str) -> Value {
    client()
        .get(server.url(path))
        .send()
        .unwrap()
        .json()
        .unwrap()
}

/// The budget's books, checked: charged and the peak within the limit on
/// each tier. The RAM charged now.
fn books(server: &Server, when: &str) -> u64 {
    let status = get(server, "/api/status");
    let b = &status["budget"];
    let field = |key: &str| {
        b[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key} in {status}"))
    };
    let (ram, gpu) = (field("ram_limit_bytes"), field("gpu_limit_bytes"));
    assert!(field("ram_charged_bytes") <= ram, "{when}: {b}");
    assert!(field("gpu_charged_bytes") <= gpu, "{when}: {b}");
    assert!(field("ram_peak_charged_bytes") <= ram, "{when}: {b}");
    assert!(field("gpu_peak_charged_bytes") <= gpu, "{when}: {b}");
    field("ram_charged_bytes")
}

/// One request as it went.
#[derive(Debug)]
struct Outcome {
    /// Sent, its head read (once admitted and loaded), and answered (the
    /// last line read), from the schedule's start.
    sent: Duration,
    head: Duration,
    ended: Duration,
    status: u16,
    /// The final JSON object (the error for a refusal; none when dropped).
    reply: Value,
}

impl Outcome {
    fn nanos(&self, key: &str) -> Duration {
        Duration::from_nanos(self.reply[key].as_u64().unwrap_or(0))
    }

    /// Prompt and decode, as the reply times them; for a stream dropped
    /// before its end (no reply times it), from its head to its last line read.
    fn work(&self) -> Duration {
        if self.reply["done"] == false {
            return self.ended - self.head;
        }
        self.nanos("prompt_eval_duration") + self.nanos("eval_duration")
    }
}

fn body(model: &str, tokens: u64, client: Client) -> Value {
    let mut body = json!({
        "model": model,
        "prompt": "Once upon a time",
        "raw": true,
        "stream": matches!(client, Client::Streamed | Client::Drops(_)),
        "options": {"temperature": 0, "num_predict": tokens}
    });
    if client == Client::KeepAlive0 {
        body["keep_alive"] = json!(0);
    }
    body
}

/// Sends `arrival` at its time; how it went.
fn run_one(server: &Server, start: Instant, arrival: &Arrival) -> Outcome {
    std::thread::sleep(arrival.at.saturating_sub(start.elapsed()));
    let sent = start.elapsed();
    let reply = client()
        .post(server.url("/api/generate"))
        .json(&body(arrival.model, arrival.tokens, arrival.client))
        .send()
        .unwrap();
    let head = start.elapsed();
    let status = reply.status().as_u16();
    let streamed = reply
        .headers()
        .get("content-type")
        .is_some_and(|t| t == "application/x-ndjson");
    let reply = if status == 200 && streamed {
        let lines = match arrival.client {
            Client::Drops(n) => n,
            _ => usize::MAX,
        };
        let mut last = Value::Null;
        let reader = std::io::BufRead::lines(std::io::BufReader::new(reply));
        for line in reader.take(lines) {
            last = serde_json::from_str(&line.unwrap()).unwrap();
            assert!(last.get("error").is_none(), "{arrival:?}: {last}");
        }
        last
    } else {
        reply.json().unwrap_or(Value::Null)
    };
    Outcome {
        sent,
        head,
        ended: start.elapsed(),
        status,
        reply,
    }
}

/// Each model's cold load alone (the others unloaded), from its reply's
/// `load_duration`; unloaded again after.
fn load_times(server: &Server, models: &[&'static str]) -> Vec<(&'static str, Duration)> {
    models
        .iter()
        .map(|&model| {
            let reply = client()
                .post(server.url("/api/generate"))
                .json(&body(model, 1, Client::KeepAlive0))
                .send()
                .unwrap();
            assert_eq!(reply.status(), 200, "{model}");
            let reply: Value = reply.json().unwrap();
            let load = Duration::from_nanos(reply["load_duration"].as_u64().unwrap());
            books(server, &format!("after {model}'s first load"));
            wait_until(Duration::from_secs(60), "the model unloaded", || {
                get(server, "/api/ps")["models"] == json!([])
            });
            (model, load)
        })
        .collect()
}

/// Names listed `unavailable` by `/api/tags`: those checked to be
/// refused, naming the least they need.
fn unfit(server: &Server, schedule: &Schedule) -> Vec<String> {
    let tags = get(server, "/api/tags");
    let listed = tags["models"].as_array().unwrap();
    assert_eq!(listed.len(), schedule.models.len(), "{tags}");
    listed
        .iter()
        .filter(|m| m.get("unavailable").is_some())
        .map(|m| {
            let why = m["unavailable"].as_str().unwrap();
            assert!(why.contains("needs at least"), "{m}");
            m["name"].as_str().unwrap().to_string()
        })
        .collect()
}

fn run(schedule: &Schedule) {
    eprintln!("{schedule:?}");
    let dir = models_dir(schedule);
    let server = serve(&dir, schedule);
    let unfit = unfit(&server, schedule);
    let fit: Vec<&'static str> = schedule
        .models
        .iter()
        .copied()
        .filter(|m| !unfit.iter().any(|u| u == m))
        .collect();
    assert!(!fit.is_empty(), "the synthetic models fit 300 MiB");
    let loads = load_times(&server, &fit);
    let all_loads: Duration = loads.iter().map(|(_, l)| *l).sum();

    let start = Instant::now();
    let start_unix = std::time::UNIX_EPOCH.elapsed().unwrap();
    let done = AtomicBool::new(false);
    let samples = AtomicU64::new(0);
    let outcomes: Vec<Outcome> = std::thread::scope(|s| {
        let (server, done, samples) = (&server, &done, &samples);
        let sampler = s.spawn(move || {
            // Every 10 ms: the peak catches what falls between samples.
            while !done.load(Ordering::SeqCst) {
                books(server, "while the schedule runs");
                samples.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        let requests: Vec<_> = schedule
            .arrivals
            .iter()
            .map(|arrival| {
                s.spawn(move || {
                    let outcome = run_one(server, start, arrival);
                    books(server, &format!("after {arrival:?} ended"));
                    samples.fetch_add(1, Ordering::Relaxed);
                    outcome
                })
            })
            .collect();
        let outcomes = requests.into_iter().map(|r| r.join().unwrap()).collect();
        done.store(true, Ordering::SeqCst);
        sampler.join().unwrap();
        outcomes
    });

    // The server's log, for a failure.
    let log_file =
        std::env::temp_dir().join(format!("hypura-budget-property-{}.log", schedule.seed));
    std::fs::write(&log_file, server.log()).unwrap();
    eprintln!("  server log: {}", log_file.display());
    eprintln!("  the schedule started at {start_unix:?} (since 1970)");

    // Every request answered, within the work ahead of it, its own work and loads.
    let mut worst = Duration::ZERO;
    for (i, (arrival, r)) in schedule.arrivals.iter().zip(&outcomes).enumerate() {
        let took = r.ended - r.sent;
        if unfit.iter().any(|u| u == arrival.model) {
            assert_eq!(r.status, 400, "{arrival:?}: {:?}", r.reply);
            let error = r.reply["error"].as_str().unwrap();
            assert!(error.contains("needs at least"), "{error}");
            assert!(took <= OVERHEAD, "refused at once: {arrival:?} {took:?}");
            continue;
        }
        assert_eq!(r.status, 200, "{arrival:?}: {:?}", r.reply);
        if !matches!(arrival.client, Client::Drops(_)) {
            assert_eq!(r.reply["done"], true, "{arrival:?}: {:?}", r.reply);
        }
        let ahead = schedule
            .arrivals
            .iter()
            .zip(&outcomes)
            .enumerate()
            .filter(|&(j, (a, q))| {
                // Those that came before it, and those of its burst answered
                // before it (the server took them in some order).
                a.at < arrival.at || (j != i && a.at == arrival.at && q.ended <= r.ended)
            })
            .map(|(_, (_, q))| q.ended.saturating_sub(r.sent))
            .max()
            .unwrap_or_default();
        eprintln!(
            "  {:>16} {:<11} sent {:>6.2} s, took {:>6.2} s: ahead {:>6.2} s, load_duration \
             {:>6.2} s, work {:>6.2} s",
            arrival.model,
            format!("{:?}", arrival.client),
            r.sent.as_secs_f64(),
            took.as_secs_f64(),
            ahead.as_secs_f64(),
            r.nanos("load_duration").as_secs_f64(),
            r.work().as_secs_f64()
        );
        let bound = ahead + r.work() + all_loads + OVERHEAD;
        worst = worst.max(took.saturating_sub(ahead + r.work() + all_loads));
        assert!(
            took <= bound,
            "seed {}: {arrival:?} took {took:?}: more than the work ahead ({ahead:?}), its own \
             ({:?}), loads ({all_loads:?}) and {OVERHEAD:?}; load_duration {:?}",
            schedule.seed,
            r.work(),
            r.nanos("load_duration")
        );
    }
    let waiting = &get(&server, "/api/ps")["waiting"];
    assert_eq!(waiting["total"], 0, "{waiting}");

    // keep_alive 0 unloads every model; the books come back to 0; each answers again.
    for model in &fit {
        let r = client()
            .post(server.url("/api/generate"))
            .json(&json!({"model": model, "keep_alive": 0}))
            .send()
            .unwrap();
        assert_eq!(r.status(), 200, "{model}");
    }
    wait_until(Duration::from_secs(60), "every model unloaded", || {
        get(&server, "/api/ps")["models"] == json!([])
    });
    wait_until(Duration::from_secs(60), "the books at 0", || {
        books(&server, "after unloading") == 0
    });
    for model in &fit {
        let r = client()
            .post(server.url("/api/generate"))
            .json(&body(model, 2, Client::Whole))
            .send()
            .unwrap();
        assert_eq!(r.status(), 200, "{model}");
    }
    books(&server, "at the end");
    let log = server.log();
    assert!(!log.contains("panicked"), "{log}");
    eprintln!(
        "seed {}: {} requests in {:.1} s, {} samples of the books, loads {loads:?}; \
         beyond the work ahead, its own and the loads, the slowest took {worst:?}",
        schedule.seed,
        outcomes.len(),
        outcomes
            .iter()
            .map(|o| o.ended)
            .max()
            .unwrap()
            .as_secs_f64(),
        samples.load(Ordering::Relaxed),
    );
    drop(server);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn random_arrivals_under_random_budgets_are_all_answered_in_time_within_the_budget() {
    for seed in seeds() {
        run(&draw(seed));
    }
}
