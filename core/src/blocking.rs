//! Waiting in synchronous code that may run on a worker of the async
//! runtime (a route's request translation, a `ModelBackend` call).
use tokio::runtime::{Handle, RuntimeFlavor};

/// Runs `wait` (something that blocks: a join, a reply with a deadline) so
/// that the runtime's other tasks keep running meanwhile: on a worker of a
/// multi-threaded runtime, the worker first hands its tasks to another
/// thread ([`tokio::task::block_in_place`]); anywhere else (a plain thread,
/// a blocking task, a current-thread runtime in tests) it just runs.
pub fn off_runtime<T>(wait: impl FnOnce() -> T) -> T {
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(wait)
        }
        _ => wait(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_anywhere() {
        assert_eq!(off_runtime(|| 1), 1);
        let current = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_eq!(current.block_on(async { off_runtime(|| 2) }), 2);
    }

    /// A worker waiting does not hold up the runtime's other tasks.
    #[test]
    fn other_tasks_run_while_a_worker_waits() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let waiter = tokio::spawn(async move { off_runtime(move || rx.recv()) });
            // With one worker, this runs only if the waiter gave it up.
            let other = tokio::spawn(async move { tx.send(()) });
            other.await.unwrap().unwrap();
            waiter.await.unwrap().unwrap();
        });
    }
}
