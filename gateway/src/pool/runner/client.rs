//! The gateway's side of a runner connection, and [`RunnerBackend`]: a model
//! in a runner process behind [`ModelBackend`].
//!
//! The socket is read by one thread of its own ([`Connection::start`]), not
//! by a task: the trait's synchronous calls (`status`, `memory`,
//! `count_tokens`) wait for their reply without depending on the async
//! runtime, and wait off it ([`off_runtime`]), with deadlines kept by the
//! runner's [`RunnerProcess`] (a runner that stops answering is answered for
//! from what it said last, then killed). Each call registers where its
//! replies go; when the socket closes (the runner exited or crashed) every
//! call still waiting gets a [`Msg::Failed`], so every stream in flight ends
//! with an error event.
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::mpsc;

use super::process::RunnerProcess;
use super::protocol::{parse_frame, Call, Msg, Op, Reply};
use crate::core::backend::{
    BackendError, BackendEvent, BackendStatus, EmbedOutput, EventStream, KvCache, MemoryUse,
    ModelBackend, ModelFacts, Residency, StreamCounters,
};
use crate::core::blocking::off_runtime;
use crate::core::request::{BackendRequest, EmbedBatch};
use crate::pool::registry::ModelLease;

/// How long writing one frame to a runner may block.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a call's replies go.
enum Waiter {
    Sync(std::sync::mpsc::Sender<Msg>),
    Async(mpsc::UnboundedSender<Msg>),
}

impl Waiter {
    fn send(&self, msg: Msg) -> bool {
        match self {
            Waiter::Sync(tx) => tx.send(msg).is_ok(),
            Waiter::Async(tx) => tx.send(msg).is_ok(),
        }
    }
}

/// Calls waiting for replies; once the socket closed, why it closed.
type Waiting = Result<HashMap<u64, Waiter>, String>;

/// One connection to a runner. Lock order: `writer` and `waiting` are
/// never held together.
pub struct Connection {
    writer: Mutex<UnixStream>,
    next_id: AtomicU64,
    waiting: Arc<Mutex<Waiting>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Connection {
    /// Starts reading `stream` on a thread; `on_close` runs on that thread
    /// once the socket closed and every waiting call was failed.
    pub fn start(
        stream: UnixStream,
        name: &str,
        on_close: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<Arc<Connection>> {
        // A runner that stops reading (stopped, hung) fills the socket: a
        // write then fails instead of blocking for ever.
        stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
        let reader = stream.try_clone()?;
        let waiting: Arc<Mutex<Waiting>> = Arc::new(Mutex::new(Ok(HashMap::new())));
        let connection = Arc::new(Connection {
            writer: Mutex::new(stream),
            next_id: AtomicU64::new(1),
            waiting: Arc::clone(&waiting),
        });
        let name = name.to_string();
        std::thread::Builder::new()
            .name(format!("runner-{name}"))
            .spawn(move || {
                let why = read_replies(reader, &waiting);
                let pending = std::mem::replace(&mut *lock(&waiting), Err(why.clone()));
                for (_, waiter) in pending.unwrap_or_default() {
                    waiter.send(Msg::Failed(stopped(&name)));
                }
                on_close();
            })?;
        Ok(connection)
    }

    /// Sends `op`; its replies go to `waiter`. Fails when the runner is gone.
    fn send(&self, op: Op, waiter: Waiter) -> Result<u64, BackendError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        match &mut *lock(&self.waiting) {
            Ok(waiting) => waiting.insert(id, waiter),
            Err(why) => return Err(BackendError::Failed(why.clone())),
        };
        let mut line = serde_json::to_vec(&Call { id, op })
            .map_err(|e| BackendError::Failed(format!("runner call: {e}")))?;
        line.push(b'\n');
        let written = off_runtime(|| {
            let mut writer = lock(&self.writer);
            writer.write_all(&line).inspect_err(|_| {
                // Part of a frame may have gone: the connection is over, and
                // closing it ends the runner's calls (its crash path).
                let _ = writer.shutdown(std::net::Shutdown::Both);
            })
        });
        if let Err(e) = written {
            self.forget(id);
            return Err(BackendError::Failed(format!(
                "the model's runner process cannot be reached: {e}"
            )));
        }
        Ok(id)
    }

    /// Sends `op` without waiting for a reply (`cancel`).
    pub fn notify(&self, op: Op) {
        let (tx, _) = std::sync::mpsc::channel();
        if let Ok(id) = self.send(op, Waiter::Sync(tx)) {
            self.forget(id);
        }
    }

    /// Ends call `id` (a generation): its replies are dropped from now on.
    pub fn cancel(&self, id: u64) {
        self.forget(id);
        self.notify(Op::Cancel { call: id });
    }

    /// Sends `op`; its replies go to the receiver returned, read by the
    /// caller with a deadline of its own ([`RunnerProcess`]'s calls).
    pub fn ask(&self, op: Op) -> Result<(u64, std::sync::mpsc::Receiver<Msg>), BackendError> {
        let (tx, rx) = std::sync::mpsc::channel();
        let id = self.send(op, Waiter::Sync(tx))?;
        Ok((id, rx))
    }

    /// Stops delivering the replies of call `id`.
    pub fn forget(&self, id: u64) {
        if let Ok(waiting) = &mut *lock(&self.waiting) {
            waiting.remove(&id);
        }
    }

    /// Sends `op` and waits (blocking the thread, off the async runtime)
    /// up to `timeout` for its reply.
    pub fn call_blocking(&self, op: Op, timeout: Option<Duration>) -> Msg {
        let (id, rx) = match self.ask(op) {
            Ok(asked) => asked,
            Err(e) => return Msg::Failed(e),
        };
        let reply = off_runtime(|| match timeout {
            Some(t) => rx.recv_timeout(t).ok(),
            None => rx.recv().ok(),
        });
        reply.unwrap_or_else(|| {
            self.forget(id);
            Msg::Failed(BackendError::Failed(
                "the model's runner process did not answer in time".into(),
            ))
        })
    }

    /// Sends `op`; its replies, as they come.
    pub fn call(&self, op: Op) -> Result<(u64, mpsc::UnboundedReceiver<Msg>), BackendError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = self.send(op, Waiter::Async(tx))?;
        Ok((id, rx))
    }

