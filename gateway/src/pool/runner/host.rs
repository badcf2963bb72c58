//! The runner's side: connect to the gateway, load the one model it asks
//! for, and answer its calls ([`super::protocol`]) until the connection
//! closes, then exit.
//!
//! Replies go through one channel to one writer task, so frames of
//! concurrent calls never interleave within a line. Each generation and
//! token count runs in a task of its own; `cancel` aborts that task, which
//! drops the event stream and so cancels the generation in the engine.
//!
//! The read loop never renders or tokenizes: a chat template render and its
//! tokenization (up to a second each for a conversation of many messages)
//! run on [`PromptWorkers`], so `status` (the gateway's heartbeat) and the
//! other quick calls are answered meanwhile. A count or generation
//! cancelled before its turn on a worker never runs.
use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use futures_util::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use super::protocol::{parse_frame, Call, LoadSpec, Msg, Op, Reply, TEST_HOOKS_ENV, VERSION};
use crate::core::backend::{BackendError, ModelBackend, TierBytes};
use crate::pool::local::LocalBackend;
use crate::pool::registry::{self, Engine, LoadedModel, ModelLease};
use crate::pool::residency::BudgetedModel;

/// The model this runner holds.
struct Held {
    model: Arc<LoadedModel>,
    backend: Arc<LocalBackend>,
    budgeted: Option<BudgetedModel>,
}

struct Host {
    replies: mpsc::UnboundedSender<Reply>,
    held: OnceLock<Arc<Held>>,
    /// Generations and token counts running, by call id.
    running: Mutex<HashMap<u64, tokio::task::AbortHandle>>,
    prompts: PromptWorkers,
}

/// Threads that render and tokenize prompts, off the async runtime (whose
/// two workers run the read loop). Jobs wait in one queue; a job whose
/// caller is gone (its call cancelled, its task aborted) is skipped.
struct PromptWorkers {
    jobs: std::sync::mpsc::Sender<Box<dyn FnOnce() + Send>>,
}

impl PromptWorkers {
    /// Renders at once: as many as the runtime's workers, so that counts and
    /// generations of several clients go on side by side.
    const THREADS: usize = 2;

    fn start() -> std::io::Result<PromptWorkers> {
        let (jobs, queue) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..Self::THREADS {
            let queue = Arc::clone(&queue);
            std::thread::Builder::new()
                .name(format!("prompt-{i}"))
                .spawn(move || loop {
                    // Held while waiting: the other thread waits for the lock.
                    let job = lock(&queue).recv();
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                })?;
        }
        Ok(PromptWorkers { jobs })
    }

    /// Runs `work` on a worker; `None` if the workers are gone. Dropping the
    /// future before a worker took the job cancels it.
    async fn run<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job = Box::new(move || {
            if !tx.is_closed() {
                let _ = tx.send(work());
            }
        });
        self.jobs.send(job).ok()?;
        rx.await.ok()
    }
}

/// A load's error as a client may see it: the server's log has it whole
/// (with the file's path); the reply says why without the path, and
/// without the model's name, which the gateway puts in front.
fn without_path(e: BackendError, name: &str, path: &Path) -> BackendError {
    let BackendError::Failed(message) = e else {
        return e;
    };
    eprintln!("hypura runner: loading {name}: {message}");
    let path = path.display().to_string();
    let message = message
        .replace(&format!("could not load model '{name}': "), "")
        .replace(&format!("could not load model {path}: "), "")
        .replace(&format!("{name}: "), "")
        .replace(&path, "its file");
    BackendError::Failed(message)
}

