//! Request bodies in memory, bounded (issue 30, items 5, 6 and 9).
//!
//! Every routed request's body (uploads aside: they stream to disk) is read
//! here, whole, before its handler runs, under three bounds:
//! - **its size**: a `Content-Length` over the limit is a 413 before a byte is
//!   read; a body without one is a 413 once it passes the limit;
//! - **the memory of all bodies together** ([`BodyBudget`]): a body takes its
//!   room (its `Content-Length`, or room grown as it arrives) before it is
//!   read, and gives it back when the last copy of its bytes is dropped (the
//!   room travels with the bytes). A body that finds no room within
//!   [`ROOM_WAIT`] is a 503, its bytes read and thrown away meanwhile
//!   (so the client sees the answer instead of a reset connection);
//! - **its time**: the whole body must arrive within the body timeout of the
//!   request's head (not of its last byte: a trickle of one byte a second
//!   would reset a per-read timer forever), else a 408 and the connection
//!   closed;
//! - **its JSON's shape** ([`JsonShape`]): a JSON body nested deeper than
//!   [`MAX_JSON_DEPTH`] is a 400 (the runner's frames wrap a request's values
//!   a few levels deeper, and must stay within serde_json's 128), and one
//!   whose values, parsed, would take more than the budget is a 413. Parsed,
//!   each value takes [`PARSED_VALUE_BYTES`], 36 times a `0,` of the body:
//!   the body holds room for that too, so the bodies in memory bound their
//!   parsed values as well.
//!
//! After a burst of big bodies the memory goes back to the system: large
//! buffers are mapped, not taken from the heap ([`return_freed_memory`] at
//! start), and the heap is trimmed once they are freed ([`BodyBudget::trim_if_due`]).
use std::ops::Not;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use futures_util::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// The default of `[server] body_memory`: the bodies of all requests being
/// read or handled together.
pub const DEFAULT_BODY_MEMORY_BYTES: usize = 256 << 20;
/// The default of `[server] body_timeout`: the longest a whole request body
/// may take to arrive.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest a body waits for room in the budget before it is a 503.
pub const ROOM_WAIT: Duration = Duration::from_secs(2);
/// The budget counts in units of this many bytes (a semaphore takes at most
/// `u32::MAX` permits at once).
const UNIT_BYTES: usize = 1024;
/// Room taken at first by a body of unknown length, then doubled as needed.
const FIRST_ROOM_BYTES: usize = 64 * 1024;
/// A body declared larger than the limit, up to this many times it, is
/// read and dropped before its 413.
const DRAIN_TOO_LARGE_TIMES: u64 = 4;
/// A freed body at least this large asks for the heap to be trimmed.
const TRIM_AFTER_BYTES: usize = 1 << 20;
/// The deepest a JSON body may nest (objects and arrays).
pub const MAX_JSON_DEPTH: usize = 100;
/// What one JSON value of a body may take once parsed into
/// `serde_json::Value`s: the value, and an object member's key and map entry.
pub const PARSED_VALUE_BYTES: usize = 2 * std::mem::size_of::<serde_json::Value>();
/// Bodies at least this large are scanned off the async workers.
const SCAN_ON_A_THREAD_BYTES: usize = 1 << 20;

/// Bytes of request bodies in memory, all requests together.
#[derive(Debug)]
pub struct BodyBudget {
    room: Arc<Semaphore>,
    /// The permits of `room` when no body holds any.
    units: usize,
    capacity_bytes: usize,
    /// The largest body of one request.
    max_bytes: usize,
    /// The longest a whole body may take to arrive.
    timeout: Duration,
    /// A large body was freed since the last trim.
    trim_due: Arc<AtomicBool>,
}

/// Why a body was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// It is larger than the limit (bytes) for one body.
    TooLarge { limit: usize },
    /// The bodies in memory left it no room in time.
    NoRoom { capacity: usize },
    /// It did not arrive whole within the timeout.
    TimedOut { timeout: Duration },
    /// The connection broke or the framing was invalid.
    Broken(String),
    /// Its JSON nests deeper than [`MAX_JSON_DEPTH`].
    TooDeep { depth: usize },
    /// Its JSON has more values than the budget holds parsed.
    TooManyValues { values: usize, limit: usize },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Refusal::TooLarge { limit } => write!(
                f,
                "request body too large: the limit is {limit} bytes ([server] max_body_bytes)"
            ),
            Refusal::NoRoom { capacity } => write!(
                f,
                "the server is reading too many request bodies at once (their {capacity} bytes \
                 of memory, [server] body_memory, are taken): retry shortly"
            ),
            Refusal::TimedOut { timeout } => write!(
                f,
                "the request body did not arrive within {} s",
                timeout.as_secs()
            ),
            Refusal::Broken(e) => write!(f, "could not read the request body: {e}"),
            Refusal::TooDeep { depth } => write!(
                f,
                "the request body's JSON nests {depth} levels deep: the limit is {MAX_JSON_DEPTH}"
            ),
            Refusal::TooManyValues { values, limit } => write!(
                f,
                "the request body's JSON has about {values} values: the limit is {limit} \
                 ([server] body_memory)"
            ),
        }
    }
}

