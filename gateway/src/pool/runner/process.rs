//! Starting and watching runner processes.
//!
//! A runner is `hypura runner --socket PATH` (this same executable). The
//! gateway binds the socket in a private directory (mode 0700, removed once
//! the runner connected), starts the child, accepts its one connection and
//! says `hello`. The child's stderr is piped: each line is copied to the
//! gateway's stderr and the last [`STDERR_TAIL_LINES`] are kept, so that a
//! crash is logged with what the runner said last.
//!
//! A runner must answer in time: the quick calls (status, memory, counters)
//! wait [`QUICK_CALL_TIMEOUT`], the token counts [`COUNT_CALL_TIMEOUT`] (a
//! count past it is cancelled in the runner: it renders and tokenizes off
//! its read loop, so a slow count is work, not silence), and a watchdog
//! thread asks for its status every [`HEARTBEAT_INTERVAL`]. Once a quick
//! call goes unanswered past its deadline the runner is *stalled* until
//! that call's reply comes: the quick calls no longer wait for it (they
//! answer with what it said last), and once stalled for
//! [`REFUSE_STALLED_AFTER`] generations and token counts for it fail at
//! once (503) instead of waiting; a runner stalled
//! for [`KILL_STALLED_AFTER`] that missed [`KILL_AFTER_MISSES`] deadlines is
//! killed, a crash like any other (its model reloads on its next request).
//!
//! Children never outlive the gateway: they are started from one
//! long-lived thread ([`spawn_child`]) and set `PR_SET_PDEATHSIG` (SIGKILL)
//! on themselves first thing (the signal follows the thread that forked
//! them, hence the one thread); a [`RunnerProcess`] dropped kills its child.
use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use super::client::Connection;
use super::protocol::{LoadSpec, Msg, Op, VERSION};
use crate::core::backend::{
    BackendError, BackendStatus, KvCache, Residency, StreamCounters, TierBytes,
};
use crate::core::blocking::off_runtime;

/// Lines of a runner's stderr kept for its crash report.
pub const STDERR_TAIL_LINES: usize = 20;

