//! The budget policy under random traffic, driven the way the registry
//! drives it (a property test over seeded random traces): 3–4 models of
//! random sizes under random budgets, requests arriving at random for
//! random models, each running a random time, loads and moves taking time
//! (an unload none, as in the registry), waiters asking again at every
//! step, a tick every second.
//!
//! Checked at every step: the memory charged never exceeds the budget,
//! and no request waits longer than the work it can wait behind plus the
//! moves: `models × (longest request + two longest loads + a tick)` — a
//! request waits only for busy models (each drains within the longest
//! request), for the moves that free their memory, and behind the waiters
//! for the other models that came before it.
use std::time::Duration;

use hypura_scheduler::budget::{
    Admission, BudgetPolicy, Footprint, ModelId, ModelSpec, Move, PolicyConfig, Residency,
};

const MIB: u64 = 1 << 20;
/// Simulation step, in milliseconds.
const STEP_MS: u64 = 100;
const TICK_MS: u64 = 1000;
const LONGEST_WORK_MS: u64 = 4000;
const LONGEST_LOAD_MS: u64 = 3000;
/// A cache resize.
const RESIZE_MS: u64 = 100;
const HORIZON_MS: u64 = 300_000;

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
        self.next() % n.max(1)
    }

    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

fn ms(t: u64) -> Duration {
    Duration::from_millis(t)
}

struct Model {
    id: ModelId,
    load_ms: u64,
    /// Relative share of the arrivals.
    weight: u64,
}

struct Request {
    model: ModelId,
    arrived_ms: u64,
    work_ms: u64,
}

struct Pending {
    mv: Move,
    ends_ms: u64,
}

struct Sim {
    policy: BudgetPolicy,
    models: Vec<Model>,
    pending: Vec<Pending>,
    /// When each running request ends, by model.
    running: Vec<(ModelId, u64)>,
    waiting: Vec<Request>,
    /// The longest wait for admission seen, in milliseconds.
    longest_wait_ms: u64,
    admitted: usize,
    seed: u64,
}

impl Sim {
    fn check_budget(&self, what: &str) {
        let charged = self.policy.charged();
        assert!(
            charged.fits_in(self.policy.budget()),
            "seed {}: after {what}, charged {charged} over the budget {}",
            self.seed,
            self.policy.budget()
        );
    }

    /// Starts `mv` at `now_ms`: an unload is done at once (the registry
    /// drops the model and reports it), a load or a switch of placement
    /// takes the model's load time, a cache resize a moment.
    fn start(&mut self, mv: Move, now_ms: u64) {
        let spec = self.policy.spec(mv.model);
        let took = if mv.to == Residency::Unloaded {
            0
        } else if mv.from == Residency::Unloaded || spec.reloads(mv.from, mv.to) {
            self.models[mv.model].load_ms
        } else {
            RESIZE_MS
        };
        if took == 0 {
            self.policy.move_done(mv);
            self.check_budget("an unload");
        } else {
            self.pending.push(Pending {
                mv,
                ends_ms: now_ms + took,
            });
        }
    }

    /// When a request admitted now for `model` can start: once the load
    /// under way (if any) ends.
    fn starts_at(&self, model: ModelId, now_ms: u64) -> u64 {
        self.pending
            .iter()
            .filter(|p| p.mv.model == model && p.mv.from == Residency::Unloaded)
            .map(|p| p.ends_ms)
            .max()
            .unwrap_or(now_ms)
    }

