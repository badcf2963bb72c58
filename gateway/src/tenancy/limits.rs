//! Each key's limits, counted over the last minute: requests per minute
//! (`rpm`), tokens per minute (`tpm`, prompt and generated tokens of the
//! requests that ended in the window) and requests at once (`concurrent`,
//! waiting or running). A request over one is refused with 429 and
//! OpenAI's `x-ratelimit-*` headers (which every response of a limited key
//! carries), and `retry-after` in seconds.
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::keys::Tenant;

const WINDOW: Duration = Duration::from_secs(60);

/// The windows of every key that has limits.
#[derive(Default)]
pub struct Limiter {
    keys: Mutex<HashMap<Arc<str>, Window>>,
}

#[derive(Default)]
struct Window {
    /// When each request of the last minute was let in.
    requests: VecDeque<Instant>,
    /// Tokens of the requests that ended in the last minute.
    tokens: VecDeque<(Instant, u64)>,
    in_flight: u32,
    /// The key's `max_context` as of its latest request ([`Limiter::max_context`]).
    max_context: Option<u32>,
}

/// Which limit a request went over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exceeded {
    Requests,
    Tokens,
    Concurrent,
}

impl Exceeded {
    /// Its label in `hypura_user_rejected_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Exceeded::Requests => "rpm",
            Exceeded::Tokens => "tpm",
            Exceeded::Concurrent => "concurrent",
        }
    }
}

/// A refusal: what was exceeded, the message, and when to retry.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    pub exceeded: Exceeded,
    pub message: String,
    pub retry_after: Duration,
    pub headers: RateHeaders,
}

/// OpenAI's `x-ratelimit-*` values of a key after this request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RateHeaders {
    pub requests: Option<(u32, u32, Duration)>,
    pub tokens: Option<(u64, u64, Duration)>,
}

impl RateHeaders {
    /// `(name, value)` pairs: limit, remaining and reset of requests and tokens.
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some((limit, remaining, reset)) = self.requests {
            out.push(("x-ratelimit-limit-requests", limit.to_string()));
            out.push(("x-ratelimit-remaining-requests", remaining.to_string()));
            out.push(("x-ratelimit-reset-requests", duration_text(reset)));
        }
        if let Some((limit, remaining, reset)) = self.tokens {
            out.push(("x-ratelimit-limit-tokens", limit.to_string()));
            out.push(("x-ratelimit-remaining-tokens", remaining.to_string()));
            out.push(("x-ratelimit-reset-tokens", duration_text(reset)));
        }
        out
    }
}

/// OpenAI's way of writing a reset time: `1s`, `6m0s`, `120ms`.
pub fn duration_text(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let s = d.as_secs_f64().ceil() as u64;
    if s < 60 {
        format!("{s}s")
    } else {
        format!("{}m{}s", s / 60, s % 60)
    }
}

/// A request counted in its key's `concurrent`; dropping it ends it.
pub struct InFlight {
    limiter: Arc<Limiter>,
    key: Arc<str>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut keys = self.limiter.lock();
        if let Some(w) = keys.get_mut(&self.key) {
            w.in_flight = w.in_flight.saturating_sub(1);
        }
    }
}

impl Limiter {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Window>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Lets a request of `tenant` in, counted, or says which limit it is over.
    pub fn admit(
        self: &Arc<Self>,
        tenant: &Tenant,
        now: Instant,
    ) -> Result<(InFlight, RateHeaders), Refused> {
        let limits = &tenant.limits;
        let mut keys = self.lock();
        let w = keys.entry(Arc::clone(&tenant.name)).or_default();
        w.expire(now);
        w.max_context = limits.max_context;
        let used_tokens: u64 = w.tokens.iter().map(|(_, t)| t).sum();
        let token_reset = |w: &Window, limit: u64| {
            // When enough of the window's tokens leave it to be under the limit.
            let mut left = used_tokens;
            for (at, t) in &w.tokens {
                left -= t;
                if left < limit {
                    return (*at + WINDOW).saturating_duration_since(now);
                }
            }
            Duration::ZERO
        };
        let request_reset = |w: &Window| {
            w.requests.front().map_or(Duration::ZERO, |at| {
                (*at + WINDOW).saturating_duration_since(now)
            })
        };
        let mut headers = RateHeaders {
            requests: limits.rpm.map(|limit| {
                let used = w.requests.len() as u32;
                (limit, limit.saturating_sub(used), request_reset(w))
            }),
            tokens: limits.tpm.map(|limit| {
                (
                    limit,
                    limit.saturating_sub(used_tokens),
                    token_reset(w, limit),
                )
            }),
        };
        let name = &tenant.name;
        let refusal = if let Some(limit) = limits.rpm.filter(|l| w.requests.len() >= *l as usize) {
            let retry = request_reset(w);
            Some((
                Exceeded::Requests,
                format!(
                    "rate limit reached for key {name} on requests per minute: limit {limit}, \
                     used {}; try again in {}",
                    w.requests.len(),
                    duration_text(retry)
                ),
                retry,
            ))
        } else if let Some(limit) = limits.tpm.filter(|l| used_tokens >= *l) {
            let retry = token_reset(w, limit);
            Some((
                Exceeded::Tokens,
                format!(
                    "rate limit reached for key {name} on tokens per minute: limit {limit}, \
                     used {used_tokens}; try again in {}",
                    duration_text(retry)
                ),
                retry,
            ))
        } else {
            limits
                .concurrent
                .filter(|l| w.in_flight >= *l)
                .map(|limit| {
                    (
                        Exceeded::Concurrent,
                        format!(
                            "key {name} has {limit} requests running or waiting, its limit: wait \
                         for one to end"
                        ),
                        Duration::from_secs(1),
                    )
                })
        };
        if let Some((exceeded, message, retry_after)) = refusal {
            return Err(Refused {
                exceeded,
                message,
                retry_after,
                headers,
            });
        }
        if limits.rpm.is_some() {
            w.requests.push_back(now);
            if let Some((limit, _, _)) = headers.requests {
                headers.requests = Some((
                    limit,
                    limit.saturating_sub(w.requests.len() as u32),
                    request_reset(w),
                ));
            }
        }
        w.in_flight += 1;
        Ok((
            InFlight {
                limiter: Arc::clone(self),
                key: Arc::clone(&tenant.name),
            },
            headers,
        ))
    }

