//! Stream cache layers registered with the GPU's driver in place, so that
//! a prompt's copies of them to the GPU run at the pinned speed.
//!
//! For a batch of 32 tokens or more llama.cpp computes host-memory experts
//! on the GPU, copying each expert the batch uses there first (ggml's
//! scheduler, `ggml_backend_tensor_set_async`). From the STREAM region's
//! pageable pages that copy runs at 6.0 GB/s on the H200 (the measured
//! profile), against 54.7 GB/s from pinned memory: 3 s of a 5.9 s
//! 512-token pass of the Mixtral shape, by the planner's prompt model. The
//! region cannot be pinned whole (registering pins every page, beyond the
//! RAM budget), so the streamer registers a layer's spans when a prompt
//! pass finds every unit of it resident (the layers the cache keeps from
//! one pass to the next), on a thread of its own while the compute is
//! still layers behind, and unregisters them before any of its units is
//! released.
//!
//! Off by default (`HYPURA_PIN_STREAM=1` turns it on): measured on the
//! H200 (session 18), it did not pay. Registering ran at ~17 GB/s, but the
//! cache keeps most units of every layer rather than every unit of a few,
//! so a pass found one or two of the Mixtral shape's 32 layers whole
//! (pp512 119.8 tok/s against 108.4 unpinned, one repetition each, within
//! the spread between calls), and registering every layer the read-ahead
//! read whole as well cost more than it saved (114.4 ± 3.6 against
//! 136.5 ± 5.2: 22 registrations a pass, each unregistered again within
//! it, and a pass's stalls 3.1 s against 1.3 s). The copies themselves ran
//! faster than the profile's 6.0 GB/s for pageable memory suggests: the
//! unpinned pass took 3.75 s with 1.3 s of it stalled on reads.
//!
//! Invariants, kept by [`super::streamer::Streamer`]:
//! - a registered layer has every unit resident: an eviction unregisters
//!   the layer before releasing any page (the driver keeps a registered
//!   page's frame: released and read again while registered, the GPU would
//!   copy the old bytes);
//! - a layer with a pinned unit is neither evicted nor unregistered (from
//!   registered memory the copy is asynchronous, in flight until the
//!   pinning thread's next request, which follows a sync);
//! - spans never share a page (the driver refuses a page registered twice):
//!   a span that would share one with another layer's stays pageable.
use std::collections::HashMap;

use crate::llama::PAGE;

/// The layers registered now and their spans (file offsets, page aligned).
#[derive(Default)]
pub(super) struct Registered {
    layers: HashMap<u32, Vec<(u64, u64)>>,
    bytes: u64,
}

impl Registered {
    pub(super) fn holds(&self, layer: u32) -> bool {
        self.layers.contains_key(&layer)
    }

    pub(super) fn layers(&self) -> impl Iterator<Item = u32> + '_ {
        self.layers.keys().copied()
    }

    /// Bytes registered now.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The spans that register `ranges` (a layer's slices): each rounded
    /// out to whole pages, merged where they share or touch a page, less
    /// those sharing a page with a span registered already.
    pub(super) fn free_spans(
        &self,
        ranges: impl IntoIterator<Item = (u64, u64)>,
    ) -> Vec<(u64, u64)> {
        let mut pages: Vec<(u64, u64)> = ranges
            .into_iter()
            .filter(|(a, b)| b > a)
            .map(|(a, b)| (a / PAGE * PAGE, b.div_ceil(PAGE) * PAGE))
            .collect();
        pages.sort_unstable();
        let mut spans: Vec<(u64, u64)> = Vec::new();
        for (a, b) in pages {
            match spans.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => spans.push((a, b)),
            }
        }
        spans.retain(|&(a, b)| !self.layers.values().flatten().any(|&(c, d)| a < d && c < b));
        spans
    }

    /// Records `layer` as registered with `spans` (possibly none: the
    /// driver refused, and the layer is not tried again until evicted).
    pub(super) fn insert(&mut self, layer: u32, spans: Vec<(u64, u64)>) {
        self.bytes += span_bytes(&spans);
        if let Some(old) = self.layers.insert(layer, spans) {
            self.bytes -= span_bytes(&old);
        }
    }

    /// Forgets `layer`, returning the spans to unregister.
    pub(super) fn remove(&mut self, layer: u32) -> Vec<(u64, u64)> {
        let spans = self.layers.remove(&layer).unwrap_or_default();
        self.bytes -= span_bytes(&spans);
        spans
    }
}

fn span_bytes(spans: &[(u64, u64)]) -> u64 {
    spans.iter().map(|(a, b)| b - a).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_cover_whole_pages_merge_neighbours_and_never_share_a_page() {
        let mut registered = Registered::default();
        // Three slices of one tensor, end to end and unaligned, and one of
        // another tensor a page further: two spans.
        let spans =
            registered.free_spans([(4100, 6000), (100, 4100), (6000, 9000), (20000, 20001)]);
        assert_eq!(spans, vec![(0, 3 * PAGE), (4 * PAGE, 5 * PAGE)]);
        registered.insert(3, spans);
        assert_eq!(registered.bytes(), 4 * PAGE);
        // Another layer's slice sharing the last page of layer 3's first
        // span stays pageable; one beyond it is registered.
        let spans =
            registered.free_spans([(3 * PAGE - 10, 3 * PAGE + 10), (9 * PAGE, 9 * PAGE + 1)]);
        assert_eq!(spans, vec![(9 * PAGE, 10 * PAGE)]);
        assert_eq!(
            registered.remove(3),
            vec![(0, 3 * PAGE), (4 * PAGE, 5 * PAGE)]
        );
        assert_eq!(registered.bytes(), 0);
        assert!(!registered.holds(3));
    }
}