    fn step(&mut self, now_ms: u64) {
        let now = ms(now_ms);
        // Moves and requests that end now.
        let mut i = 0;
        while i < self.pending.len() {
            if self.pending[i].ends_ms <= now_ms {
                let done = self.pending.swap_remove(i);
                self.policy.move_done(done.mv);
                self.check_budget("a move");
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].1 <= now_ms {
                let (model, _) = self.running.swap_remove(i);
                self.policy.finish(model, now);
            } else {
                i += 1;
            }
        }
        // Every waiter asks again, in the order they came.
        let mut still = Vec::new();
        for request in std::mem::take(&mut self.waiting) {
            let admission = self.policy.request(request.model, now);
            self.check_budget("a request");
            let begins = match admission {
                Admission::Ready => Some(self.starts_at(request.model, now_ms)),
                Admission::Load { mv } => {
                    self.start(mv, now_ms);
                    Some(self.starts_at(request.model, now_ms))
                }
                Admission::Wait { moves } => {
                    for mv in moves {
                        self.start(mv, now_ms);
                    }
                    None
                }
                Admission::Reject(why) => panic!("seed {}: {why}", self.seed),
            };
            match begins {
                Some(at) => {
                    let waited = now_ms - request.arrived_ms;
                    self.longest_wait_ms = self.longest_wait_ms.max(waited);
                    self.admitted += 1;
                    self.running.push((request.model, at + request.work_ms));
                }
                None => still.push(request),
            }
        }
        self.waiting = still;
        if now_ms.is_multiple_of(TICK_MS) {
            for mv in self.policy.tick(now) {
                self.start(mv, now_ms);
            }
            self.check_budget("a tick");
        }
    }
}

/// One random model: streaming, partial and full footprints in RAM, and
/// sometimes a separate full placement holding GPU memory instead.
fn random_spec(rng: &mut Rng, i: usize, gpu: bool) -> ModelSpec {
    let streaming = rng.between(20, 120) * MIB;
    let full = streaming + rng.between(0, 300) * MIB;
    let full_is_separate = rng.below(2) == 0;
    let full = if full_is_separate && gpu && rng.below(2) == 0 {
        Footprint::new(full, 8 * MIB)
    } else {
        Footprint::new(0, full)
    };
    ModelSpec {
        name: format!("m{i}"),
        streaming: Footprint::new(0, streaming),
        partial: Footprint::new(0, (streaming + full.ram_bytes.max(streaming)) / 2),
        full,
        full_is_separate,
        pin: if rng.below(8) == 0 {
            Residency::Streaming
        } else {
            Residency::Unloaded
        },
        priority: rng.below(3) as i32,
        keep_alive: match rng.below(4) {
            0 => None,
            1 => Some(Duration::ZERO),
            _ => Some(ms(rng.between(1, 120) * 1000)),
        },
    }
}

fn run(seed: u64) -> Sim {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let n = 3 + rng.below(2) as usize;
    let gpu = rng.below(2) == 0;
    let specs: Vec<ModelSpec> = (0..n).map(|i| random_spec(&mut rng, i, gpu)).collect();
    // From about the largest model streaming to everything held in full.
    let largest = specs.iter().map(|s| s.streaming.ram_bytes).max().unwrap();
    let total: u64 = specs.iter().map(|s| s.full.ram_bytes).sum();
    let ram = rng.between(largest, total.max(largest) + 64 * MIB);
    let gpu_bytes = if gpu { rng.between(0, 400) * MIB } else { 0 };
    let config = PolicyConfig {
        demote_after: ms(rng.between(5, 120) * 1000),
        ..PolicyConfig::default()
    };
    let mut policy = BudgetPolicy::new(Footprint::new(gpu_bytes, ram), config);
    let mut models = Vec::new();
    for spec in specs {
        if let Ok(id) = policy.add_model(spec) {
            models.push(Model {
                id,
                load_ms: rng.between(200, LONGEST_LOAD_MS),
                weight: rng.between(1, 10),
            });
        }
    }
    assert!(!models.is_empty(), "seed {seed}: no model fits");
    let mut sim = Sim {
        policy,
        models,
        pending: Vec::new(),
        running: Vec::new(),
        waiting: Vec::new(),
        longest_wait_ms: 0,
        admitted: 0,
        seed,
    };
    // Arrivals per step, in thousandths: from a trickle to bursts.
    let rate = rng.between(20, 600);
    let weights: u64 = sim.models.iter().map(|m| m.weight).sum();
    let bound_ms = sim.models.len() as u64 * (LONGEST_WORK_MS + 2 * LONGEST_LOAD_MS + TICK_MS);
    let mut now_ms = 0;
    while now_ms < HORIZON_MS || !sim.waiting.is_empty() {
        assert!(
            now_ms < HORIZON_MS + 10 * bound_ms,
            "seed {seed}: requests still waiting long after the last arrival"
        );
        let mut arrivals = 0;
        while now_ms < HORIZON_MS && rng.below(1000) < rate && arrivals < 4 {
            arrivals += 1;
            let mut pick = rng.below(weights);
            let model = sim
                .models
                .iter()
                .find(|m| {
                    let hit = pick < m.weight;
                    pick = pick.saturating_sub(m.weight);
                    hit
                })
                .map_or(0, |m| m.id);
            let work_ms = rng.between(STEP_MS, LONGEST_WORK_MS);
            sim.waiting.push(Request {
                model,
                arrived_ms: now_ms,
                work_ms,
            });
        }
        sim.step(now_ms);
        for r in &sim.waiting {
            assert!(
                now_ms - r.arrived_ms <= bound_ms,
                "seed {seed}: a request for {} has waited {} ms, more than {bound_ms} ms \
                 (in flight: {:?}; residency: {:?})",
                sim.policy.spec(r.model).name,
                now_ms - r.arrived_ms,
                (0..sim.models.len())
                    .map(|id| sim.policy.in_flight(id))
                    .collect::<Vec<_>>(),
                (0..sim.models.len())
                    .map(|id| (sim.policy.residency(id), sim.policy.moving_to(id)))
                    .collect::<Vec<_>>(),
            );
        }
        now_ms += STEP_MS;
    }
    sim
}