/// How long a runner may take to connect and answer `hello`.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a status, memory, streaming or KV cache call waits for its reply.
pub const QUICK_CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a token count (a prompt rendered and tokenized) waits.
pub const COUNT_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a runner may be stalled before work for it (a generation, a
/// token count) is refused at once rather than sent.
pub const REFUSE_STALLED_AFTER: Duration = Duration::from_secs(5);
/// How often the watchdog asks a runner for its status.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(2);
/// How long a runner may leave a call unanswered before it is killed…
pub const KILL_STALLED_AFTER: Duration = Duration::from_secs(20);
/// …having missed this many deadlines meanwhile (so a single slow call
/// never kills it).
pub const KILL_AFTER_MISSES: u32 = 3;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runner processes of one server: the executable and what they cost.
#[derive(Debug)]
pub struct Runners {
    exe: PathBuf,
    /// Crashes so far (runners that exited without being asked to).
    crashes: Arc<AtomicU64>,
    /// RSS of an idle runner (started, llama.cpp's backends initialised,
    /// no model): charged to every runner's model under a budget.
    pub overhead_ram_bytes: u64,
    /// GPU memory an idle runner takes (its GPU context: the drop in the
    /// GPUs' free memory while it runs; 0 without a GPU), charged likewise.
    pub overhead_gpu_bytes: u64,
}

impl Runners {
    /// Measures an idle runner of this executable once.
    pub fn start() -> Result<Runners, String> {
        let exe = std::env::current_exe()
            .map_err(|e| format!("cannot find this executable to start runners: {e}"))?;
        let crashes = Arc::new(AtomicU64::new(0));
        let gpu_free_before = gpu_free_bytes();
        let probe = RunnerProcess::start(&exe, "(probe)", Arc::clone(&crashes))?;
        let overhead_ram_bytes = probe.rss_bytes().unwrap_or(0);
        let overhead_gpu_bytes = gpu_free_before.saturating_sub(gpu_free_bytes());
        probe.stop();
        eprintln!(
            "hypura: models run in runner processes; an idle runner holds {} MiB of RAM \
             and {} MiB of GPU memory (charged to each model under a budget)",
            // In whole MiB, rounded up, as the budget charges it.
            overhead_ram_bytes.div_ceil(1 << 20),
            overhead_gpu_bytes.div_ceil(1 << 20)
        );
        Ok(Runners {
            exe,
            crashes,
            overhead_ram_bytes,
            overhead_gpu_bytes,
        })
    }

    /// Starts a runner for `spec` and loads it there.
    pub fn load(&self, spec: LoadSpec) -> Result<(Arc<RunnerProcess>, u32), String> {
        let runner = RunnerProcess::start(&self.exe, &spec.name, Arc::clone(&self.crashes))?;
        if let Some(rss) = runner.rss_bytes() {
            tracing::info!(
                "{}: runner pid {} started, {} MiB idle",
                spec.name,
                runner.pid,
                rss >> 20
            );
        }
        match runner
            .connection()
            .call_blocking(Op::Load(Box::new(spec)), None)
        {
            Msg::Loaded {
                n_ctx_per_seq,
                placement,
            } => {
                // On the load's span, as an in-process load records it.
                placement.record();
                Ok((runner, n_ctx_per_seq))
            }
            Msg::Failed(e) => Err(e.to_string()),
            other => Err(format!("the runner answered load with {other:?}")),
        }
    }

    /// Runners that crashed since the server started.
    pub fn crashes(&self) -> u64 {
        self.crashes.load(Ordering::Relaxed)
    }
}

/// One runner process and its connection. Dropping it kills the process.
pub struct RunnerProcess {
    pub name: String,
    pub pid: u32,
    connection: Arc<Connection>,
    child: Arc<Mutex<Child>>,
    /// Set before the gateway stops the runner: its exit is no crash.
    stopping: Arc<AtomicBool>,
    /// The call it left unanswered past its deadline, if any.
    stall: Mutex<Option<Stall>>,
    /// What it answered last, standing in for it while it is stalled.
    last: Mutex<LastKnown>,
}

/// A call left unanswered past its deadline.
struct Stall {
    since: Instant,
    /// Deadlines missed since: this call's and every call made meanwhile.
    misses: u32,
    /// Where that call's reply comes: the runner answers again.
    reply: std::sync::mpsc::Receiver<Msg>,
}

/// A runner's last answers to the quick calls.
#[derive(Default)]
struct LastKnown {
    status: Option<BackendStatus>,
    memory: Option<TierBytes>,
    streaming: Option<StreamCounters>,
    kv_cache: Option<KvCache>,
}

impl RunnerProcess {
    fn start(
        exe: &Path,
        name: &str,
        crashes: Arc<AtomicU64>,
    ) -> Result<Arc<RunnerProcess>, String> {
        let failed = |e: &dyn std::fmt::Display| format!("starting a runner for {name}: {e}");
        let dir = private_dir().map_err(|e| failed(&e))?;
        let socket = dir.join("runner.sock");
        let listener = UnixListener::bind(&socket).map_err(|e| failed(&e));
        let started = listener.and_then(|listener| {
            let mut command = Command::new(exe);
            command
                .arg("runner")
                .arg("--socket")
                .arg(&socket)
                .arg("--log-format")
                .arg(match crate::telemetry::log_format() {
                    crate::telemetry::LogFormat::Text => "text",
                    crate::telemetry::LogFormat::Json => "json",
                })
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            let mut child = spawn_child(command).map_err(|e| failed(&e))?;
            let stream = accept(&listener, &mut child).map_err(|e| {
                let _ = child.kill();
                let _ = child.wait();
                failed(&e)
            })?;
            Ok((child, stream))
        });
        let _ = std::fs::remove_dir_all(&dir);
        let (mut child, stream) = started?;
        let pid = child.id();
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let stderr = child
            .stderr
            .take()
            .map(|s| copy_stderr(s, Arc::clone(&tail)));
        let child = Arc::new(Mutex::new(child));
        let stopping = Arc::new(AtomicBool::new(false));
        let watch = Watch {
            name: name.to_string(),
            pid,
            child: Arc::clone(&child),
            stopping: Arc::clone(&stopping),
            stderr,
            tail,
            crashes,
        };
        let connection =
            Connection::start(stream, name, move || watch.closed()).map_err(|e| failed(&e))?;
        let runner = Arc::new(RunnerProcess {
            name: name.to_string(),
            pid,
            connection,
            child,
            stopping,
            stall: Mutex::new(None),
            last: Mutex::new(LastKnown::default()),
        });
        match runner
            .connection
            .call_blocking(Op::Hello { version: VERSION }, Some(START_TIMEOUT))
        {
            Msg::Hello { version, .. } if version == VERSION => {
                watch_heartbeat(&runner);
                Ok(runner)
            }
            Msg::Failed(e) => Err(failed(&e)),
            other => Err(failed(&format!("unexpected hello: {other:?}"))),
        }
    }

    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// Whether the process is gone (its connection closed).
    pub fn is_dead(&self) -> bool {
        self.connection.is_closed()
    }

    /// Resident memory of the process now.
    pub fn rss_bytes(&self) -> Option<u64> {
        rss_bytes(self.pid)
    }

    /// Lets in-flight work finish and refuses new work (the process stays
    /// until dropped).
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Msg::Failed(e) = self.connection.call_blocking(Op::Shutdown, None) {
            tracing::debug!("{}: runner shutdown: {e}", self.name);
        }
    }

    /// Kills the process now.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let mut child = lock(&self.child);
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Sends `op` and waits up to `timeout` for its reply, off the async
    /// runtime. `None`: no reply in time, or the runner has been stalled for
    /// `give_up_after` (then nothing is sent and nothing waits); see the
    /// module's comment.
    fn ask(&self, op: Op, timeout: Duration, give_up_after: Duration) -> Option<Msg> {
        if self
            .stalled_for()
            .is_some_and(|silent| silent >= give_up_after)
        {
            return None;
        }
        // Work (a count) runs off the runner's read loop: one that takes
        // too long is cancelled there, and says nothing about whether the
        // runner answers (the quick calls and the heartbeat tell).
        let work = matches!(op, Op::CountTokens { .. } | Op::PromptTokens(_));
        let (id, reply) = match self.connection.ask(op) {
            Ok(asked) => asked,
            Err(e) => return Some(Msg::Failed(e)),
        };
        match off_runtime(|| reply.recv_timeout(timeout)) {
            Ok(msg) => Some(msg),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Some(Msg::Failed(
                BackendError::Failed("the model's runner process stopped".into()),
            )),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if work => {
                self.connection.cancel(id);
                None
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let mut stall = lock(&self.stall);
                match &mut *stall {
                    Some(stall) => {
                        stall.misses += 1;
                        self.connection.forget(id);
                    }
                    None => {
                        tracing::warn!(
                            "{}: the runner (pid {}) did not answer within {} ms",
                            self.name,
                            self.pid,
                            timeout.as_millis()
                        );
                        *stall = Some(Stall {
                            since: Instant::now(),
                            misses: 1,
                            reply,
                        });
                    }
                }
                None
            }
        }
    }

    /// For how long the runner has left a call unanswered past its
    /// deadline (`None`: it answers); counts a missed deadline, and kills a
    /// runner stalled too long.
    fn stalled_for(&self) -> Option<Duration> {
        let mut guard = lock(&self.stall);
        let stall = guard.as_mut()?;
        if !matches!(
            stall.reply.try_recv(),
            Err(std::sync::mpsc::TryRecvError::Empty)
        ) {
            *guard = None;
            return None;
        }
        stall.misses += 1;
        let stalled_for = stall.since.elapsed();
        if stalled_for >= KILL_STALLED_AFTER && stall.misses >= KILL_AFTER_MISSES {
            let misses = stall.misses;
            drop(guard);
            self.declare_dead(stalled_for, misses);
        }
        Some(stalled_for)
    }

    /// Kills a runner that stopped answering: its socket closes, every call
    /// in flight fails, the crash is counted and logged, and its model
    /// reloads on its next request.
    fn declare_dead(&self, stalled_for: Duration, misses: u32) {
        tracing::error!(
            "the runner of {} (pid {}) has not answered for {} s ({misses} deadlines missed): \
             killing it",
            self.name,
            self.pid,
            stalled_for.as_secs()
        );
        // Its calls fail with why, before the socket's close would fail
        // them as a crash.
        self.connection.close(BackendError::Failed(format!(
            "the runner process of model '{}' stopped answering and was killed: this request \
             was ended; the model is reloaded on the next request",
            self.name
        )));
        // Locked only while the watch reaps it, which kills it too.
        if let Ok(mut child) = self.child.try_lock() {
            let _ = child.kill();
        }
    }

    /// `Err` when the runner has been stalled for [`REFUSE_STALLED_AFTER`]:
    /// work sent to it would only wait (a shorter silence may be a busy
    /// moment: the work goes).
    pub fn check_answering(&self) -> Result<(), BackendError> {
        match self.stalled_for() {
            Some(silent) if silent >= REFUSE_STALLED_AFTER => Err(BackendError::Busy(format!(
                "the runner process of model '{}' has not answered for {} s: send the request \
                 again later (a runner that does not answer is restarted)",
                self.name,
                silent.as_secs()
            ))),
            _ => Ok(()),
        }
    }

    /// Its status now, or what it said last while it does not answer
    /// (`None`: it is gone, or never answered).
    pub fn status(&self) -> Option<BackendStatus> {
        match self.ask(Op::Status, QUICK_CALL_TIMEOUT, Duration::ZERO) {
            Some(Msg::Status(status)) => {
                lock(&self.last).status = Some(status.clone());
                Some(status)
            }
            Some(_) => None,
            None => lock(&self.last).status.clone(),
        }
    }

    /// Tokens of a count (`CountTokens`, `PromptTokens`).
    pub fn count(&self, op: Op) -> Result<usize, BackendError> {
        match self.ask(op, COUNT_CALL_TIMEOUT, REFUSE_STALLED_AFTER) {
            Some(Msg::Count(n)) => Ok(n),
            Some(Msg::Failed(e)) => Err(e),
            Some(other) => Err(BackendError::Failed(format!(
                "the runner answered a token count with {other:?}"
            ))),
            None => Err(BackendError::Busy(format!(
                "the runner process of model '{}' did not count the tokens within {} s: send \
                 the request again later",
                self.name,
                COUNT_CALL_TIMEOUT.as_secs()
            ))),
        }
    }

    /// Weight bytes per tier where the runner holds them now, or last
    /// (`None`: it is gone).
    pub fn memory(&self) -> Option<TierBytes> {
        match self.ask(Op::Memory, QUICK_CALL_TIMEOUT, Duration::ZERO) {
            Some(Msg::Memory(tier_bytes)) => {
                lock(&self.last).memory = Some(tier_bytes);
                Some(tier_bytes)
            }
            Some(_) => None,
            None => lock(&self.last).memory,
        }
    }

    /// Its streaming counters since load, now or last (`None`: it never
    /// streamed, or it is gone).
    pub fn streaming(&self) -> Option<StreamCounters> {
        match self.ask(Op::Streaming, QUICK_CALL_TIMEOUT, Duration::ZERO) {
            Some(Msg::Streaming(counters)) => {
                lock(&self.last).streaming = counters.clone();
                counters
            }
            Some(_) => None,
            None => lock(&self.last).streaming.clone(),
        }
    }

    /// Its KV cache now or last (`None`: it is gone).
    pub fn kv_cache(&self) -> Option<KvCache> {
        match self.ask(Op::KvCache, QUICK_CALL_TIMEOUT, Duration::ZERO) {
            Some(Msg::KvCache(kv)) => {
                lock(&self.last).kv_cache = kv;
                kv
            }
            Some(_) => None,
            None => lock(&self.last).kv_cache,
        }
    }

    /// Moves the model from `from` to `to` in the runner; returns once the
    /// runner made the move (a switch of placement loads the new one first).
    pub fn set_residency(&self, from: Residency, to: Residency) -> Result<(), String> {
        match self
            .connection
            .call_blocking(Op::SetResidency { from, to }, None)
        {
            Msg::Ok => Ok(()),
            Msg::Failed(e) => Err(e.to_string()),
            other => Err(format!("the runner answered set_residency with {other:?}")),
        }
    }

    /// Test hook: asks the runner to abort (honoured only when it runs
    /// with `HYPURA_RUNNER_TEST_HOOKS=1`).
    pub fn abort(&self) -> Result<(), BackendError> {
        match self
            .connection
            .call_blocking(Op::Abort, Some(Duration::from_secs(5)))
        {
            Msg::Failed(BackendError::Failed(_)) if self.is_dead() => Ok(()),
            Msg::Failed(e) => Err(e),
            _ => Ok(()),
        }
    }
}