    /// Ends the connection: every call waiting fails with `error` (and any
    /// later one with its message), and the socket is shut so the reader
    /// thread ends (the crash path) even if the runner never writes again.
    pub fn close(&self, error: BackendError) {
        let pending = std::mem::replace(&mut *lock(&self.waiting), Err(error.to_string()));
        for (_, waiter) in pending.unwrap_or_default() {
            waiter.send(Msg::Failed(error.clone()));
        }
        let _ = lock(&self.writer).shutdown(std::net::Shutdown::Both);
    }

    /// Whether the socket closed.
    pub fn is_closed(&self) -> bool {
        lock(&self.waiting).is_err()
    }
}

/// Reads replies until the socket closes; why it closed.
fn read_replies(stream: UnixStream, waiting: &Mutex<Waiting>) -> String {
    for line in BufReader::new(stream).lines() {
        let line = match line {
            Ok(line) => line,
            Err(e) => return format!("reading from the runner: {e}"),
        };
        let reply: Reply = match parse_frame(&line) {
            Ok(reply) => reply,
            Err(e) => return format!("the runner sent a bad frame ({e})"),
        };
        let last = reply.msg.is_last();
        let mut guard = lock(waiting);
        let Ok(calls) = &mut *guard else { break };
        let delivered = calls.get(&reply.id).is_some_and(|w| w.send(reply.msg));
        if last || !delivered {
            calls.remove(&reply.id);
        }
    }
    "the runner closed its connection".into()
}

/// The error every call of a runner gone ends with.
fn stopped(name: &str) -> BackendError {
    BackendError::Failed(format!(
        "the runner process of model '{name}' stopped unexpectedly (it crashed): this request \
         was ended; the model is reloaded on the next request"
    ))
}

fn gone() -> BackendError {
    BackendError::Failed("the model's runner process stopped unexpectedly".into())
}

fn unexpected(msg: Msg) -> BackendError {
    match msg {
        Msg::Failed(e) => e,
        other => BackendError::Failed(format!("the runner answered out of turn: {other:?}")),
    }
}

/// A model loaded in a runner process, held by one request's lease: the
/// runner stays up while this lives.
pub struct RunnerBackend {
    lease: ModelLease,
    runner: Arc<RunnerProcess>,
}

impl RunnerBackend {
    pub fn new(lease: ModelLease, runner: Arc<RunnerProcess>) -> RunnerBackend {
        RunnerBackend { lease, runner }
    }

    fn connection(&self) -> &Connection {
        self.runner.connection()
    }
}

