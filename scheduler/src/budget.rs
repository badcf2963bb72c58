//! One memory budget across every model a server holds: who is resident, who
//! streams, who is unloaded, and when that changes.
//!
//! The policy is a state machine driven by three calls, each given the time
//! `now` (a [`Duration`] since any fixed origin: tests use a simulated clock):
//! - [`BudgetPolicy::request`] when a request for a model arrives: it is
//!   admitted at once if the model is loaded (at any residency), else the
//!   policy picks the highest residency that fits — demoting idle models to
//!   make room — or asks the caller to wait, or rejects a model that can never
//!   fit;
//! - [`BudgetPolicy::finish`] when a request ends;
//! - [`BudgetPolicy::tick`] now and then: unloads models past their keep-alive,
//!   demotes idle ones to streaming and promotes hot ones toward full residency
//!   (for a model bigger than the budget, its largest stream cache: each
//!   level is a footprint the caller states, [`ModelSpec`]).
//!
//! Every change is a [`Move`] the caller carries out (in the background) and
//! reports with [`BudgetPolicy::move_done`]. While a move runs, the model is
//! charged what both ends need at once ([`ModelSpec::during_move`]): the
//! larger of its old and new footprint when the move resizes one placement in
//! place (a stream cache filled or dropped), both when the new placement is
//! loaded beside the old ([`ModelSpec::full_is_separate`]). So the budget
//! holds at every instant whatever order moves finish in:
//! `Σ charged(model) ≤ budget`, on GPU and RAM separately ([`BudgetPolicy::charged`]).
//!
//! A model with requests in flight is never unloaded (a demotion to streaming
//! is fine: it keeps answering, only slower). Pinned models are never demoted
//! below their pin.
//!
//! A request waiting for room never waits on an idle model: every model with
//! nothing in flight yields to it at once (demoted, or unloaded), whatever
//! its heat or priority; heat and priority only order the victims, and
//! decide between busy models for promotions. When only busy models hold the
//! room it needs, they are marked *draining* for it: they take no new
//! request (those wait too) until it is in, so each waits at most for the
//! work running when it came, plus the loads. Waiters get room in the order
//! they came (a later one leaves room for the earlier ones).
//!
//! Requests the server holds before they ask (the fair gate in front of a
//! model's slots) are announced with [`BudgetPolicy::arrive`]: a model with
//! such a request that came before another's is busy to that other's
//! request (not idle, so never unloaded for it, and drained only after the
//! announced request has run), and an announced request keeps the place
//! its arrival gives it among waiters ([`BudgetPolicy::request_announced`]).
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Bytes on each tier of memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Footprint {
    pub gpu_bytes: u64,
    pub ram_bytes: u64,
}

impl Footprint {
    pub const ZERO: Footprint = Footprint {
        gpu_bytes: 0,
        ram_bytes: 0,
    };

    pub fn new(gpu_bytes: u64, ram_bytes: u64) -> Footprint {
        Footprint {
            gpu_bytes,
            ram_bytes,
        }
    }

    pub fn fits_in(self, room: Footprint) -> bool {
        self.gpu_bytes <= room.gpu_bytes && self.ram_bytes <= room.ram_bytes
    }

    pub fn max(self, other: Footprint) -> Footprint {
        Footprint::new(
            self.gpu_bytes.max(other.gpu_bytes),
            self.ram_bytes.max(other.ram_bytes),
        )
    }

    pub fn saturating_sub(self, other: Footprint) -> Footprint {
        Footprint::new(
            self.gpu_bytes.saturating_sub(other.gpu_bytes),
            self.ram_bytes.saturating_sub(other.ram_bytes),
        )
    }

    fn add(self, other: Footprint) -> Footprint {
        Footprint::new(
            self.gpu_bytes.saturating_add(other.gpu_bytes),
            self.ram_bytes.saturating_add(other.ram_bytes),
        )
    }
}

impl fmt::Display for Footprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} GPU + {} RAM",
            crate::size::format_bytes(self.gpu_bytes),
            crate::size::format_bytes(self.ram_bytes)
        )
    }
}

/// How much of a model is held in memory, from least to most.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Residency {
    /// Nothing in memory.
    #[default]
    Unloaded,
    /// Only the tensors that are never streamed (plus KV cache and the
    /// smallest stream cache): every token reads its streamed weights.
    Streaming,
    /// Streamed weights partly cached in memory.
    Partial,
    /// Every weight in memory: no I/O per token. For a model that could
    /// never be held so within the budget, the most of it the budget holds:
    /// its streaming placement with the largest cache that fits (a cache
    /// resize away from `partial`, not a separate placement).
    Full,
}

impl Residency {
    pub const ALL: [Residency; 4] = [
        Residency::Unloaded,
        Residency::Streaming,
        Residency::Partial,
        Residency::Full,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Residency::Unloaded => "unloaded",
            Residency::Streaming => "streaming",
            Residency::Partial => "partial",
            Residency::Full => "full",
        }
    }
}

impl fmt::Display for Residency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Residency {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "unloaded" | "none" => Ok(Residency::Unloaded),
            "streaming" => Ok(Residency::Streaming),
            "partial" => Ok(Residency::Partial),
            "full" => Ok(Residency::Full),
            other => Err(format!(
                "unknown residency '{other}': use full, partial, streaming or none"
            )),
        }
    }
}

/// What the policy knows of one model.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    pub name: String,
    /// Memory at [`Residency::Streaming`], [`Residency::Partial`] and
    /// [`Residency::Full`], KV cache and compute buffers included; each no
    /// smaller than the one before, except a separate full placement
    /// ([`ModelSpec::full_is_separate`]), which may hold less RAM by holding
    /// GPU memory. A model that cannot stream has all three equal. For a
    /// model whose every weight cannot fit the budget, `full` is what the
    /// budget holds of it at most (up to the whole budget, alone).
    pub streaming: Footprint,
    pub partial: Footprint,
    pub full: Footprint,
    /// Never demoted below this (unless [`Residency::Unloaded`]: no pin).
    pub pin: Residency,
    /// Whether [`Residency::Full`] is a placement of its own (layers on the
    /// GPU, nothing streamed) rather than the streaming placement with a full
    /// cache: moving between it and another loaded residency then loads the
    /// new placement beside the old and frees the old once switched, and is
    /// charged both footprints until done.
    pub full_is_separate: bool,
    /// Higher wins ties in heat and is demoted last.
    pub priority: i32,
    /// Unloaded this long after its last request; `None` = never.
    pub keep_alive: Option<Duration>,
}

impl ModelSpec {
    pub fn footprint(&self, level: Residency) -> Footprint {
        match level {
            Residency::Unloaded => Footprint::ZERO,
            Residency::Streaming => self.streaming,
            Residency::Partial => self.partial,
            Residency::Full => self.full,
        }
    }

    /// What a move from `from` to `to` holds while it runs: both footprints
    /// when it loads a separate placement beside a loaded one, else the
    /// larger (a cache resized in place, a first load, an unload).
    pub fn during_move(&self, from: Residency, to: Residency) -> Footprint {
        let (a, b) = (self.footprint(from), self.footprint(to));
        if self.reloads(from, to) {
            a.add(b)
        } else {
            a.max(b)
        }
    }

    /// Whether moving from `from` to `to` changes placement while loaded
    /// (into or out of a separate full placement).
    pub fn reloads(&self, from: Residency, to: Residency) -> bool {
        let loaded = from != Residency::Unloaded && to != Residency::Unloaded;
        self.full_is_separate && loaded && (from == Residency::Full) != (to == Residency::Full)
    }
}

/// Tuning of [`BudgetPolicy`].
#[derive(Debug, Clone)]
pub struct PolicyConfig {
    /// Heat halves over this time without requests.
    pub heat_half_life: Duration,
    /// A model idle this long is demoted to streaming (its pin permitting).
    pub demote_after: Duration,
    /// A model takes room from a loaded one only if its heat is this many
    /// times the other's (hysteresis: two models of similar heat do not swap
    /// back and forth).
    pub promote_margin: f64,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            heat_half_life: Duration::from_secs(60),
            demote_after: Duration::from_secs(120),
            promote_margin: 2.0,
        }
    }
}

/// Index of a model in the policy.
pub type ModelId = usize;

/// A change of residency for the caller to carry out, then report with
/// [`BudgetPolicy::move_done`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    pub model: ModelId,
    pub from: Residency,
    pub to: Residency,
}

/// The answer to [`BudgetPolicy::request`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Loaded (or being loaded): start as soon as it is.
    Ready,
    /// Load the model (`mv`); the request starts when it is loaded.
    Load { mv: Move },
    /// No room now. `moves` (possibly none) demote colder models to make
    /// some; ask again after the next [`BudgetPolicy::move_done`] or
    /// [`BudgetPolicy::finish`].
    Wait { moves: Vec<Move> },
    /// The model cannot run within the budget at any residency.
    Reject(String),
}