fn workers_gone() -> BackendError {
    BackendError::Failed("the runner's prompt workers stopped".into())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Holds this runner process to `charge_bytes` of RAM, what the gateway's
/// budget charges its model (weights, contexts, stream cache and an idle
/// runner's own memory): the stream cache gives back what the process holds
/// beyond the charge, checked before each read into it and after each
/// decode ([`llama_tiered::tiered::Streamer::set_host_limit`]), so memory
/// the charge does not see (the model's metadata, pages between streamed
/// slices, a GPU runtime's host side) comes out of the cache rather than
/// out of the other models' share. Nothing to hold without a stream cache
/// (the full placement) or without a charge for the runner itself (a
/// gateway that sent none).
fn hold_to(model: &LoadedModel, budgeted: &BudgetedModel, charge_bytes: u64) {
    let Engine::InProcess(local) = &model.engine else {
        return;
    };
    if budgeted.overhead.ram_bytes == 0 {
        return;
    }
    if let Some(streamer) = local.streamer() {
        streamer.set_host_limit(charge_bytes);
    }
}

/// Serves the gateway listening at `socket` until it closes the connection.
pub async fn serve(socket: &Path) -> std::io::Result<()> {
    let stream = UnixStream::connect(socket).await?;
    let (read, mut write) = stream.into_split();
    let (replies, mut outbox) = mpsc::unbounded_channel::<Reply>();
    let writer = tokio::spawn(async move {
        while let Some(reply) = outbox.recv().await {
            let mut frames = Vec::new();
            // Everything ready goes in one write.
            for reply in std::iter::once(reply).chain(std::iter::from_fn(|| outbox.try_recv().ok()))
            {
                if serde_json::to_writer(&mut frames, &reply).is_err() {
                    continue;
                }
                frames.push(b'\n');
            }
            if write.write_all(&frames).await.is_err() {
                break;
            }
        }
    });
    let host = Arc::new(Host {
        replies,
        held: OnceLock::new(),
        running: Mutex::new(HashMap::new()),
        prompts: PromptWorkers::start()?,
    });
    let mut lines = BufReader::new(read).lines();
    while let Some(line) = lines.next_line().await? {
        let call: Call = match parse_frame(&line) {
            Ok(call) => call,
            Err(e) => {
                eprintln!("hypura runner: a bad frame from the gateway ({e}): stopping");
                break;
            }
        };
        Arc::clone(&host).dispatch(call);
    }
    writer.abort();
    Ok(())
}

impl Host {
    fn reply(&self, id: u64, msg: Msg) {
        let _ = self.replies.send(Reply { id, msg });
    }

    fn held(&self) -> Result<Arc<Held>, BackendError> {
        self.held
            .get()
            .cloned()
            .ok_or_else(|| BackendError::Failed("the runner has no model loaded".into()))
    }

    fn dispatch(self: Arc<Self>, call: Call) {
        let id = call.id;
        match call.op {
            Op::Hello { version } if version == VERSION => self.reply(
                id,
                Msg::Hello {
                    version: VERSION,
                    pid: std::process::id(),
                },
            ),
            Op::Hello { version } => self.reply(
                id,
                Msg::Failed(BackendError::Invalid(format!(
                    "this runner speaks protocol version {VERSION}, not {version}"
                ))),
            ),
            Op::Load(spec) => {
                tokio::task::spawn_blocking(move || {
                    let (name, path) = (spec.name.clone(), spec.path.clone());
                    let msg = self
                        .load(*spec)
                        .unwrap_or_else(|e| Msg::Failed(without_path(e, &name, &path)));
                    self.reply(id, msg);
                });
            }
            Op::Generate(request) => self.generate(id, *request),
            Op::Cancel { call } => {
                if let Some(task) = lock(&self.running).remove(&call) {
                    task.abort();
                }
            }
            Op::Embed(batch) => {
                // Tracked: `cancel` (the client left) aborts the task, which
                // drops the embedding and so stops it at its next input.
                let host = Arc::clone(&self);
                self.track(id, async move {
                    let msg = match host.held() {
                        Ok(held) => match held.backend.embed(batch).await {
                            Ok(output) => Msg::Embedded(output),
                            Err(e) => Msg::Failed(e),
                        },
                        Err(e) => Msg::Failed(e),
                    };
                    host.reply(id, msg);
                });
            }
            Op::CountTokens { text } => {
                self.count(id, move |backend| backend.count_tokens(&text));
            }
            Op::PromptTokens(request) => {
                self.count(id, move |backend| backend.prompt_tokens(&request));
            }
            Op::Status => {
                let msg = self
                    .held()
                    .map_or_else(Msg::Failed, |held| Msg::Status(held.backend.status()));
                self.reply(id, msg);
            }
            Op::Memory => {
                let msg = self
                    .held()
                    .map_or_else(Msg::Failed, |held| Msg::Memory(held.tier_bytes()));
                self.reply(id, msg);
            }
            Op::Streaming => {
                let msg = self
                    .held()
                    .map_or_else(Msg::Failed, |held| Msg::Streaming(held.backend.streaming()));
                self.reply(id, msg);
            }
            Op::KvCache => {
                let msg = self
                    .held()
                    .map_or_else(Msg::Failed, |held| Msg::KvCache(held.backend.kv_cache()));
                self.reply(id, msg);
            }
            Op::SetResidency { from, to } => {
                tokio::task::spawn_blocking(move || {
                    let moved = self.held().and_then(|held| {
                        let budgeted = held.budgeted.as_ref().ok_or_else(|| {
                            BackendError::Invalid("the model was loaded without a budget".into())
                        })?;
                        let charge = |level| budgeted.footprint_at(level).ram_bytes;
                        // While it moves, the budget charges the larger end of
                        // a resize, and both placements of a switch.
                        let moving =
                            if budgeted.is_full_placement(from) != budgeted.is_full_placement(to) {
                                charge(from) + charge(to) - budgeted.overhead.ram_bytes
                            } else {
                                charge(from).max(charge(to))
                            };
                        hold_to(&held.model, budgeted, moving);
                        let moved = held
                            .model
                            .move_in_process(budgeted, from, to)
                            .map_err(BackendError::Failed);
                        let level = if moved.is_ok() { to } else { from };
                        hold_to(&held.model, budgeted, charge(level));
                        moved
                    });
                    self.reply(id, moved.map_or_else(Msg::Failed, |()| Msg::Ok));
                });
            }
            Op::Shutdown => {
                tokio::task::spawn_blocking(move || {
                    if let Ok(held) = self.held() {
                        held.model.shutdown();
                    }
                    self.reply(id, Msg::Ok);
                });
            }
            Op::Abort if std::env::var(TEST_HOOKS_ENV).as_deref() == Ok("1") => {
                eprintln!("hypura runner: aborting on the test hook's request");
                std::process::abort();
            }
            Op::Ballast { bytes } if std::env::var(TEST_HOOKS_ENV).as_deref() == Ok("1") => {
                // Written, so resident; kept until the process ends.
                static BALLAST: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
                let taken = usize::try_from(bytes).map(|n| vec![1u8; n]);
                let msg = match taken {
                    Ok(v) => {
                        lock(&BALLAST).push(v);
                        Msg::Ok
                    }
                    Err(_) => Msg::Failed(BackendError::Invalid("too many bytes".into())),
                };
                self.reply(id, msg);
            }
            Op::Abort | Op::Ballast { .. } => self.reply(
                id,
                Msg::Failed(BackendError::Invalid(format!(
                    "test hooks are off in this runner ({TEST_HOOKS_ENV} is not 1)"
                ))),
            ),
        }
    }

    fn load(&self, spec: LoadSpec) -> Result<Msg, BackendError> {
        if self.held.get().is_some() {
            return Err(BackendError::Invalid(
                "this runner already holds a model".into(),
            ));
        }
        let (named, settings, budgeted) = super::from_spec(spec).map_err(BackendError::Failed)?;
        let model = registry::load(&named, &settings, budgeted.clone())
            .map_err(|e| BackendError::Failed(e.to_string()))?;
        let n_ctx_per_seq = model.n_ctx_per_seq;
        let lease = ModelLease::standalone(Arc::clone(&model));
        let Engine::InProcess(local) = &model.engine else {
            return Err(BackendError::Failed(
                "a runner loads in its own process".into(),
            ));
        };
        if let Some((budgeted, level)) = &budgeted {
            hold_to(&model, budgeted, budgeted.footprint_at(*level).ram_bytes);
        }
        let placement = local.placement.clone();
        let backend = Arc::new(LocalBackend::new(lease, Arc::clone(local)));
        let held = Held {
            model,
            backend,
            budgeted: budgeted.map(|(model, _)| model),
        };
        let _ = self.held.set(Arc::new(held));
        Ok(Msg::Loaded {
            n_ctx_per_seq,
            placement,
        })
    }

    fn generate(self: Arc<Self>, id: u64, request: crate::core::request::BackendRequest) {
        let host = Arc::clone(&self);
        self.track(id, async move { host.stream(id, request).await });
    }

    /// Counts tokens with `count` on a prompt worker, and replies.
    fn count(
        self: Arc<Self>,
        id: u64,
        count: impl FnOnce(&LocalBackend) -> Result<usize, BackendError> + Send + 'static,
    ) {
        let host = Arc::clone(&self);
        self.track(id, async move {
            let counted = match host.held() {
                Ok(held) => host
                    .prompts
                    .run(move || count(&held.backend))
                    .await
                    .unwrap_or_else(|| Err(workers_gone())),
                Err(e) => Err(e),
            };
            host.reply(id, counted.map_or_else(Msg::Failed, Msg::Count));
        });
    }

    /// Runs call `id`'s `work` in a task that `cancel {call: id}` aborts.
    fn track(self: &Arc<Self>, id: u64, work: impl Future<Output = ()> + Send + 'static) {
        let host = Arc::clone(self);
        // Held across the spawn: the task removes itself only once it is in.
        let mut running = lock(&self.running);
        let task = tokio::spawn(async move {
            work.await;
            lock(&host.running).remove(&id);
        });
        running.insert(id, task.abort_handle());
    }
}

impl Host {
    /// Runs one generation, its events sent as they come.
    async fn stream(&self, id: u64, request: crate::core::request::BackendRequest) {
        let held = match self.held() {
            Ok(held) => held,
            Err(e) => return self.reply(id, Msg::Failed(e)),
        };
        // Tokenized (and rendered, unless its length was asked first) on a
        // prompt worker.
        let backend = Arc::clone(&held.backend);
        let submitted = self.prompts.run(move || backend.submit(request)).await;
        let mut events = match submitted.unwrap_or_else(|| Err(workers_gone())) {
            Ok(events) => events,
            Err(e) => return self.reply(id, Msg::Failed(e)),
        };
        self.reply(id, Msg::Accepted);
        while let Some(event) = events.next().await {
            self.reply(id, Msg::Event(event));
        }
    }
}

impl Held {
    /// Where the weights are now; without a budget, all in RAM (as the
    /// gateway reports an in-process model without one).
    fn tier_bytes(&self) -> TierBytes {
        match (&self.model.engine, &self.budgeted) {
            (Engine::InProcess(local), Some(budgeted)) => local.tier_bytes(budgeted),
            _ => TierBytes {
                gpu: 0,
                ram: self.model.info.file_bytes,
                stream: 0,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_load_error_reaches_the_client_without_the_path() {
        let e = BackendError::Failed(
            "could not load model 'm:latest': could not load model /x/m.gguf: llama.cpp could \
             not load it"
                .into(),
        );
        assert_eq!(
            without_path(e, "m:latest", Path::new("/x/m.gguf")),
            BackendError::Failed("llama.cpp could not load it".into())
        );
        let e = BackendError::Failed("m:latest: /x/m.gguf is cut short".into());
        assert_eq!(
            without_path(e, "m:latest", Path::new("/x/m.gguf")),
            BackendError::Failed("its file is cut short".into())
        );
    }
}