impl RunnerProcess {
    /// Test hook: asks the runner to take and keep `bytes` of memory
    /// (honoured only when it runs with `HYPURA_RUNNER_TEST_HOOKS=1`).
    pub fn ballast(&self, bytes: u64) -> Result<(), BackendError> {
        match self
            .connection
            .call_blocking(Op::Ballast { bytes }, Some(Duration::from_secs(30)))
        {
            Msg::Ok => Ok(()),
            Msg::Failed(e) => Err(e),
            other => Err(BackendError::Failed(format!(
                "the runner answered ballast with {other:?}"
            ))),
        }
    }
}

impl Drop for RunnerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Asks `runner` for its status every [`HEARTBEAT_INTERVAL`], so that one
/// that stops answering is found (and killed) even when nothing else asks;
/// ends with the runner.
fn watch_heartbeat(runner: &Arc<RunnerProcess>) {
    let runner = Arc::downgrade(runner);
    let started = std::thread::Builder::new()
        .name("runner-heartbeat".into())
        .spawn(move || loop {
            std::thread::sleep(HEARTBEAT_INTERVAL);
            let Some(runner) = runner.upgrade() else {
                return;
            };
            if runner.is_dead() || runner.stopping.load(Ordering::SeqCst) {
                return;
            }
            let _ = runner.status();
        });
    if let Err(e) = started {
        tracing::warn!("no heartbeat for a runner: {e}");
    }
}