#[derive(Debug, Clone)]
struct ModelState {
    spec: ModelSpec,
    level: Residency,
    /// Set while a move runs: where it goes.
    moving_to: Option<Residency>,
    /// A request for this model waits for its memory since then (the
    /// first ask; cleared once one is admitted).
    waiting_since: Option<Duration>,
    /// The last time a waiting request for it asked: older than
    /// [`WAITING_FRESH`], the waiter is taken to have given up.
    waiting_asked: Option<Duration>,
    /// A request for that model waits for this one's memory, asked at that
    /// time: no new request gets in here until it is admitted (or stops
    /// asking for [`WAITING_FRESH`]).
    drain_for: Option<(ModelId, Duration)>,
    /// A promotion to this level failed (e.g. the full placement did not
    /// load): no promotion to it or above until the model is unloaded.
    failed_at: Option<Residency>,
    in_flight: usize,
    /// Requests announced for it that have not been admitted yet
    /// ([`BudgetPolicy::arrive`]), and when each came.
    coming: Vec<(Ticket, Duration)>,
    /// Requests per half-life, decayed ([`BudgetPolicy::heat`]).
    heat: f64,
    heat_at: Duration,
    last_used: Duration,
}

impl ModelState {
    /// What the model holds against the budget: while moving, the larger of
    /// both ends.
    fn charged(&self) -> Footprint {
        match self.moving_to {
            Some(to) => self.spec.during_move(self.level, to),
            None => self.spec.footprint(self.level),
        }
    }

    /// What moving (idle) to `to` would hold beyond what it holds now.
    fn extra_to(&self, to: Residency) -> Footprint {
        self.spec
            .during_move(self.level, to)
            .saturating_sub(self.charged())
    }

    fn heat_at(&self, now: Duration, half_life: Duration) -> f64 {
        let dt = now.saturating_sub(self.heat_at).as_secs_f64();
        self.heat * 0.5f64.powf(dt / half_life.as_secs_f64().max(1e-9))
    }

    /// Whether nothing runs on it nor is announced for it before `came`
    /// (`None`: announced at all): idle to a request that came then.
    fn idle_for(&self, came: Option<Duration>) -> bool {
        self.in_flight == 0
            && self
                .coming
                .iter()
                .all(|&(_, at)| came.is_some_and(|came| at >= came))
    }

    /// The lowest level a move may take it to now.
    fn floor(&self) -> Residency {
        let floor = if self.in_flight > 0 {
            Residency::Streaming
        } else {
            Residency::Unloaded
        };
        floor.max(self.spec.pin)
    }
}

/// The global budget's state machine (module docs).
#[derive(Debug, Clone)]
pub struct BudgetPolicy {
    budget: Footprint,
    config: PolicyConfig,
    models: Vec<ModelState>,
    next_ticket: Ticket,
}

/// A request announced with [`BudgetPolicy::arrive`].
pub type Ticket = u64;

impl BudgetPolicy {
    pub fn new(budget: Footprint, config: PolicyConfig) -> BudgetPolicy {
        BudgetPolicy {
            budget,
            config,
            models: Vec::new(),
            next_ticket: 0,
        }
    }

    pub fn budget(&self) -> Footprint {
        self.budget
    }

    /// Adds a model, unloaded. Fails when even streaming it would not fit the
    /// whole budget, or when its footprints are not ordered.
    pub fn add_model(&mut self, spec: ModelSpec) -> Result<ModelId, String> {
        let ordered = spec.streaming.fits_in(spec.partial)
            && (spec.full_is_separate || spec.partial.fits_in(spec.full));
        if !ordered {
            return Err(format!(
                "{}: footprints must grow from streaming to partial to full",
                spec.name
            ));
        }
        if !spec.streaming.fits_in(self.budget) {
            return Err(too_big(&spec, self.budget));
        }
        // Pinned models never leave: every other model must still be able to
        // stream beside them all.
        let pinned = self
            .models
            .iter()
            .map(|m| m.spec.footprint(m.spec.pin))
            .fold(spec.footprint(spec.pin), Footprint::add);
        if !pinned.fits_in(self.budget) {
            return Err(format!(
                "{}: pinned at {}, the pinned models would need {pinned}, more than the budget of {}",
                spec.name, spec.pin, self.budget
            ));
        }
        let all = self.models.iter().map(|m| &m.spec).chain([&spec]);
        for other in all {
            let others_pinned = pinned.saturating_sub(other.footprint(other.pin));
            let need = others_pinned.add(other.streaming);
            if !need.fits_in(self.budget) {
                return Err(format!(
                    "{}: with the pinned models holding {others_pinned}, {} could never stream within the budget of {} (it needs {})",
                    spec.name, other.name, self.budget, other.streaming
                ));
            }
        }
        self.models.push(ModelState {
            spec,
            level: Residency::Unloaded,
            moving_to: None,
            failed_at: None,
            waiting_since: None,
            waiting_asked: None,
            drain_for: None,
            in_flight: 0,
            coming: Vec::new(),
            heat: 0.0,
            heat_at: Duration::ZERO,
            last_used: Duration::ZERO,
        });
        Ok(self.models.len() - 1)
    }

    pub fn spec(&self, id: ModelId) -> &ModelSpec {
        &self.models[id].spec
    }

    pub fn residency(&self, id: ModelId) -> Residency {
        self.models[id].level
    }

    /// Where a running move takes the model.
    pub fn moving_to(&self, id: ModelId) -> Option<Residency> {
        self.models[id].moving_to
    }

    pub fn in_flight(&self, id: ModelId) -> usize {
        self.models[id].in_flight
    }

    /// Requests per half-life, decayed to `now`.
    pub fn heat(&self, id: ModelId, now: Duration) -> f64 {
        self.models[id].heat_at(now, self.config.heat_half_life)
    }

    /// What model `id` holds against the budget now.
    pub fn charged_to(&self, id: ModelId) -> Footprint {
        self.models[id].charged()
    }

    /// Σ of every model's charge: never above [`BudgetPolicy::budget`].
    pub fn charged(&self) -> Footprint {
        self.models
            .iter()
            .map(ModelState::charged)
            .fold(Footprint::ZERO, Footprint::add)
    }

    fn room(&self) -> Footprint {
        self.budget.saturating_sub(self.charged())
    }

    /// A request for `id` arrives at `now`. On [`Admission::Ready`] and
    /// [`Admission::Load`] the request counts as in flight until
    /// [`BudgetPolicy::finish`]; on `Wait` and `Reject` it does not.
    ///
    /// An unloaded model is loaded at the highest residency that fits now
    /// (leaving room for the requests that waited before), or that idle
    /// models make room for at once (they yield to a request whatever their
    /// heat), streaming at least: the request starts soon and
    /// [`BudgetPolicy::tick`] promotes the model later if it stays hot.
    /// When not even streaming fits, idle models
    /// yield at once and busy ones are demoted to streaming, or marked
    /// draining when only their unloading would make room
    /// ([`Admission::Wait`]; module docs). A waiting caller asks again after
    /// every change, and at least every [`WAITING_FRESH`].
    pub fn request(&mut self, id: ModelId, now: Duration) -> Admission {
        self.request_announced(id, now, None)
    }

    /// Announces a request for `id` that came at `now` and will ask later
    /// ([`BudgetPolicy::request_announced`] with the ticket), held before
    /// that (e.g. waiting for one of the model's slots): from now on the
    /// model is not idle to requests that come after it. Withdrawn by
    /// [`BudgetPolicy::leave`], or by its admission.
    pub fn arrive(&mut self, id: ModelId, now: Duration) -> Ticket {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.models[id].coming.push((ticket, now));
        ticket
    }

    /// An announced request went away before it was admitted (none when it
    /// was admitted already). Whether it was still announced.
    pub fn leave(&mut self, id: ModelId, ticket: Ticket) -> bool {
        let coming = &mut self.models[id].coming;
        let before = coming.len();
        coming.retain(|&(t, _)| t != ticket);
        coming.len() < before
    }

    /// Requests announced for `id` and not admitted yet.
    pub fn coming(&self, id: ModelId) -> usize {
        self.models[id].coming.len()
    }

    /// [`BudgetPolicy::request`] of a request announced with `ticket`
    /// (`None`, or one admitted already: as it comes now). A request counts
    /// as having come when the earliest request announced for its model
    /// did (the server picks which of a model's requests asks first):
    /// before the requests for other models that came after that, whatever
    /// the order they ask in, and a model draining for a later one still
    /// takes it. Once admitted it is no longer announced.
    pub fn request_announced(
        &mut self,
        id: ModelId,
        now: Duration,
        ticket: Option<Ticket>,
    ) -> Admission {
        // Whatever this model's waiter marked draining before is planned anew.
        self.clear_drains_for(id);
        // The model's queue is as early as its earliest request: the server
        // may hold that one behind a later one (its own order), which must
        // not then wait behind the requests that came between them.
        let model = &self.models[id];
        let earliest = model.coming.iter().map(|&(_, at)| at).min();
        let fresh_mark = self.waiting_for(id, now).and(model.waiting_since);
        let came = [Some(now), earliest, fresh_mark]
            .into_iter()
            .flatten()
            .min();
        let came = came.unwrap_or(now);
        let admission = self.admit_came(id, now, came);
        if matches!(admission, Admission::Ready | Admission::Load { .. }) {
            if let Some(t) = ticket {
                self.leave(id, t);
            }
        }
        admission
    }