impl ModelBackend for RunnerBackend {
    fn generate(
        &self,
        request: BackendRequest,
    ) -> BoxFuture<'_, Result<EventStream, BackendError>> {
        async move {
            let request = crate::pool::local::with_grammar(request)?;
            let runner = Arc::clone(&self.runner);
            runner.check_answering()?;
            let (id, mut replies) = self.connection().call(Op::Generate(Box::new(request)))?;
            let guard = CancelOnDrop {
                runner: Arc::clone(&runner),
                id,
                finished: false,
            };
            match replies.recv().await {
                Some(Msg::Accepted) => {}
                Some(other) => return Err(unexpected(other)),
                None => return Err(gone()),
            }
            let shutdown = self.lease.shutdown_signal();
            Ok(events(replies, guard, shutdown))
        }
        .boxed()
    }

    fn embed(&self, batch: EmbedBatch) -> BoxFuture<'_, Result<EmbedOutput, BackendError>> {
        async move {
            let (id, mut replies) = self.connection().call(Op::Embed(batch))?;
            // A client that leaves drops this future: the runner stops the
            // embedding at its next input instead of finishing every one.
            let mut guard = CancelOnDrop {
                runner: Arc::clone(&self.runner),
                id,
                finished: false,
            };
            let reply = replies.recv().await;
            guard.finished = true;
            match reply {
                Some(Msg::Embedded(output)) => Ok(output),
                Some(other) => Err(unexpected(other)),
                None => Err(gone()),
            }
        }
        .boxed()
    }

    fn count_tokens(&self, text: &str) -> Result<usize, BackendError> {
        let op = Op::CountTokens {
            text: text.to_string(),
        };
        self.runner.count(op)
    }

    fn prompt_tokens(&self, request: &BackendRequest) -> Result<usize, BackendError> {
        self.runner
            .count(Op::PromptTokens(Box::new(request.clone())))
    }

    fn status(&self) -> BackendStatus {
        // A runner gone serves nothing.
        self.runner.status().unwrap_or(BackendStatus {
            context_length: self.lease.n_ctx_per_seq,
            active: 0,
            queued: 0,
            parallel: 0,
            decode_tokens_per_second: None,
        })
    }

    fn facts(&self) -> ModelFacts {
        self.lease.info.facts()
    }

    fn memory(&self) -> MemoryUse {
        self.lease.memory()
    }

    fn set_residency(&self, level: Residency) -> Result<(), BackendError> {
        self.lease
            .set_residency(level)
            .map_err(BackendError::Invalid)
    }

    fn streaming(&self) -> Option<StreamCounters> {
        self.runner.streaming()
    }

    fn kv_cache(&self) -> Option<KvCache> {
        self.runner.kv_cache()
    }
}

/// Cancels a generation or an embedding in the runner when its stream or
/// future is dropped before its end.
struct CancelOnDrop {
    runner: Arc<RunnerProcess>,
    id: u64,
    finished: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.finished {
            self.runner.connection().cancel(self.id);
        }
    }
}

/// Resolves once `signal` turns true; never if its sender is gone.
async fn shutdown(signal: &mut tokio::sync::watch::Receiver<bool>) {
    if signal.wait_for(|&stop| stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The runner's events for one generation, ended by an error when the
/// runner goes away or the server cancels in-flight requests.
fn events(
    replies: mpsc::UnboundedReceiver<Msg>,
    guard: CancelOnDrop,
    shutdown_signal: tokio::sync::watch::Receiver<bool>,
) -> EventStream {
    let state = Some((replies, guard, shutdown_signal));
    futures_util::stream::unfold(state, |state| async move {
        let (mut replies, mut guard, mut signal) = state?;
        let msg = tokio::select! {
            biased;
            msg = replies.recv() => msg,
            () = shutdown(&mut signal) => {
                return Some((BackendEvent::Error(BackendError::ShuttingDown(
                    "the server is shutting down: this request was cancelled, send it again later"
                        .into(),
                )), None));
            }
        };
        let event = match msg {
            Some(Msg::Event(event)) => event,
            Some(Msg::Failed(e)) => BackendEvent::Error(e),
            Some(other) => BackendEvent::Error(unexpected(other)),
            None => BackendEvent::Error(gone()),
        };
        let last = matches!(event, BackendEvent::Done(_) | BackendEvent::Error(_));
        if last {
            guard.finished = true;
            return Some((event, None));
        }
        Some((event, Some((replies, guard, signal))))
    })
    .boxed()
}
