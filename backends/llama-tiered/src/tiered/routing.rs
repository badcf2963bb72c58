//! Routing observation: which experts a MoE's routers chose, per layer and
//! token, for `hypura bench --routing` and the routing tests.
//!
//! [`RoutingRecorder`] is an [`EvalHook`] wrapped around the model's own
//! hook (the streamer's, if any): while recording, it also asks llama.cpp
//! for every layer's `ffn_moe_topk-N` node (the selected expert ids, one row
//! per token) and keeps their rows; otherwise it only forwards. Asking for a
//! node makes llama.cpp sync at it, so recording costs time: a caller turns
//! it on only for runs it does not time.
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::llama::{EvalHook, Node};

/// The metadata key where `hypura-synth` names the routing profile its
/// routers were written with (`hypura bench` reports it).
pub const SYNTH_ROUTING_KEY: &str = "hypura.synth.routing";

const TOPK_PREFIX: &[u8] = b"ffn_moe_topk-";

thread_local! {
    /// Whether the inner hook wanted the node last asked about on this
    /// thread: llama.cpp's `computed` call follows the `wants` call of the
    /// same node on the same thread.
    static INNER_WANTED: Cell<bool> = const { Cell::new(false) };
}

/// Every layer's chosen experts, rows of token order (ubatches appended as
/// computed).
#[derive(Clone, Debug, Default)]
pub struct RoutingTrace {
    /// `layers[l][t]`: the experts layer `l` chose for the `t`-th token seen.
    pub layers: Vec<Vec<Vec<u32>>>,
}

/// Statistics of a [`RoutingTrace`] (or of a slice of its tokens).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct RoutingSummary {
    /// Most tokens a layer's statistics cover.
    pub tokens: usize,
    /// `histogram[l][e]`: how many of those tokens layer `l` sent to expert `e`.
    pub histogram: Vec<Vec<u64>>,
    /// Mean over layers and consecutive token pairs of the fraction of a
    /// token's experts that the previous token also chose (1: the same set
    /// every token; `k / n_expert` for independent uniform choices).
    pub overlap: f64,
    /// Mean over layers of 1 − H(shares)/ln(n_expert), the selection
    /// histogram's normalised entropy gap (0: uniform, 1: one expert).
    pub concentration: f64,
    /// Mean over layers of the most chosen expert's share of the selections.
    pub top_share: f64,
}

impl RoutingTrace {
    /// (every layer's rows but its last `n`, every layer's last `n` rows):
    /// a prompt and the `n` tokens decoded after it. Layers may hold fewer
    /// prompt rows than tokens: llama.cpp computes the last layer's FFN only
    /// for the tokens whose output is asked for.
    pub fn split_last(&self, n: usize) -> (RoutingTrace, RoutingTrace) {
        let (mut head, mut tail) = (RoutingTrace::default(), RoutingTrace::default());
        for rows in &self.layers {
            let at = rows.len().saturating_sub(n);
            head.layers.push(rows[..at].to_vec());
            tail.layers.push(rows[at..].to_vec());
        }
        (head, tail)
    }

    /// Statistics of every layer's rows, for `n_expert` experts.
    pub fn summary(&self, n_expert: usize) -> RoutingSummary {
        let mut out = RoutingSummary::default();
        let (mut overlap_sum, mut pairs) = (0.0, 0usize);
        let (mut conc_sum, mut top_sum, mut layers) = (0.0, 0.0, 0usize);
        for rows in &self.layers {
            out.tokens = out.tokens.max(rows.len());
            let mut hist = vec![0u64; n_expert];
            for row in rows {
                for &e in row {
                    if let Some(h) = hist.get_mut(e as usize) {
                        *h += 1;
                    }
                }
            }
            for w in rows.windows(2) {
                if w[1].is_empty() {
                    continue;
                }
                let shared = w[1].iter().filter(|e| w[0].contains(e)).count();
                overlap_sum += shared as f64 / w[1].len() as f64;
                pairs += 1;
            }
            let total: u64 = hist.iter().sum();
            if total > 0 && n_expert > 1 {
                let entropy: f64 = hist
                    .iter()
                    .filter(|&&h| h > 0)
                    .map(|&h| {
                        let p = h as f64 / total as f64;
                        -p * p.ln()
                    })
                    .sum();
                conc_sum += 1.0 - entropy / (n_expert as f64).ln();
                top_sum += *hist.iter().max().unwrap_or(&0) as f64 / total as f64;
                layers += 1;
            }
            out.histogram.push(hist);
        }
        out.overlap = overlap_sum / pairs.max(1) as f64;
        out.concentration = conc_sum / layers.max(1) as f64;
        out.top_share = top_sum / layers.max(1) as f64;
        out
    }
}