    /// [`BudgetPolicy::request_announced`] of a request that came at `came`.
    fn admit_came(&mut self, id: ModelId, now: Duration, came: Duration) -> Admission {
        let model = &self.models[id];
        if model.moving_to == Some(Residency::Unloaded) {
            // Being unloaded: load it again once that is done.
            return self.wait(id, now, came, Vec::new());
        }
        if model.level > Residency::Unloaded || model.moving_to.is_some() {
            if let Some(waiter) = self.draining(id, now) {
                let after = self.models[waiter].waiting_since.unwrap_or(now);
                if came < after {
                    // It came before the request the model drains for: that
                    // one waits for it as for the work running when it came.
                    self.count_request(id, now);
                    return Admission::Ready;
                }
                // In line behind the request it drains for, when it comes
                // now; one already waiting keeps its place (the model may
                // drain for a later waiter once the first is in).
                let already = self.waiting_for(id, now).is_some();
                let admission = self.wait(id, now, came, Vec::new());
                if !already {
                    let since = &mut self.models[id].waiting_since;
                    *since = (*since).max(Some(after + Duration::from_nanos(1)));
                }
                return admission;
            }
            self.count_request(id, now);
            return Admission::Ready;
        }
        if !model.spec.streaming.fits_in(self.budget) {
            return Admission::Reject(too_big(&model.spec, self.budget));
        }
        let before = self.waiting_before(id, now, came);
        let room = self.room().saturating_sub(before);
        for level in [Residency::Full, Residency::Partial, Residency::Streaming] {
            if !self.may_hold(id, level) {
                continue;
            }
            let need = self.spec(id).footprint(level);
            if need.fits_in(room) {
                self.count_request(id, now);
                return Admission::Load {
                    mv: self.start_move(id, level),
                };
            }
            // Idle models make room for the most it can hold, at once:
            // demoted for any level, unloaded only when it could not even
            // stream beside them (a newcomer never unloads an idle model
            // just to start at a higher level; it is promoted later if hot).
            let stages: &[Stage] = if level == Residency::Streaming {
                &[Stage::IdleDemote, Stage::IdleUnload]
            } else {
                &[Stage::IdleDemote]
            };
            let want = Want {
                id,
                need: need.add(before),
                now,
                came: Some(came),
                stages,
            };
            if let Some(plan) = self.plan_room(&want, Some(self.room()), &[], false) {
                let moves = self.start_moves(plan);
                return self.wait(id, now, came, moves);
            }
        }
        let moves = self
            .make_room(id, Residency::Streaming, now, Some(came))
            .unwrap_or_default();
        self.wait(id, now, came, moves)
    }

    /// Marks a request for `id` that came at `came` waiting (asked at `now`).
    fn wait(&mut self, id: ModelId, now: Duration, came: Duration, moves: Vec<Move>) -> Admission {
        let model = &mut self.models[id];
        let fresh = model
            .waiting_asked
            .is_some_and(|at| now.saturating_sub(at) <= WAITING_FRESH);
        model.waiting_since = match model.waiting_since {
            Some(since) if fresh => Some(since.min(came)),
            _ => Some(came),
        };
        model.waiting_asked = Some(now);
        Admission::Wait { moves }
    }

    /// The model whose waiting request (still asking) drains `id`.
    fn draining(&self, id: ModelId, now: Duration) -> Option<ModelId> {
        self.models[id]
            .drain_for
            .filter(|&(_, at)| now.saturating_sub(at) <= WAITING_FRESH)
            .map(|(waiter, _)| waiter)
    }

    fn clear_drains_for(&mut self, waiter: ModelId) {
        for m in &mut self.models {
            if m.drain_for.is_some_and(|(w, _)| w == waiter) {
                m.drain_for = None;
            }
        }
    }

    /// Whether a request for `id` waits for room now (asked within
    /// [`WAITING_FRESH`]), and for how long.
    pub fn waiting_for(&self, id: ModelId, now: Duration) -> Option<Duration> {
        let m = &self.models[id];
        let asked = m.waiting_asked?;
        (now.saturating_sub(asked) <= WAITING_FRESH)
            .then(|| now.saturating_sub(m.waiting_since.unwrap_or(asked)))
    }

    /// The models marked draining for a request waiting for room.
    pub fn draining_models(&self, now: Duration) -> Vec<ModelId> {
        (0..self.models.len())
            .filter(|&id| self.draining(id, now).is_some())
            .collect()
    }

    fn count_request(&mut self, id: ModelId, now: Duration) {
        let half_life = self.config.heat_half_life;
        let model = &mut self.models[id];
        model.heat = model.heat_at(now, half_life) + 1.0;
        model.heat_at = now;
        model.last_used = now;
        model.in_flight += 1;
        model.waiting_since = None;
        model.waiting_asked = None;
        self.clear_drains_for(id);
    }

    /// How long `id` stays loaded after its last request from now on
    /// (`None` = forever; zero unloads it at the next tick once idle).
    pub fn set_keep_alive(&mut self, id: ModelId, keep_alive: Option<Duration>) {
        self.models[id].spec.keep_alive = keep_alive;
    }

    /// A request for `id` ended (successfully or not).
    pub fn finish(&mut self, id: ModelId, now: Duration) {
        let model = &mut self.models[id];
        model.in_flight = model.in_flight.saturating_sub(1);
        model.last_used = now;
    }

    /// An explicit move of a loaded `id` to `level` (an operator's or a
    /// backend's request): `Ok(None)` when it is there already, the move to
    /// carry out when it can start now, why not otherwise. A promotion must
    /// fit the room left now; no move goes below the pin or to `Unloaded`
    /// (unloading goes through keep-alive). Later ticks may move it again.
    pub fn request_move(&mut self, id: ModelId, level: Residency) -> Result<Option<Move>, String> {
        let m = &self.models[id];
        if level == Residency::Unloaded || level < m.spec.pin {
            return Err(format!(
                "{}: cannot move to {level}: at least {} (its pin, or streaming)",
                m.spec.name,
                m.spec.pin.max(Residency::Streaming)
            ));
        }
        if m.level == Residency::Unloaded {
            return Err(format!("{} is not loaded: load it first", m.spec.name));
        }
        if let Some(to) = m.moving_to {
            return Err(format!(
                "{} is already moving to {to}: retry when done",
                m.spec.name
            ));
        }
        if m.level == level {
            return Ok(None);
        }
        if level > m.level && !(m.extra_to(level).fits_in(self.room()) && self.may_hold(id, level))
        {
            return Err(format!(
                "{}: no room in the memory budget for {level} now",
                m.spec.name
            ));
        }
        Ok(Some(self.start_move(id, level)))
    }

    /// A move reported by the caller is complete: the model is at `to`.
    pub fn move_done(&mut self, mv: Move) {
        let model = &mut self.models[mv.model];
        debug_assert_eq!(model.moving_to, Some(mv.to));
        model.level = mv.to;
        model.moving_to = None;
        if mv.to == Residency::Unloaded {
            model.failed_at = None;
            model.drain_for = None;
        }
    }

    /// A move failed: the model stays where it was (a failed load:
    /// unloaded). A failed promotion is not tried again while it stays
    /// loaded (each try would read the model again).
    pub fn move_failed(&mut self, mv: Move) {
        let model = &mut self.models[mv.model];
        model.level = mv.from;
        model.moving_to = None;
        if mv.from > Residency::Unloaded && mv.to > mv.from {
            model.failed_at = Some(mv.to);
        }
    }

    /// Unload or demote what has been idle long enough and promote hot
    /// models toward full residency. Returns the moves to carry out.
    pub fn tick(&mut self, now: Duration) -> Vec<Move> {
        let mut moves = Vec::new();
        // 1. Keep-alive: unload idle models (their pin permitting).
        for id in 0..self.models.len() {
            let m = &self.models[id];
            let expired = m
                .spec
                .keep_alive
                .is_some_and(|k| now.saturating_sub(m.last_used) >= k);
            let to = m.spec.pin.min(m.level);
            if m.moving_to.is_none()
                && m.idle_for(None)
                && m.level > m.spec.pin
                && expired
                && m.extra_to(to).fits_in(self.room())
            {
                moves.push(self.start_move(id, to));
            }
        }
        // 2. Idle models drop their caches.
        for id in 0..self.models.len() {
            let m = &self.models[id];
            let idle = now.saturating_sub(m.last_used) >= self.config.demote_after;
            let to = Residency::Streaming.max(m.spec.pin);
            if m.moving_to.is_none()
                && m.idle_for(None)
                && idle
                && m.level > to
                && m.extra_to(to).fits_in(self.room())
            {
                moves.push(self.start_move(id, to));
            }
        }
        // 3. Promote the hottest loaded models, one step at a time toward full.
        let mut order: Vec<ModelId> = (0..self.models.len())
            .filter(|&id| {
                let m = &self.models[id];
                m.moving_to.is_none()
                    && m.level > Residency::Unloaded
                    && m.level < Residency::Full
                    && now.saturating_sub(m.last_used) < self.config.demote_after
            })
            .collect();
        order.sort_by(|&a, &b| self.rank(b, now).total_cmp(&self.rank(a, now)));
        for id in order {
            if self.models[id].moving_to.is_some() {
                // Demoted just now to make room for a hotter one.
                continue;
            }
            let current = self.models[id].level;
            for level in [Residency::Full, Residency::Partial] {
                if level <= current {
                    break;
                }
                let failed = self.models[id].failed_at.is_some_and(|f| level >= f);
                if failed || !self.may_hold(id, level) {
                    continue;
                }
                if let Some(mut made) = self.make_room(id, level, now, None) {
                    if made.is_empty() {
                        moves.push(self.start_move(id, level));
                    } else {
                        // The promotion follows on a later tick, once the
                        // demotions are done and their memory is free.
                        moves.append(&mut made);
                    }
                    break;
                }
            }
        }
        moves
    }