/// A body's bytes and the room they hold in the budget, given back when the
/// last [`Bytes`] sharing them is dropped.
struct Held {
    bytes: Vec<u8>,
    _room: OwnedSemaphorePermit,
    trim_due: Arc<AtomicBool>,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.bytes.capacity() >= TRIM_AFTER_BYTES {
            self.trim_due.store(true, Ordering::Relaxed);
        }
    }
}

fn units(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(UNIT_BYTES)).unwrap_or(u32::MAX)
}

impl BodyBudget {
    /// A budget of `capacity_bytes` (at least one body of `max_bytes`: a body
    /// the limit allows always fits alone), bodies of at most `max_bytes`
    /// each, each arriving within `timeout`.
    pub fn new(capacity_bytes: usize, max_bytes: usize, timeout: Duration) -> BodyBudget {
        let capacity_bytes = capacity_bytes.max(max_bytes).max(UNIT_BYTES);
        let permits = (capacity_bytes / UNIT_BYTES).min(Semaphore::MAX_PERMITS);
        BodyBudget {
            room: Arc::new(Semaphore::new(permits)),
            units: permits,
            capacity_bytes,
            max_bytes,
            timeout,
            trim_due: Arc::new(AtomicBool::new(false)),
        }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Bytes of the budget free now.
    pub fn free_bytes(&self) -> usize {
        self.room.available_permits() * UNIT_BYTES
    }

    /// Reads `body` whole within the bounds; `declared` is its
    /// `Content-Length`, if sent; `expects_continue`: the client waits for
    /// `100 Continue` before it sends the body.
    pub async fn read(
        &self,
        body: Body,
        declared: Option<u64>,
        expects_continue: bool,
    ) -> Result<Bytes, Refusal> {
        let deadline = Instant::now() + self.timeout;
        if let Some(len) = declared {
            if len > self.max_bytes as u64 {
                // A client that sends its whole body before it reads the
                // answer (most do) would see a reset connection instead of
                // the 413: up to a few times the limit, the body is read
                // and dropped first. A client that waits (`Expect:
                // 100-continue`) gets the 413 at once.
                if expects_continue.not() && len <= DRAIN_TOO_LARGE_TIMES * self.max_bytes as u64 {
                    drain(body, deadline, usize::try_from(len).unwrap_or(usize::MAX)).await;
                }
                return Err(Refusal::TooLarge {
                    limit: self.max_bytes,
                });
            }
        }
        let first = declared.map_or(FIRST_ROOM_BYTES.min(self.max_bytes), |len| len as usize);
        let Some(mut room) = self.take_room(first, deadline).await else {
            drain(body, deadline, self.max_bytes).await;
            return Err(Refusal::NoRoom {
                capacity: self.capacity_bytes,
            });
        };
        let mut bytes: Vec<u8> = Vec::new();
        bytes
            .try_reserve_exact(first)
            .map_err(|_| Refusal::NoRoom {
                capacity: self.capacity_bytes,
            })?;
        let mut body = body.into_data_stream();
        loop {
            let data = match tokio::time::timeout_at(deadline, body.next()).await {
                Err(_) => {
                    return Err(Refusal::TimedOut {
                        timeout: self.timeout,
                    })
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(Refusal::Broken(e.to_string())),
                Ok(Some(Ok(data))) => data,
            };
            let needed = bytes.len() + data.len();
            if needed > self.max_bytes {
                drop(bytes);
                drop(room);
                drain(body, deadline, self.max_bytes).await;
                return Err(Refusal::TooLarge {
                    limit: self.max_bytes,
                });
            }
            if needed > bytes.capacity() {
                // Only a body without a Content-Length grows (hyper holds a
                // body to the length it declared).
                let grown = needed.max(bytes.capacity() * 2).min(self.max_bytes);
                let more = self
                    .take_room(grown - bytes.capacity(), deadline)
                    .await
                    .ok_or(Refusal::NoRoom {
                        capacity: self.capacity_bytes,
                    });
                let more = match more {
                    Ok(more) => more,
                    Err(refusal) => {
                        drop(bytes);
                        drop(room);
                        drain(body, deadline, self.max_bytes).await;
                        return Err(refusal);
                    }
                };
                room.merge(more);
                bytes
                    .try_reserve_exact(grown - bytes.len())
                    .map_err(|_| Refusal::NoRoom {
                        capacity: self.capacity_bytes,
                    })?;
            }
            bytes.extend_from_slice(&data);
        }
        let (bytes, shape) = JsonShape::of_body(bytes).await;
        if shape.depth > MAX_JSON_DEPTH {
            return Err(Refusal::TooDeep { depth: shape.depth });
        }
        let parsed = shape.values.saturating_mul(PARSED_VALUE_BYTES);
        if parsed > self.capacity_bytes {
            return Err(Refusal::TooManyValues {
                values: shape.values,
                limit: self.capacity_bytes / PARSED_VALUE_BYTES,
            });
        }
        if parsed > bytes.capacity() {
            let more = self
                .take_room(parsed - bytes.capacity(), deadline)
                .await
                .ok_or(Refusal::NoRoom {
                    capacity: self.capacity_bytes,
                })?;
            room.merge(more);
        }
        Ok(Bytes::from_owner(Held {
            bytes,
            _room: room,
            trim_due: Arc::clone(&self.trim_due),
        }))
    }

    /// Room for `bytes`, waiting at most [`ROOM_WAIT`] (and never past
    /// `deadline`).
    async fn take_room(&self, bytes: usize, deadline: Instant) -> Option<OwnedSemaphorePermit> {
        let wait = deadline.min(Instant::now() + ROOM_WAIT);
        let acquire = Arc::clone(&self.room).acquire_many_owned(units(bytes));
        tokio::time::timeout_at(wait, acquire).await.ok()?.ok()
    }

    /// Gives freed heap memory back to the system when a large body was
    /// freed since the last call and no body is in memory now (a trim
    /// while bodies are arriving would be undone at once). Call it now and
    /// then, off the async workers (a trim walks the heap).
    pub fn trim_if_due(&self) {
        if self.room.available_permits() < self.units {
            return;
        }
        if self.trim_due.swap(false, Ordering::Relaxed) {
            trim_heap();
        }
    }
}

/// The shape of a JSON text, found in one pass without parsing it: how deep
/// its objects and arrays nest, and about how many values it holds (one per
/// object or array and per `,`, plus one). A body that does not begin as a
/// JSON object or array has no shape (zero, zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JsonShape {
    pub depth: usize,
    pub values: usize,
}

impl JsonShape {
    pub fn of(text: &[u8]) -> JsonShape {
        let start = text.iter().position(|b| !b.is_ascii_whitespace());
        if !matches!(start.map(|i| text[i]), Some(b'{' | b'[')) {
            return JsonShape::default();
        }
        let mut shape = JsonShape {
            depth: 0,
            values: 1,
        };
        let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
        for &b in text {
            if in_string {
                match b {
                    _ if escaped => escaped = false,
                    b'\\' => escaped = true,
                    b'"' => in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_string = true,
                b'{' | b'[' => {
                    depth += 1;
                    shape.depth = shape.depth.max(depth);
                    shape.values += 1;
                }
                b'}' | b']' => depth = depth.saturating_sub(1),
                b',' => shape.values += 1,
                _ => {}
            }
        }
        shape
    }

    /// [`JsonShape::of`] a body's bytes; a large body is scanned on a
    /// blocking thread (a 32 MiB one takes tens of milliseconds).
    async fn of_body(bytes: Vec<u8>) -> (Vec<u8>, JsonShape) {
        if bytes.len() < SCAN_ON_A_THREAD_BYTES {
            let shape = JsonShape::of(&bytes);
            return (bytes, shape);
        }
        let scan = tokio::task::spawn_blocking(move || {
            let shape = JsonShape::of(&bytes);
            (bytes, shape)
        });
        scan.await.expect("a JSON scan does not panic")
    }
}

/// Reads and drops what is left of `body` (at most `limit` bytes, until
/// `deadline`), so that the answer reaches a client still sending instead
/// of a reset connection.
async fn drain(body: impl Into<Drained>, deadline: Instant, limit: usize) {
    let mut body = body.into().0;
    let mut seen = 0usize;
    while seen <= limit {
        match tokio::time::timeout_at(deadline, body.next()).await {
            Ok(Some(Ok(data))) => seen += data.len(),
            _ => return,
        }
    }
}

/// A body being thrown away.
struct Drained(axum::body::BodyDataStream);

impl From<Body> for Drained {
    fn from(body: Body) -> Drained {
        Drained(body.into_data_stream())
    }
}

impl From<axum::body::BodyDataStream> for Drained {
    fn from(stream: axum::body::BodyDataStream) -> Drained {
        Drained(stream)
    }
}

/// Buffers of at least 1 MiB are mapped and unmapped on their own instead
/// of coming from the heap: glibc raises its threshold to the largest
/// buffer freed (up to 32 MiB), after which big request bodies stay in the
/// heap and its memory is never returned. Call once at start.
pub fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes two integers and only sets allocator parameters;
    // glibc serializes it with allocations.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// Returns the heap's free pages to the system.
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes an integer and only releases free memory;
    // glibc locks each arena while it walks it.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(chunks: &[&'static [u8]]) -> Body {
        let chunks: Vec<Result<Bytes, std::io::Error>> =
            chunks.iter().map(|c| Ok(Bytes::from_static(c))).collect();
        Body::from_stream(futures_util::stream::iter(chunks))
    }