/// An [`EvalHook`] that records the experts chosen while recording is on,
/// and otherwise hands every node to `inner`.
pub struct RoutingRecorder {
    inner: Option<Arc<dyn EvalHook>>,
    recording: AtomicBool,
    trace: Mutex<RoutingTrace>,
}

impl RoutingRecorder {
    pub fn new(inner: Option<Arc<dyn EvalHook>>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            recording: AtomicBool::new(false),
            trace: Mutex::new(RoutingTrace::default()),
        })
    }

    /// Starts (clearing what was recorded) or stops recording.
    pub fn set_recording(&self, on: bool) {
        if on {
            *self.trace.lock().unwrap_or_else(|e| e.into_inner()) = RoutingTrace::default();
        }
        self.recording.store(on, Ordering::SeqCst);
    }

    /// What was recorded since recording last started.
    pub fn trace(&self) -> RoutingTrace {
        self.trace.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn layer(name: &[u8]) -> Option<usize> {
        std::str::from_utf8(name.strip_prefix(TOPK_PREFIX)?)
            .ok()?
            .parse()
            .ok()
    }
}

impl EvalHook for RoutingRecorder {
    fn wants(&self, name: &[u8], node: &Node) -> bool {
        let inner = self.inner.as_ref().is_some_and(|h| h.wants(name, node));
        INNER_WANTED.with(|c| c.set(inner));
        inner || (self.recording.load(Ordering::Relaxed) && Self::layer(name).is_some())
    }

    fn computed(&self, name: &[u8], node: &Node) {
        if self.recording.load(Ordering::Relaxed) {
            if let Some(layer) = Self::layer(name) {
                let rows = node.i32_rows();
                let mut trace = self.trace.lock().unwrap_or_else(|e| e.into_inner());
                if trace.layers.len() <= layer {
                    trace.layers.resize(layer + 1, Vec::new());
                }
                trace.layers[layer].extend(rows.into_iter().map(|r| {
                    r.into_iter()
                        .filter(|&e| e >= 0)
                        .map(|e| e as u32)
                        .collect()
                }));
            }
        }
        if INNER_WANTED.with(Cell::get) {
            if let Some(inner) = &self.inner {
                inner.computed(name, node);
            }
        }
    }

    fn failed(&self) -> bool {
        self.inner.as_ref().is_some_and(|h| h.failed())
    }

    fn take_error(&self) -> Option<String> {
        self.inner.as_ref().and_then(|h| h.take_error())
    }

    fn decode_done(&self) {
        if let Some(inner) = &self.inner {
            inner.decode_done();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_counts_experts_and_consecutive_overlap() {
        let trace = RoutingTrace {
            layers: vec![
                vec![vec![0, 1], vec![1, 2], vec![1, 2], vec![3, 0]],
                vec![vec![2, 3]; 4],
            ],
        };
        let s = trace.summary(4);
        assert_eq!(s.tokens, 4);
        assert_eq!(s.histogram, vec![vec![2, 3, 2, 1], vec![0, 0, 4, 4]]);
        // Layer 0: 1/2, 2/2, 0/2; layer 1: 1, 1, 1 → 4.5 / 6.
        assert!((s.overlap - 0.75).abs() < 1e-12, "{s:?}");
        assert!((s.top_share - (3.0 / 8.0 + 0.5) / 2.0).abs() < 1e-12);
        let (head, tail) = trace.split_last(2);
        assert_eq!(head.summary(4).histogram[1], vec![0, 0, 2, 2]);
        let tail = tail.summary(4);
        assert_eq!(tail.histogram[0], vec![1, 1, 1, 1]);
        assert!((tail.overlap - 0.5).abs() < 1e-12);
    }
}