    /// Whether `id` may go to `level`: a pinned model whose full residency
    /// is a separate placement goes full only if it can always come back
    /// down to its pin, its pin placement loaded beside the full one, once
    /// every model that can give room back has (else it could hold room no
    /// one can ever get back). Unpinned models can be unloaded, pinned ones
    /// shrink to their pin, except pinned separate ones already full, which
    /// keep what they hold.
    fn may_hold(&self, id: ModelId, level: Residency) -> bool {
        let spec = &self.models[id].spec;
        if level != Residency::Full || !spec.full_is_separate || spec.pin == Residency::Unloaded {
            return true;
        }
        let others = (0..self.models.len())
            .filter(|&o| o != id)
            .map(|o| {
                let m = &self.models[o];
                let full = m.level == Residency::Full || m.moving_to == Some(Residency::Full);
                if m.spec.full_is_separate && m.spec.pin != Residency::Unloaded && full {
                    m.charged()
                } else {
                    m.spec.footprint(m.spec.pin)
                }
            })
            .fold(Footprint::ZERO, Footprint::add);
        others
            .add(spec.during_move(Residency::Full, spec.pin))
            .fits_in(self.budget)
    }

    /// What the models with requests waiting for room need to stream. A
    /// waiter asks again at least every [`WAITING_FRESH`]; older marks are
    /// of requests given up.
    fn waiting_need(&self, now: Duration) -> Footprint {
        (0..self.models.len())
            .filter(|&o| self.waits_for_room(o, now))
            .map(|o| self.models[o].spec.streaming)
            .fold(Footprint::ZERO, Footprint::add)
    }

    /// What the requests for other models that have waited for room since
    /// before `came` (when the request for `id` came) need to stream: room
    /// `id` leaves them (first come, first served).
    fn waiting_before(&self, id: ModelId, now: Duration, came: Duration) -> Footprint {
        let before = |o: ModelId| {
            self.models[o]
                .waiting_since
                .is_some_and(|theirs| (theirs, o) < (came, id))
        };
        // A model draining for `id` waits behind it whatever its mark says.
        let drains_for_me = |o: ModelId| self.draining(o, now) == Some(id);
        (0..self.models.len())
            .filter(|&o| o != id && self.waits_for_room(o, now) && before(o) && !drains_for_me(o))
            .map(|o| self.models[o].spec.streaming)
            .fold(Footprint::ZERO, Footprint::add)
    }

    /// Whether a request waits (and still asks) for room to load `id`:
    /// `id` unloaded, or loaded but draining for another waiter (its memory
    /// goes to that one: the request will need room to load it again, and
    /// keeps its place for it among later waiters).
    fn waits_for_room(&self, id: ModelId, now: Duration) -> bool {
        let m = &self.models[id];
        let unloaded = m.level == Residency::Unloaded && m.moving_to.is_none();
        (unloaded || self.draining(id, now).is_some()) && self.waiting_for(id, now).is_some()
    }

    /// Heat plus a tie-breaking nudge by priority and queue.
    fn rank(&self, id: ModelId, now: Duration) -> f64 {
        let m = &self.models[id];
        m.heat_at(now, self.config.heat_half_life)
            + (m.in_flight + m.coming.len()) as f64
            + m.spec.priority as f64 * 1e-3
    }

    /// Demotions of other models that leave room for `id` to move to `to`
    /// (what the move holds beyond what `id` holds now, and for a request
    /// what the requests that waited before it need): empty when there is
    /// room already, `None` when they would not suffice or none can start
    /// now; the moves are started.
    ///
    /// A victim's move may itself need room while it runs (a separate
    /// placement loaded beside its full one). The plan first keeps to moves
    /// that all fit the room there is now; if that does not suffice, it
    /// starts what fits of the plan that would, and leaves the rest for a
    /// later call, once the others have freed theirs. For a request (one
    /// that came at `came`; `None`: a promotion) that only busy models'
    /// unloading would let in, see [`BudgetPolicy::drain_for`].
    fn make_room(
        &mut self,
        id: ModelId,
        to: Residency,
        now: Duration,
        came: Option<Duration>,
    ) -> Option<Vec<Move>> {
        let for_request = came.is_some();
        let mut need = self.models[id].extra_to(to);
        need = need.add(match came {
            Some(came) => self.waiting_before(id, now, came),
            // A promotion leaves room for the requests waiting to get in.
            None => self.waiting_need(now),
        });
        if need.fits_in(self.room()) {
            return Some(Vec::new());
        }
        let want = Want {
            id,
            need,
            now,
            came,
            stages: if for_request {
                FOR_REQUEST
            } else {
                FOR_PROMOTION
            },
        };
        let room = Some(self.room());
        if let Some(plan) = self.plan_room(&want, room, &[], false) {
            return Some(self.start_moves(plan));
        }
        let Some(plan) = self.plan_room(&want, None, &[], false) else {
            return for_request.then(|| self.drain_for(&want));
        };
        let mut spare = self.room();
        let (now_fits, later): (Vec<_>, Vec<_>) = plan.into_iter().partition(|&(v, to)| {
            let extra = self.models[v].extra_to(to);
            let fits = extra.fits_in(spare);
            if fits {
                spare = spare.saturating_sub(extra);
            }
            fits
        });
        if !now_fits.is_empty() {
            return Some(self.start_moves(now_fits));
        }
        // Each move needs room while it runs: free what can be freed now
        // toward the cheapest one that something can make room for (the
        // rest follows on later calls).
        let mut blocked: Vec<(ModelId, Footprint)> = later
            .iter()
            .map(|&(v, to)| (v, self.models[v].extra_to(to)))
            .collect();
        blocked.sort_by_key(|&(_, e)| (e.ram_bytes, e.gpu_bytes));
        let first = blocked.into_iter().find_map(|(v, extra)| {
            let toward = Want {
                need: extra,
                ..want
            };
            self.plan_room(&toward, room, &[v], true)
                .filter(|plan| !plan.is_empty())
        });
        match first {
            Some(first) => Some(self.start_moves(first)),
            // Nothing can start toward it now: the busy models drain.
            None => for_request.then(|| self.drain_for(&want)),
        }
    }

    /// A request that every idle model and every busy one streaming would
    /// not let in: marks the fewest busy models whose unloading would
    /// (lowest priority, then coldest, first) draining for it — they take
    /// no new request until it is in, and their memory goes once their work
    /// in flight ends — and starts what idle models can give now.
    fn drain_for(&mut self, want: &Want) -> Vec<Move> {
        let (id, now) = (want.id, want.now);
        let idle = |p: &BudgetPolicy, v: ModelId| p.models[v].idle_for(want.came);
        let idle_plan: Vec<(ModelId, Residency)> = self
            .plan_room(want, None, &[], true)
            .unwrap_or_default()
            .into_iter()
            .filter(|&(v, _)| idle(self, v))
            .collect();
        let mut freed = self.room();
        for &(v, to) in &idle_plan {
            let m = &self.models[v];
            freed = freed.add(
                m.spec
                    .footprint(m.level)
                    .saturating_sub(m.spec.footprint(to)),
            );
        }
        let mut busy: Vec<ModelId> = (0..self.models.len())
            .filter(|&v| v != id && !idle(self, v))
            .filter(|&v| self.models[v].level > self.models[v].spec.pin)
            .collect();
        busy.sort_by(|&a, &b| {
            let (ma, mb) = (&self.models[a], &self.models[b]);
            ma.spec
                .priority
                .cmp(&mb.spec.priority)
                .then(self.rank(a, now).total_cmp(&self.rank(b, now)))
        });
        let mut drained = Vec::new();
        for v in busy {
            if want.need.fits_in(freed) {
                break;
            }
            let m = &self.models[v];
            let pin = m.spec.pin.min(m.level);
            freed = freed.add(m.charged().saturating_sub(m.spec.footprint(pin)));
            drained.push(v);
        }
        if want.need.fits_in(freed) {
            for v in drained {
                // A model draining for an earlier waiter (still asking)
                // keeps draining for it: its memory goes to that one first
                // (counted in this one's need), and the requests waiting on
                // it keep their place behind that one, not this one.
                if self.draining(v, now).is_none_or(|w| w == id) {
                    self.models[v].drain_for = Some((id, now));
                }
            }
        }
        let room = Some(self.room());
        let now_plan: Vec<(ModelId, Residency)> = self
            .plan_room(want, room, &[], true)
            .unwrap_or_default()
            .into_iter()
            .filter(|&(v, _)| idle(self, v))
            .collect();
        self.start_moves(now_plan)
    }

    fn start_moves(&mut self, plan: Vec<(ModelId, Residency)>) -> Vec<Move> {
        plan.into_iter()
            .map(|(v, to)| self.start_move(v, to))
            .collect()
    }