#[test]
fn every_request_gets_in_within_the_work_ahead_of_it_and_the_budget_always_holds() {
    let mut admitted = 0;
    let mut longest = 0;
    for seed in 1..=200u64 {
        let sim = run(seed);
        admitted += sim.admitted;
        longest = longest.max(sim.longest_wait_ms);
    }
    assert!(
        admitted > 10_000,
        "{admitted} requests: too few to mean much"
    );
    eprintln!("{admitted} requests admitted; the longest wait {longest} ms");
}

#[test]
fn with_the_other_models_idle_a_request_gets_in_at_once() {
    // The scenario: two models used in turn, then idle, hold the
    // room a third needs; heat must not keep them.
    for seed in 1..=100u64 {
        let mut rng = Rng(seed);
        let specs: Vec<ModelSpec> = (0..3).map(|i| random_spec(&mut rng, i, false)).collect();
        let held: u64 = specs[..2].iter().map(|s| s.full.ram_bytes).sum();
        let budget = held + specs[2].streaming.ram_bytes - 1;
        let mut p = BudgetPolicy::new(Footprint::new(0, budget), PolicyConfig::default());
        let specs: Vec<ModelSpec> = specs
            .into_iter()
            .map(|s| ModelSpec {
                pin: Residency::Unloaded,
                keep_alive: None,
                ..s
            })
            .collect();
        let ids: Vec<ModelId> = specs.into_iter().map(|s| p.add_model(s).unwrap()).collect();
        let mut t = 0;
        for &id in &ids[..2] {
            for _ in 0..5 {
                t += 1;
                match p.request(id, ms(t)) {
                    Admission::Ready => {}
                    Admission::Load { mv } => p.move_done(mv),
                    other => panic!("seed {seed}: {other:?}"),
                }
                p.finish(id, ms(t));
            }
        }
        // One round of moves, done at once, then it is in.
        let admitted = (0..3).any(|_| match p.request(ids[2], ms(t)) {
            Admission::Ready | Admission::Load { .. } => true,
            Admission::Wait { moves } => {
                assert!(!moves.is_empty(), "seed {seed}: waits on idle models");
                moves.into_iter().for_each(|mv| p.move_done(mv));
                false
            }
            Admission::Reject(why) => panic!("{why}"),
        });
        assert!(admitted, "seed {seed}");
        assert!(p.charged().fits_in(p.budget()));
    }
}