    #[tokio::test]
    async fn room_is_held_while_the_bytes_live() {
        let budget = BodyBudget::new(8 * 1024, 4 * 1024, Duration::from_secs(5));
        let a = budget
            .read(body(&[&[b'a'; 3000]]), Some(3000), false)
            .await
            .unwrap();
        assert_eq!(a.len(), 3000);
        assert_eq!(budget.free_bytes(), 5 * 1024);
        let shared = a.slice(10..20);
        drop(a);
        assert_eq!(budget.free_bytes(), 5 * 1024, "a slice keeps the room");
        drop(shared);
        assert_eq!(budget.free_bytes(), 8 * 1024);
    }

    #[tokio::test]
    async fn no_room_is_a_refusal_after_the_wait() {
        let budget = BodyBudget::new(8 * 1024, 8 * 1024, Duration::from_secs(30));
        let held = budget
            .read(body(&[&[b'a'; 8000]]), Some(8000), false)
            .await
            .unwrap();
        let refused = budget.read(body(&[b"{}"]), Some(2), false).await;
        assert_eq!(refused, Err(Refusal::NoRoom { capacity: 8 * 1024 }));
        drop(held);
        assert_eq!(
            budget.read(body(&[b"{}"]), Some(2), false).await.unwrap(),
            "{}"
        );
    }