/// What the connection's reader thread does once the runner's socket closed.
struct Watch {
    name: String,
    pid: u32,
    child: Arc<Mutex<Child>>,
    stopping: Arc<AtomicBool>,
    stderr: Option<std::thread::JoinHandle<()>>,
    tail: Arc<Mutex<VecDeque<String>>>,
    crashes: Arc<AtomicU64>,
}

impl Watch {
    /// Reaps the child; a crash is counted and logged with its stderr's tail.
    fn closed(self) {
        if self.stopping.load(Ordering::SeqCst) {
            return;
        }
        let status = wait_for_exit(&self.child, Duration::from_secs(5));
        if self.stopping.load(Ordering::SeqCst) {
            return;
        }
        // The pipe closes when the process is gone: the tail is complete.
        if let Some(stderr) = self.stderr {
            let _ = stderr.join();
        }
        self.crashes.fetch_add(1, Ordering::Relaxed);
        crate::metrics::runner_crashed(&self.name);
        let tail: Vec<String> = lock(&self.tail)
            .iter()
            .map(|line| format!("  | {line}"))
            .collect();
        let status = status.map_or_else(|| "did not exit (killed)".into(), describe);
        tracing::error!(
            "the runner of {} (pid {}) crashed: {status}; in-flight requests were ended and the \
             model reloads on its next request. Its last stderr lines:\n{}",
            self.name,
            self.pid,
            tail.join("\n")
        );
    }
}

