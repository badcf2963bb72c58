//! A stream cache held to a process memory limit gives back, before it
//! reads again, the memory the process takes besides it. Alone in its test
//! binary: it reads this process's resident set, which other tests running
//! beside it would move.
use hypura_gguf::GgufFile;
use llama_tiered::hwprobe::host::statm_rss_bytes;
use llama_tiered::test_models;
use llama_tiered::tiered::{GpuShare, Mode, PlannedLoad, TieredModel, TieredParams};

const PROMPT: &str = "The history of the city of Paris begins";

/// Greedy tokens of `n` steps after the prompt.
fn greedy(m: &TieredModel, n: u32) -> Vec<i32> {
    test_models::greedy_tokens(m, PROMPT, n)
}

fn load(mode: Mode) -> TieredModel {
    let path = test_models::smollm2();
    let file = GgufFile::open(&path).unwrap();
    let params = TieredParams {
        plan: Some(PlannedLoad::fixed(&file, mode, GpuShare::None, None).unwrap()),
        no_repack: true,
        cache_dir: Some(
            std::env::temp_dir().join(format!("hypura-host-limit-{}", std::process::id())),
        ),
        ..Default::default()
    };
    TieredModel::load(&path, &params).unwrap()
}

/// The resident set as the guard counts it: with its page tables.
fn charged() -> u64 {
    let rss = statm_rss_bytes().unwrap();
    rss + rss / 512
}

#[test]
fn the_stream_cache_gives_back_what_the_process_takes_besides_it() {
    let reference = greedy(&load(Mode::FullResident), 12);
    let m = load(Mode::DenseFfnStreaming);
    let streamer = m.streamer.as_ref().unwrap();
    let stream = streamer.stream_bytes();
    let minimum = streamer.minimum_budget_bytes();
    // A first decode's buffers are resident before the limit is set, as in
    // `hypura bench` and `run`.
    greedy(&m, 1);
    streamer.set_cache_budget(minimum).unwrap();

    // Room for about 3/4 of the streamed weights besides what is resident now.
    let room = minimum + (stream - minimum) * 3 / 4;
    let limit = charged() + room;
    m.fit_stream_cache(limit).unwrap();
    streamer.set_cache_budget(stream).unwrap(); // the cap no longer binds: the limit does
    assert_eq!(greedy(&m, 12), reference);
    let before = m.stats();
    assert!(
        before.cache_budget_bytes < stream && before.cache_budget_bytes > room / 2,
        "the limit binds: {before:?} (stream {stream}, room {room})"
    );
    assert!(
        before.cache_bytes <= before.cache_budget_bytes,
        "{before:?}"
    );
    // Within the limit, give or take a page per boundary and the reading's own slack.
    assert!(charged() <= limit + (1 << 20), "{} > {limit}", charged());

    // The process takes memory besides the cache: the cache gives it back.
    let taken = ((stream - minimum) / 3) as usize;
    let ballast = vec![1u8; taken];
    assert_eq!(greedy(&m, 12), reference);
    let after = m.stats();
    assert!(
        after.cache_budget_bytes + taken as u64 <= before.cache_budget_bytes + (2 << 20),
        "the budget shrank by what was taken ({taken}): {} -> {}",
        before.cache_budget_bytes,
        after.cache_budget_bytes
    );
    assert!(after.cache_bytes <= after.cache_budget_bytes, "{after:?}");
    assert!(charged() <= limit + (1 << 20), "{} > {limit}", charged());
    assert!(ballast.iter().all(|&b| b == 1));

    // Given back again: the cache may grow back to the limit.
    drop(ballast);
    assert_eq!(greedy(&m, 12), reference);
    assert!(m.stats().cache_budget_bytes > after.cache_budget_bytes);
}