    #[test]
    fn a_json_shape_counts_outside_strings() {
        let text = br#" {"a": [0, 0, 0], "b": "[[[,,,\"]]]{"}"#;
        assert_eq!(
            JsonShape::of(text),
            JsonShape {
                depth: 2,
                values: 6
            }
        );
        assert_eq!(
            JsonShape::of(b"[[[]]]"),
            JsonShape {
                depth: 3,
                values: 4
            }
        );
        assert_eq!(JsonShape::of(b"hello [[[["), JsonShape::default());
        assert_eq!(JsonShape::of(br#""[[[""#), JsonShape::default());
    }

    /// A body holds room for its values parsed, not only for its bytes.
    #[tokio::test]
    async fn many_values_hold_room_for_their_parse_or_are_refused() {
        let zeros = |n: usize| format!("[{}0]", "0,".repeat(n - 1)).into_bytes();
        let parsed = 1001 * PARSED_VALUE_BYTES;
        let budget = BodyBudget::new(1 << 20, 64 * 1024, Duration::from_secs(5));
        let body = |bytes: Vec<u8>| Body::from(bytes);
        let read = budget
            .read(body(zeros(1000)), Some(2001), false)
            .await
            .unwrap();
        let held = (1 << 20) - budget.free_bytes();
        assert!(
            (parsed..parsed + 2048).contains(&held),
            "{held} for {parsed}"
        );
        drop(read);
        assert_eq!(budget.free_bytes(), 1 << 20);
        let small = BodyBudget::new(64 * 1024, 64 * 1024, Duration::from_secs(5));
        assert_eq!(
            small.read(body(zeros(1000)), Some(2001), false).await,
            Err(Refusal::TooManyValues {
                values: 1001,
                limit: 64 * 1024 / PARSED_VALUE_BYTES
            })
        );
        let deep = format!("{}{}", "[".repeat(101), "]".repeat(101)).into_bytes();
        assert_eq!(
            budget.read(body(deep), Some(202), false).await,
            Err(Refusal::TooDeep { depth: 101 })
        );
    }

    #[tokio::test]
    async fn bodies_without_a_length_grow_to_the_limit() {
        let budget = BodyBudget::new(1 << 20, 100 * 1024, Duration::from_secs(5));
        let chunk: &'static [u8] = &[b'x'; 40 * 1024];
        let read = budget
            .read(body(&[chunk, chunk]), None, false)
            .await
            .unwrap();
        assert_eq!(read.len(), 80 * 1024);
        let refused = budget.read(body(&[chunk, chunk, chunk]), None, false).await;
        assert_eq!(refused, Err(Refusal::TooLarge { limit: 100 * 1024 }));
        assert_eq!(
            budget.read(body(&[]), Some(200 * 1024), false).await,
            Err(Refusal::TooLarge { limit: 100 * 1024 })
        );
        drop(read);
        assert_eq!(budget.free_bytes(), 1 << 20);
    }
}