/// The child's exit status, waiting up to `timeout` (then killing it).
fn wait_for_exit(child: &Mutex<Child>, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    let mut child = lock(child);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}{}", signal_name(signal)),
        _ => status.to_string(),
    }
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        6 => " (SIGABRT)",
        9 => " (SIGKILL)",
        11 => " (SIGSEGV)",
        7 => " (SIGBUS)",
        _ => "",
    }
}

/// Copies the child's stderr lines to ours and keeps the last ones.
fn copy_stderr(
    stderr: std::process::ChildStderr,
    tail: Arc<Mutex<VecDeque<String>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).split(b'\n') {
            let Ok(line) = line else { break };
            let line = String::from_utf8_lossy(&line).into_owned();
            eprintln!("{line}");
            let mut tail = lock(&tail);
            if tail.len() == STDERR_TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(line);
        }
    })
}

/// A new directory only this user can enter.
fn private_dir() -> std::io::Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    let dir = std::env::temp_dir().join(format!(
        "hypura-runner-{}-{}-{nanos:x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

/// The runner's connection, or an error if it exits or takes too long.
fn accept(listener: &UnixListener, child: &mut Child) -> std::io::Result<UnixStream> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                return Ok(stream);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        if let Some(status) = child.try_wait()? {
            return Err(std::io::Error::other(format!(
                "the runner exited before connecting ({})",
                describe(status)
            )));
        }
        if Instant::now() > deadline {
            return Err(std::io::Error::other("the runner did not connect in time"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

type SpawnRequest = (Command, std::sync::mpsc::Sender<std::io::Result<Child>>);

/// Spawns `command` from the one thread that forks runners. That thread
/// lives as long as the process: a child's parent-death signal fires when
/// the thread that forked it ends, not the process.
fn spawn_child(command: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<std::sync::mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("runner-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("starting the runner spawner thread");
        Mutex::new(tx)
    });
    let (tx, rx) = std::sync::mpsc::channel();
    lock(spawner)
        .send((command, tx))
        .map_err(|_| std::io::Error::other("the runner spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| std::io::Error::other("the runner spawner thread is gone"))?
}

/// Free memory of every GPU together now.
fn gpu_free_bytes() -> u64 {
    llama_tiered::llama::gpu_devices()
        .iter()
        .map(|d| d.free_bytes)
        .sum()
}

/// Resident set size of process `pid`, from `/proc`.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kib * 1024)
}