    /// The demotions [`BudgetPolicy::make_room`] would start to free `need`
    /// for `id`, or `None` when they would not suffice. With `spare`, only
    /// moves whose own running cost fits in it, all together. Models in
    /// `keep` are left alone. With `best_effort`, what there is even when
    /// it does not suffice.
    ///
    /// By `want.stages`; for a request, in this order: idle models (nothing
    /// in flight) are demoted, then unloaded (an idle model in a separate
    /// full placement is unloaded rather than moved to its streaming one:
    /// that would make the request wait for a load), whatever their heat,
    /// then busy models are demoted to streaming (they keep answering). For
    /// a promotion, only models colder by the promote margin or idle past
    /// `demote_after` are demoted, never unloaded. Each victim goes down
    /// only as far as needed; within a stage lowest priority, then lowest
    /// rank, first.
    fn plan_room(
        &self,
        want: &Want,
        spare: Option<Footprint>,
        keep: &[ModelId],
        best_effort: bool,
    ) -> Option<Vec<(ModelId, Residency)>> {
        let (id, need, now) = (want.id, want.need, want.now);
        let mut spare = spare;
        let mut freed = self.room();
        let my_rank = self.rank(id, now).max(1.0);
        let my_priority = self.models[id].spec.priority;
        let cold = |v: ModelId| {
            let m = &self.models[v];
            let colder = self.rank(v, now) * self.config.promote_margin <= my_rank
                && m.spec.priority <= my_priority;
            let idle = m.idle_for(want.came)
                && now.saturating_sub(m.last_used) >= self.config.demote_after;
            colder || idle
        };
        let mut victims: Vec<ModelId> = (0..self.models.len())
            .filter(|&v| v != id && !keep.contains(&v) && self.models[v].moving_to.is_none())
            .collect();
        victims.sort_by(|&a, &b| {
            let (ma, mb) = (&self.models[a], &self.models[b]);
            ma.spec
                .priority
                .cmp(&mb.spec.priority)
                .then(self.rank(a, now).total_cmp(&self.rank(b, now)))
        });
        // A victim planned in one stage may be taken further down in an
        // unloading one.
        let mut plan: Vec<(ModelId, Residency)> = Vec::new();
        for &stage in want.stages {
            for &v in &victims {
                if need.fits_in(freed) {
                    break;
                }
                let planned = plan.iter().position(|&(p, _)| p == v);
                if planned.is_some() && stage != Stage::IdleUnload {
                    continue;
                }
                let m = &self.models[v];
                let idle = m.idle_for(want.came);
                let lowest = match stage {
                    Stage::IdleDemote if idle => Residency::Streaming.max(m.floor()),
                    Stage::IdleUnload if idle => m.floor(),
                    Stage::BusyDemote if !idle => Residency::Streaming.max(m.floor()),
                    Stage::ColdDemote if cold(v) => Residency::Streaming.max(m.floor()),
                    _ => continue,
                };
                let from = planned.map_or(m.level, |i| plan[i].1);
                if from <= lowest || (stage == Stage::IdleDemote && m.spec.reloads(from, lowest)) {
                    continue;
                }
                // What a move to `l` holds while it runs, beyond what the
                // plan already holds for this victim.
                let held_before = planned.map_or(Footprint::ZERO, |i| m.extra_to(plan[i].1));
                let startable =
                    |l: Residency| spare.is_none_or(|s| m.extra_to(l).fits_in(s.add(held_before)));
                // As far down as needed, no further; a separate full
                // placement straight to the lowest, which is the least to
                // load beside it.
                let separate = m.spec.full_is_separate && from == Residency::Full;
                let Some(to) = Residency::ALL
                    .into_iter()
                    .filter(|&l| l >= lowest && l < from && startable(l))
                    .filter(|&l| !separate || l == lowest)
                    .rev()
                    .find(|&l| {
                        let gain = m.spec.footprint(from).saturating_sub(m.spec.footprint(l));
                        need.fits_in(freed.add(gain))
                    })
                    .or_else(|| startable(lowest).then_some(lowest))
                else {
                    continue;
                };
                let gain = m.spec.footprint(from).saturating_sub(m.spec.footprint(to));
                if gain == Footprint::ZERO {
                    continue;
                }
                freed = freed.add(gain);
                if let Some(s) = spare.as_mut() {
                    *s = s.add(held_before).saturating_sub(m.extra_to(to));
                }
                match planned {
                    Some(i) => plan[i].1 = to,
                    None => plan.push((v, to)),
                }
            }
        }
        (best_effort || need.fits_in(freed)).then_some(plan)
    }

    fn start_move(&mut self, id: ModelId, to: Residency) -> Move {
        let m = &mut self.models[id];
        debug_assert!(m.moving_to.is_none());
        m.moving_to = Some(to);
        Move {
            model: id,
            from: m.level,
            to,
        }
    }
}

/// How long a request that had to wait counts as waiting without asking
/// again (the registry asks again on every change, and every second).
pub const WAITING_FRESH: Duration = Duration::from_secs(5);

/// Room [`BudgetPolicy::plan_room`] looks for: `need` more for model `id`,
/// at `now`, for a request or a promotion, moving victims by `stages`.
#[derive(Debug, Clone, Copy)]
struct Want {
    id: ModelId,
    need: Footprint,
    now: Duration,
    /// When the request came (`None`: a promotion): models with nothing
    /// running nor announced before then are idle to it.
    came: Option<Duration>,
    stages: &'static [Stage],
}

/// The victims a request may move, in order (idle ones first).
const FOR_REQUEST: &[Stage] = &[Stage::IdleDemote, Stage::IdleUnload, Stage::BusyDemote];
/// The victims a promotion may move.
const FOR_PROMOTION: &[Stage] = &[Stage::ColdDemote];

/// Which victims a step of [`BudgetPolicy::plan_room`] may move, and how far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Idle models, down to streaming (no separate placement loaded).
    IdleDemote,
    /// Idle models, down to their floor (unloaded unless pinned).
    IdleUnload,
    /// Busy models, down to streaming.
    BusyDemote,
    /// For a promotion: models colder by the margin or idle long, down to streaming.
    ColdDemote,
}