    /// The `max_context` of `key` as its latest request found it (the
    /// keys file may have changed since): what caps the context of the
    /// requests it let in ([`super::usage::context_cap`]).
    pub fn max_context(&self, key: &str) -> Option<u32> {
        self.lock().get(key).and_then(|w| w.max_context)
    }

    /// `tokens` used by a request of `key` that ended now.
    pub fn used(&self, key: &Arc<str>, tokens: u64, now: Instant) {
        if tokens == 0 {
            return;
        }
        let mut keys = self.lock();
        if let Some(w) = keys.get_mut(key) {
            w.tokens.push_back((now, tokens));
        }
    }
}

impl Window {
    fn expire(&mut self, now: Instant) {
        while self.requests.front().is_some_and(|at| *at + WINDOW <= now) {
            self.requests.pop_front();
        }
        while self
            .tokens
            .front()
            .is_some_and(|(at, _)| *at + WINDOW <= now)
        {
            self.tokens.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenancy::keys::{Limits, Role};

    fn tenant(limits: Limits) -> Tenant {
        Tenant {
            limits,
            ..Tenant::unlimited("k", Role::User)
        }
    }

    #[test]
    fn requests_per_minute_refuse_the_one_over_and_say_when() {
        let limiter = Arc::new(Limiter::default());
        let t = tenant(Limits {
            rpm: Some(2),
            ..Limits::default()
        });
        let start = Instant::now();
        let (_a, h) = limiter.admit(&t, start).unwrap();
        assert_eq!(h.requests, Some((2, 1, WINDOW)));
        let later = start + Duration::from_secs(20);
        let (_b, h) = limiter.admit(&t, later).unwrap();
        assert_eq!(h.requests.unwrap().1, 0);
        let refused = limiter.admit(&t, later).err().unwrap();
        assert_eq!(refused.exceeded, Exceeded::Requests);
        assert_eq!(refused.retry_after, Duration::from_secs(40));
        assert_eq!(
            refused.headers.pairs()[..2],
            [
                ("x-ratelimit-limit-requests", "2".to_string()),
                ("x-ratelimit-remaining-requests", "0".to_string())
            ]
        );
        assert!(limiter.admit(&t, start + WINDOW).is_ok());
    }

    #[test]
    fn tokens_and_concurrency() {
        let limiter = Arc::new(Limiter::default());
        let t = tenant(Limits {
            tpm: Some(100),
            concurrent: Some(1),
            ..Limits::default()
        });
        let now = Instant::now();
        let (held, _) = limiter.admit(&t, now).unwrap();
        let refused = limiter.admit(&t, now).err().unwrap();
        assert_eq!(refused.exceeded, Exceeded::Concurrent);
        drop(held);
        limiter.used(&t.name, 150, now);
        let refused = limiter
            .admit(&t, now + Duration::from_secs(1))
            .err()
            .unwrap();
        assert_eq!(refused.exceeded, Exceeded::Tokens);
        assert_eq!(refused.retry_after, Duration::from_secs(59));
        assert_eq!(
            refused.headers.tokens,
            Some((100, 0, Duration::from_secs(59)))
        );
        assert!(limiter.admit(&t, now + WINDOW).is_ok());
    }

    #[test]
    fn a_key_s_max_context_as_its_latest_request_found_it() {
        let limiter = Arc::new(Limiter::default());
        let mut t = tenant(Limits {
            max_context: Some(64),
            ..Limits::default()
        });
        assert_eq!(limiter.max_context("k"), None);
        let now = Instant::now();
        let _a = limiter.admit(&t, now).unwrap();
        assert_eq!(limiter.max_context("k"), Some(64));
        t.limits.max_context = None;
        let _b = limiter.admit(&t, now).unwrap();
        assert_eq!(limiter.max_context("k"), None);
    }

    #[test]
    fn reset_times_read_like_openais() {
        assert_eq!(duration_text(Duration::from_millis(120)), "120ms");
        assert_eq!(duration_text(Duration::from_millis(1500)), "2s");
        assert_eq!(duration_text(Duration::from_secs(360)), "6m0s");
    }
}