fn too_big(spec: &ModelSpec, budget: Footprint) -> String {
    format!(
        "{} needs at least {} to run (streaming), more than the budget of {budget}",
        spec.name, spec.streaming
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// A model of `full` GiB of RAM that streams in `streaming` GiB.
    fn spec(name: &str, streaming: u64, full: u64) -> ModelSpec {
        ModelSpec {
            name: name.into(),
            streaming: Footprint::new(0, streaming * GIB),
            partial: Footprint::new(0, (streaming + full) * GIB / 2),
            full: Footprint::new(0, full * GIB),
            full_is_separate: false,
            pin: Residency::Unloaded,
            priority: 0,
            keep_alive: Some(secs(300)),
        }
    }

    fn policy(ram_gib: u64, specs: Vec<ModelSpec>) -> BudgetPolicy {
        let mut p = BudgetPolicy::new(Footprint::new(0, ram_gib * GIB), PolicyConfig::default());
        for s in specs {
            p.add_model(s).unwrap();
        }
        p
    }

    fn assert_within_budget(p: &BudgetPolicy) {
        let charged = p.charged();
        assert!(
            charged.fits_in(p.budget()),
            "charged {charged} over the budget {}",
            p.budget()
        );
    }

    /// Carries out moves at once (the caller's side, instantaneous).
    fn apply(p: &mut BudgetPolicy, moves: &[Move]) {
        for &mv in moves {
            p.move_done(mv);
            assert_within_budget(p);
        }
    }

    #[test]
    fn an_explicit_move_starts_when_it_fits_and_names_why_when_not() {
        // a: 1 GiB streaming, 4 GiB full; b: 2 GiB streaming, 8 GiB full.
        let mut p = policy(10, vec![spec("a", 1, 4), spec("b", 2, 8)]);
        let mv = p.request_move(0, Residency::Full).unwrap_err();
        assert_eq!(mv, "a is not loaded: load it first");
        admit(&mut p, 0, secs(0));
        assert_eq!(p.residency(0), Residency::Full);
        assert_eq!(p.request_move(0, Residency::Full), Ok(None));

        let down = p.request_move(0, Residency::Streaming).unwrap().unwrap();
        assert_eq!(
            down,
            Move {
                model: 0,
                from: Residency::Full,
                to: Residency::Streaming
            }
        );
        assert_eq!(
            p.request_move(0, Residency::Partial).unwrap_err(),
            "a is already moving to streaming: retry when done"
        );
        apply(&mut p, &[down]);
        assert_eq!(p.residency(0), Residency::Streaming);

        // b full takes 8 GiB of the 9 left: a cannot go back to full now.
        admit(&mut p, 1, secs(1));
        assert_eq!(p.residency(1), Residency::Full);
        assert_eq!(
            p.request_move(0, Residency::Full).unwrap_err(),
            "a: no room in the memory budget for full now"
        );
        assert_eq!(
            p.request_move(0, Residency::Unloaded).unwrap_err(),
            "a: cannot move to unloaded: at least streaming (its pin, or streaming)"
        );
        assert_within_budget(&p);
    }

    /// Requests until admitted, completing moves at once, as the registry does.
    fn admit(p: &mut BudgetPolicy, id: ModelId, now: Duration) {
        for _ in 0..64 {
            match p.request(id, now) {
                Admission::Ready => return,
                Admission::Load { mv } => return apply(p, &[mv]),
                Admission::Wait { moves } => apply(p, &moves),
                Admission::Reject(why) => panic!("rejected: {why}"),
            }
        }
        panic!("model {id} never admitted: {p:#?}");
    }

    #[test]
    fn a_model_that_cannot_stream_within_the_budget_is_refused_with_its_minimum() {
        let mut p = policy(8, vec![]);
        let err = p.add_model(spec("huge", 9, 40)).unwrap_err();
        assert!(
            err.contains("huge needs at least 0 B GPU + 9.0 GiB RAM"),
            "{err}"
        );
        let err = p
            .add_model(ModelSpec {
                streaming: Footprint::new(0, 5 * GIB),
                partial: Footprint::new(0, 4 * GIB),
                ..spec("odd", 1, 2)
            })
            .unwrap_err();
        assert!(err.contains("must grow"), "{err}");
    }

    #[test]
    fn pins_that_cannot_all_hold_are_refused() {
        let mut p = policy(10, vec![]);
        p.add_model(ModelSpec {
            pin: Residency::Full,
            ..spec("a", 2, 6)
        })
        .unwrap();
        let err = p
            .add_model(ModelSpec {
                pin: Residency::Full,
                ..spec("b", 2, 6)
            })
            .unwrap_err();
        assert!(err.contains("pinned models would need"), "{err}");
    }

    #[test]
    fn an_unloaded_model_loads_at_the_highest_residency_that_fits() {
        let mut p = policy(10, vec![spec("a", 2, 6), spec("b", 2, 6)]);
        assert_eq!(
            p.request(0, secs(0)),
            Admission::Load {
                mv: Move {
                    model: 0,
                    from: Residency::Unloaded,
                    to: Residency::Full
                }
            }
        );
        // Charged while loading, before it is done.
        assert_eq!(p.charged(), Footprint::new(0, 6 * GIB));
        p.move_done(Move {
            model: 0,
            from: Residency::Unloaded,
            to: Residency::Full,
        });
        // 4 GiB left: partial (4) fits, full (6) does not.
        assert_eq!(
            p.request(1, secs(1)),
            Admission::Load {
                mv: Move {
                    model: 1,
                    from: Residency::Unloaded,
                    to: Residency::Partial
                }
            }
        );
        assert_within_budget(&p);
    }

    #[test]
    fn a_request_for_a_loaded_or_loading_model_is_ready_at_once() {
        let mut p = policy(10, vec![spec("a", 2, 6)]);
        let Admission::Load { mv } = p.request(0, secs(0)) else {
            panic!()
        };
        // Second request while the load runs: no second load.
        assert_eq!(p.request(0, secs(0)), Admission::Ready);
        p.move_done(mv);
        assert_eq!(p.request(0, secs(1)), Admission::Ready);
        assert_eq!(p.in_flight(0), 3);
    }

    #[test]
    fn one_hot_one_cold_the_hot_one_ends_full_the_cold_one_streaming() {
        // Room for one model fully and the other streaming.
        let mut p = policy(8, vec![spec("hot", 2, 6), spec("cold", 2, 6)]);
        admit(&mut p, 1, secs(0));
        assert_eq!(p.residency(1), Residency::Full);
        admit(&mut p, 0, secs(2));
        // The cold one holds the room, busy: hot starts streaming at once.
        assert_eq!(p.residency(0), Residency::Streaming);
        p.finish(1, secs(2));
        p.finish(0, secs(2));
        let mut t = 2;
        for _ in 0..200 {
            t += 1;
            admit(&mut p, 0, secs(t));
            p.finish(0, secs(t));
            let moves = p.tick(secs(t));
            apply(&mut p, &moves);
        }
        assert_eq!(p.residency(0), Residency::Full, "the hot model is promoted");
        assert_eq!(
            p.residency(1),
            Residency::Streaming,
            "the cold one is demoted"
        );
        // Past its keep-alive the cold one is unloaded.
        let moves = p.tick(secs(t + 300));
        apply(&mut p, &moves);
        assert_eq!(p.residency(1), Residency::Unloaded);
    }

    /// `spec` whose full residency is a placement of its own.
    fn separate(name: &str, streaming: u64, full: u64) -> ModelSpec {
        ModelSpec {
            full_is_separate: true,
            ..spec(name, streaming, full)
        }
    }

    #[test]
    fn a_separate_full_placement_is_charged_beside_the_old_while_it_loads() {
        let s = separate("a", 2, 6);
        let (streaming, partial, full) = (s.streaming, s.partial, s.full);
        assert_eq!(
            s.during_move(Residency::Streaming, Residency::Full),
            streaming.add(full)
        );
        assert_eq!(
            s.during_move(Residency::Full, Residency::Partial),
            full.add(partial)
        );
        // In place, or with nothing loaded before or after: the larger end.
        assert_eq!(
            s.during_move(Residency::Streaming, Residency::Partial),
            partial
        );
        assert_eq!(s.during_move(Residency::Unloaded, Residency::Full), full);
        assert_eq!(s.during_move(Residency::Full, Residency::Unloaded), full);
        let in_place = spec("b", 2, 6);
        assert_eq!(
            in_place.during_move(Residency::Streaming, Residency::Full),
            full
        );

        // Hot at streaming beside a cold full model: the promotion waits
        // until both of its placements fit at once, then holds both.
        let mut p = policy(11, vec![separate("hot", 2, 6), spec("cold", 1, 6)]);
        admit(&mut p, 1, secs(0));
        assert_eq!(p.residency(1), Residency::Full);
        admit(&mut p, 0, secs(1));
        assert_eq!(p.residency(0), Residency::Partial, "4 of the 6 left fit");
        p.finish(1, secs(0));
        let mut t = 1;
        let mut seen_loading_beside = false;
        for _ in 0..100 {
            t += 1;
            admit(&mut p, 0, secs(t));
            p.finish(0, secs(t));
            for mv in p.tick(secs(t)) {
                if mv.model == 0 && mv.to == Residency::Full {
                    assert_eq!(p.charged_to(0), partial.add(full), "both placements");
                    seen_loading_beside = true;
                }
                p.move_done(mv);
                assert_within_budget(&p);
            }
        }
        assert!(seen_loading_beside);
        assert_eq!(p.residency(0), Residency::Full);
        assert!(p.residency(1) < Residency::Full, "demoted to make room");
    }

    #[test]
    fn an_idle_separate_full_model_is_demoted_only_when_its_streaming_placement_fits_beside() {
        // "a" full (6) and "b" (1) leave 1 of 8: no room to load a's
        // streaming placement (2) beside its full one.
        let a = ModelSpec {
            keep_alive: None,
            ..separate("a", 2, 6)
        };
        let mut p = policy(8, vec![a, spec("b", 1, 1)]);
        admit(&mut p, 0, secs(0));
        p.finish(0, secs(0));
        admit(&mut p, 1, secs(0));
        p.finish(1, secs(200));
        assert_eq!(p.residency(0), Residency::Full);
        let moves = p.tick(secs(150));
        assert!(moves.iter().all(|m| m.model != 0), "{moves:?}");
        assert_within_budget(&p);
        // Once b is unloaded (keep-alive), a goes down to streaming.
        let moves = p.tick(secs(200 + 300));
        apply(&mut p, &moves);
        assert_eq!(p.residency(1), Residency::Unloaded);
        let moves = p.tick(secs(501));
        assert_eq!(moves.len(), 1, "{moves:?}");
        assert_eq!(p.charged_to(0), Footprint::new(0, 8 * GIB));
        apply(&mut p, &moves);
        assert_eq!(p.residency(0), Residency::Streaming);
    }

    #[test]
    fn a_request_unloads_an_idle_full_placement_that_cannot_stream_beside_itself() {
        // "a" (separate, full 6 of 7) was just used; "c" needs 2.
        let mut p = policy(7, vec![separate("a", 2, 6), spec("c", 2, 2)]);
        admit(&mut p, 0, secs(0));
        p.finish(0, secs(0));
        // a cannot load its streaming placement (2) beside its full one (6)
        // in 7, and is idle: c's request unloads it at once rather than
        // waiting for a to cool down.
        let Admission::Wait { moves } = p.request(1, secs(2)) else {
            panic!("no room yet")
        };
        assert_eq!(
            moves,
            vec![Move {
                model: 0,
                from: Residency::Full,
                to: Residency::Unloaded
            }]
        );
        apply(&mut p, &moves);
        admit(&mut p, 1, secs(2));
        assert_eq!(p.residency(1), Residency::Full);
    }

    #[test]
    fn a_failed_promotion_is_not_tried_again_until_the_model_reloads() {
        let mut p = policy(11, vec![separate("a", 2, 6), spec("b", 1, 6)]);
        admit(&mut p, 1, secs(0));
        // Loaded beside the busy "b": not full.
        admit(&mut p, 0, secs(0));
        assert!(p.residency(0) < Residency::Full);
        p.finish(1, secs(0));
        p.finish(0, secs(0));
        let mut t = 0;
        let mut failed = None;
        // Busy and hot beside "b": promoted to full, and that load fails.
        while failed.is_none() && t < 100 {
            t += 1;
            admit(&mut p, 0, secs(t));
            for mv in p.tick(secs(t)) {
                if mv.model == 0 && mv.to == Residency::Full {
                    p.move_failed(mv);
                    failed = Some(mv);
                } else {
                    p.move_done(mv);
                }
            }
            p.finish(0, secs(t));
        }
        let failed = failed.expect("a promotion to full");
        assert_eq!(p.residency(0), failed.from);
        for _ in 0..20 {
            t += 1;
            admit(&mut p, 0, secs(t));
            let moves = p.tick(secs(t));
            assert!(
                moves
                    .iter()
                    .all(|m| m.model != 0 || m.to != Residency::Full),
                "tried again: {moves:?}"
            );
            apply(&mut p, &moves);
            p.finish(0, secs(t));
        }
    }

    #[test]
    fn a_promotion_leaves_room_for_a_request_waiting_to_get_in() {
        // "c" holds 6 and cannot shrink; "a" is partial (4) and hot.
        let mut p = policy(10, vec![spec("a", 2, 6), spec("b", 5, 5), spec("c", 6, 6)]);
        admit(&mut p, 2, secs(0));
        admit(&mut p, 0, secs(0));
        p.finish(2, secs(0));
        p.finish(0, secs(0));
        assert_eq!(p.residency(0), Residency::Partial);
        // a busy; b waits; c (idle past demote_after) is unloaded for it.
        admit(&mut p, 0, secs(199));
        let Admission::Wait { moves } = p.request(1, secs(200)) else {
            panic!("no room for b yet")
        };
        assert!(moves.contains(&Move {
            model: 2,
            from: Residency::Full,
            to: Residency::Unloaded
        }));
        // c's memory comes free; a tick runs before b asks again: whatever
        // the hot a gets, b's 5 stay free.
        apply(&mut p, &moves);
        let promoted = p.tick(secs(201));
        apply(&mut p, &promoted);
        let b_streaming = p.spec(1).streaming;
        assert!(b_streaming.fits_in(p.room()), "{promoted:?}");
        p.finish(0, secs(201));
        admit(&mut p, 1, secs(201));
        // Once b is in (no one waiting), a may use what is left.
        let mut t = 201;
        for _ in 0..10 {
            t += 1;
            admit(&mut p, 0, secs(t));
            let moves = p.tick(secs(t));
            apply(&mut p, &moves);
            p.finish(0, secs(t));
        }
        assert!(p.residency(0) >= Residency::Partial);
        assert!(p.residency(1) > Residency::Unloaded);
    }

    #[test]
    fn a_burst_on_a_demoted_model_starts_at_once_and_promotes_it() {
        let mut p = policy(8, vec![spec("a", 2, 6), spec("b", 2, 6)]);
        admit(&mut p, 0, secs(0));
        admit(&mut p, 1, secs(0));
        p.finish(0, secs(0));
        p.finish(1, secs(0));
        assert_eq!(p.residency(0), Residency::Full);
        assert_eq!(p.residency(1), Residency::Streaming);
        // "a" goes idle and is demoted.
        let moves = p.tick(secs(200));
        apply(&mut p, &moves);
        assert_eq!(p.residency(0), Residency::Streaming);
        // Burst on "a": every request admitted at once, no load.
        for i in 0..20 {
            assert_eq!(p.request(0, secs(200 + i)), Admission::Ready);
        }
        let moves = p.tick(secs(220));
        apply(&mut p, &moves);
        let moves = p.tick(secs(221));
        apply(&mut p, &moves);
        assert_eq!(p.residency(0), Residency::Full);
        for i in 0..20 {
            p.finish(0, secs(230 + i));
        }
    }

    #[test]
    fn a_busy_model_is_never_unloaded_and_a_pinned_one_never_below_its_pin() {
        let mut p = policy(
            8,
            vec![
                ModelSpec {
                    pin: Residency::Full,
                    keep_alive: Some(secs(1)),
                    ..spec("pinned", 2, 4)
                },
                ModelSpec {
                    keep_alive: Some(secs(1)),
                    ..spec("busy", 2, 4)
                },
            ],
        );
        admit(&mut p, 0, secs(0));
        admit(&mut p, 1, secs(0));
        p.finish(0, secs(0));
        // "busy" keeps its request in flight for an hour.
        for t in (10..3600).step_by(10) {
            let moves = p.tick(secs(t));
            apply(&mut p, &moves);
            assert_eq!(p.residency(0), Residency::Full);
            assert!(p.residency(1) >= Residency::Streaming);
        }
        p.finish(1, secs(3600));
        let moves = p.tick(secs(3700));
        apply(&mut p, &moves);
        assert_eq!(p.residency(1), Residency::Unloaded);
        assert_eq!(p.residency(0), Residency::Full);
    }

    #[test]
    fn a_request_waits_only_for_a_busy_model_and_then_gets_in_at_once() {
        // Each model alone takes the whole budget even when streaming.
        let mut p = policy(4, vec![spec("a", 4, 4), spec("b", 4, 4)]);
        admit(&mut p, 0, secs(0));
        // "a" is busy: "b" must wait, nothing is demoted below streaming;
        // "a" drains for it: a new request for "a" waits behind "b".
        assert_eq!(p.request(1, secs(1)), Admission::Wait { moves: vec![] });
        assert_eq!(p.draining_models(secs(1)), vec![0]);
        assert_eq!(p.request(0, secs(1)), Admission::Wait { moves: vec![] });
        assert!(p.waiting_for(1, secs(1)).is_some());
        p.finish(0, secs(2));
        // Idle, however hot: it makes way at once.
        let Admission::Wait { moves } = p.request(1, secs(2)) else {
            panic!()
        };
        assert_eq!(
            moves,
            vec![Move {
                model: 0,
                from: Residency::Full,
                to: Residency::Unloaded
            }]
        );
        apply(&mut p, &moves);
        assert!(matches!(p.request(1, secs(2)), Admission::Load { .. }));
        assert_eq!(p.waiting_for(1, secs(2)), None);
        assert!(p.draining_models(secs(2)).is_empty());
    }

    #[test]
    fn a_request_waiting_on_its_draining_model_keeps_its_place_before_later_ones() {
        // Seed 4 of the property test in small: "a" busy drains for "b";
        // a request for "a" waits behind "b"; a later one for "c" must not
        // get in before it (it did: "c" re-marked "a" draining for itself,
        // the request for "a" moved behind "c", and "c" took the room "a"
        // needed to load again).
        let (a, b, c) = (0, 1, 2);
        let mut p = policy(10, vec![spec("a", 6, 6), spec("b", 5, 5), spec("c", 3, 3)]);
        admit(&mut p, a, secs(0));
        assert_eq!(p.request(b, secs(10)), Admission::Wait { moves: vec![] });
        assert_eq!(p.draining_models(secs(10)), vec![a]);
        assert_eq!(p.request(a, secs(11)), Admission::Wait { moves: vec![] });
        // "c" would fit the 4 GiB left, but "b" and "a" came first.
        assert_eq!(p.request(c, secs(13)), Admission::Wait { moves: vec![] });
        // Everyone asks again (the registry does, every second).
        assert_eq!(p.request(a, secs(13)), Admission::Wait { moves: vec![] });
        assert_eq!(p.request(b, secs(13)), Admission::Wait { moves: vec![] });
        assert_eq!(p.request(c, secs(13)), Admission::Wait { moves: vec![] });
        assert_eq!(p.request(a, secs(13)), Admission::Wait { moves: vec![] });
        assert!(p.waiting_for(a, secs(13)).unwrap() > p.waiting_for(c, secs(13)).unwrap());

        // "a" ends: it is unloaded for "b", which loads.
        p.finish(a, secs(14));
        admit(&mut p, b, secs(14));
        assert_eq!(p.residency(a), Residency::Unloaded);
        assert_eq!(p.residency(b), Residency::Full);
        // 5 GiB free: "c" (3) fits, but the request for "a" (6) came first.
        assert_eq!(p.request(c, secs(15)), Admission::Wait { moves: vec![] });
        assert_eq!(p.request(a, secs(15)), Admission::Wait { moves: vec![] });
        assert_eq!(p.draining_models(secs(15)), vec![b]);
        assert_eq!(p.request(c, secs(15)), Admission::Wait { moves: vec![] });
        // "b" ends: "a" gets in, then "c" beside it.
        p.finish(b, secs(16));
        admit(&mut p, a, secs(16));
        assert_eq!(p.residency(b), Residency::Unloaded);
        assert!(matches!(p.request(c, secs(16)), Admission::Load { .. }));
        assert_within_budget(&p);
    }

    #[test]
    fn a_request_held_before_it_asks_keeps_its_model_busy_and_its_place() {
        // The server's gate holds a second request for "a" while its one
        // slot runs the first. Unannounced, "a" looked idle the moment its
        // running request ended, and "b" (which came later) had it
        // unloaded: the held request then waited for "b"'s load and work
        // and a reload of "a" (property seeds 4 and 6).
        let (a, b) = (0, 1);
        let mut p = policy(10, vec![spec("a", 6, 6), spec("b", 5, 5)]);
        admit(&mut p, a, secs(0));
        let held = p.arrive(a, secs(1));
        assert_eq!(p.coming(a), 1);
        assert_eq!(p.request(b, secs(2)), Admission::Wait { moves: vec![] });
        assert_eq!(p.draining_models(secs(2)), vec![a]);
        // "a"'s running request ends; "b" asks before the held one does.
        p.finish(a, secs(3));
        assert_eq!(p.request(b, secs(3)), Admission::Wait { moves: vec![] });
        let moves = p.tick(secs(3));
        assert!(moves.is_empty(), "{moves:?}");
        // The held request came before "b": it runs on "a", which drains
        // for "b" meanwhile.
        assert_eq!(
            p.request_announced(a, secs(3), Some(held)),
            Admission::Ready
        );
        assert_eq!(p.coming(a), 0);
        assert_eq!(p.request(b, secs(3)), Admission::Wait { moves: vec![] });
        // One that came after "b" waits behind it: once "a" runs nothing
        // announced before "b", it is unloaded for "b".
        let later = p.arrive(a, secs(4));
        p.finish(a, secs(5));
        let unload = Move {
            model: a,
            from: Residency::Full,
            to: Residency::Unloaded,
        };
        assert_eq!(
            p.request(b, secs(5)),
            Admission::Wait {
                moves: vec![unload]
            }
        );
        assert_eq!(
            p.request_announced(a, secs(5), Some(later)),
            Admission::Wait { moves: vec![] }
        );
        apply(&mut p, &[unload]);
        admit(&mut p, b, secs(5));
        assert_eq!(
            p.request_announced(a, secs(6), Some(later)),
            Admission::Wait { moves: vec![] }
        );
        assert_eq!(p.draining_models(secs(6)), vec![b]);
        // It went away: nothing is announced for "a" any more.
        assert!(p.leave(a, later));
        assert!(!p.leave(a, later));
        assert_eq!(p.coming(a), 0);
        assert_within_budget(&p);
    }

    #[test]
    fn a_model_whose_earlier_request_is_held_behind_a_later_one_takes_the_later_one() {
        // The gate may let a later request for "a" ask before an earlier
        // one (fairness between users): the later one must not wait behind
        // "b", or the earlier one (held behind it) would wait for ever.
        let (a, b) = (0, 1);
        let mut p = policy(10, vec![spec("a", 6, 6), spec("b", 5, 5)]);
        admit(&mut p, a, secs(0));
        let early = p.arrive(a, secs(1));
        assert_eq!(p.request(b, secs(2)), Admission::Wait { moves: vec![] });
        let late = p.arrive(a, secs(3));
        p.finish(a, secs(4));
        assert_eq!(
            p.request_announced(a, secs(4), Some(late)),
            Admission::Ready
        );
        assert_eq!(p.coming(a), 1);
        p.finish(a, secs(5));
        assert_eq!(p.request(b, secs(5)), Admission::Wait { moves: vec![] });
        assert_eq!(
            p.request_announced(a, secs(5), Some(early)),
            Admission::Ready
        );
        p.finish(a, secs(6));
        let Admission::Wait { moves } = p.request(b, secs(6)) else {
            panic!("b waits for a's unloading")
        };
        apply(&mut p, &moves);
        admit(&mut p, b, secs(6));
        assert_eq!(p.residency(a), Residency::Unloaded);
    }

    #[test]
    fn an_announced_request_keeps_an_idle_model_from_its_keep_alive() {
        let mut p = policy(10, vec![spec("a", 2, 6)]);
        p.set_keep_alive(0, Some(Duration::ZERO));
        admit(&mut p, 0, secs(0));
        let held = p.arrive(0, secs(0));
        p.finish(0, secs(1));
        assert!(p.tick(secs(1)).is_empty());
        assert_eq!(
            p.request_announced(0, secs(1), Some(held)),
            Admission::Ready
        );
        p.finish(0, secs(2));
        assert_eq!(p.tick(secs(2)).len(), 1, "unloaded once nothing is held");
    }

    #[test]
    fn idle_models_yield_to_a_request_at_once_whatever_their_heat() {
        // The scenario in small: two models used just now and idle
        // hold the room a third needs.
        let mut p = policy(
            10,
            vec![
                spec("tinyllama", 3, 4),
                spec("tinymoe", 3, 4),
                spec("smol", 3, 4),
            ],
        );
        for t in 0..5 {
            admit(&mut p, 0, secs(t));
            p.finish(0, secs(t));
            admit(&mut p, 1, secs(t));
            p.finish(1, secs(t));
        }
        let Admission::Wait { moves } = p.request(2, secs(5)) else {
            panic!("no room yet")
        };
        assert!(!moves.is_empty(), "an idle model yields at once");
        apply(&mut p, &moves);
        assert!(matches!(p.request(2, secs(5)), Admission::Load { .. }));
        assert_within_budget(&p);
    }

    #[test]
    fn three_models_alternating_all_keep_answering_within_the_budget() {
        let mut p = policy(10, vec![spec("a", 2, 6), spec("b", 2, 6), spec("c", 2, 6)]);
        for t in 0..600u64 {
            let id = (t % 3) as usize;
            admit(&mut p, id, secs(t));
            assert!(p.residency(id) >= Residency::Streaming);
            p.finish(id, secs(t));
            let moves = p.tick(secs(t));
            apply(&mut p, &moves);
        }
        // Equal heat: no thrashing between them (hysteresis), nobody unloaded.
        for id in 0..3 {
            assert!(p.residency(id) >= Residency::Streaming);
        }
    }

    /// xorshift64*: deterministic traces without a dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Random traces of requests, finishes, ticks and moves completing in any
    /// order: the budget holds after every step, busy models stay loaded,
    /// pins hold, and every request is eventually admitted.
    #[test]
    fn the_budget_holds_after_every_step_of_random_traces() {
        for seed in 1..=300u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let n = 2 + rng.below(4) as usize;
            let budget = Footprint::new(rng.below(16) * GIB, (4 + rng.below(28)) * GIB);
            let mut p = BudgetPolicy::new(budget, PolicyConfig::default());
            let mut ids = Vec::new();
            for i in 0..n {
                let s = 1 + rng.below(4);
                let f = s + rng.below(12);
                let gpu = rng.below(2) * rng.below(8);
                let pin = if rng.below(6) == 0 {
                    Residency::Streaming
                } else {
                    Residency::Unloaded
                };
                let full_is_separate = rng.below(2) == 0;
                // A separate full placement may trade RAM for GPU memory.
                let full = if full_is_separate && rng.below(2) == 0 {
                    Footprint::new((gpu + f) * GIB, GIB / 2)
                } else {
                    Footprint::new(gpu * GIB, f * GIB)
                };
                let spec = ModelSpec {
                    name: format!("m{i}"),
                    streaming: Footprint::new(0, s * GIB),
                    partial: Footprint::new(gpu * GIB / 2, (s + f) * GIB / 2),
                    full,
                    full_is_separate,
                    pin,
                    priority: rng.below(3) as i32,
                    keep_alive: Some(secs(30 + rng.below(300))),
                };
                if let Ok(id) = p.add_model(spec) {
                    ids.push(id);
                }
            }
            let mut pending: Vec<Move> = Vec::new();
            let mut running: Vec<ModelId> = Vec::new();
            let mut waiting: Vec<ModelId> = Vec::new();
            let mut t = 0u64;
            for _ in 0..400 {
                t += rng.below(20);
                let now = secs(t);
                match rng.below(5) {
                    0 | 1 if !ids.is_empty() => {
                        let id = ids[rng.below(ids.len() as u64) as usize];
                        match p.request(id, now) {
                            Admission::Ready => running.push(id),
                            Admission::Load { mv } => {
                                pending.push(mv);
                                running.push(id);
                            }
                            Admission::Wait { moves } => {
                                pending.extend(moves);
                                waiting.push(id);
                            }
                            Admission::Reject(why) => panic!("seed {seed}: {why}"),
                        }
                    }
                    2 if !running.is_empty() => {
                        let i = rng.below(running.len() as u64) as usize;
                        p.finish(running.swap_remove(i), now);
                    }
                    3 if !pending.is_empty() => {
                        let i = rng.below(pending.len() as u64) as usize;
                        p.move_done(pending.swap_remove(i));
                    }
                    _ => pending.extend(p.tick(now)),
                }
                assert_within_budget(&p);
                for (i, a) in pending.iter().enumerate() {
                    assert!(
                        pending[i + 1..].iter().all(|b| b.model != a.model),
                        "seed {seed}: two moves at once for model {}",
                        a.model
                    );
                }
                for &id in &running {
                    assert!(
                        p.residency(id) > Residency::Unloaded || p.moving_to(id).is_some(),
                        "seed {seed}: a model with a request in flight was unloaded"
                    );
                    assert_ne!(p.moving_to(id), Some(Residency::Unloaded), "seed {seed}");
                }
                for &id in &ids {
                    let pin = p.spec(id).pin;
                    if p.residency(id) >= pin && p.residency(id) > Residency::Unloaded {
                        assert!(
                            p.moving_to(id).is_none_or(|to| to >= pin),
                            "seed {seed}: pin broken"
                        );
                    }
                }
            }
            // Drain: finish everything, let moves complete; every waiting
            // request then gets in.
            for id in running.drain(..) {
                p.finish(id, secs(t));
            }
            for mv in pending.drain(..) {
                p.move_done(mv);
            }
            for id in waiting {
                // Others just served are hot: the waiter gets in once they idle.
                t += 1000;
                admit(&mut p, id, secs(t));
                p.finish(id, secs(t));
                assert_within_budget(&p);
            }
        }
    }
}
