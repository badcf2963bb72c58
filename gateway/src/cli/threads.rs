//! How many decode threads a model gets: `--threads` / `[server] threads`,
//! else the physical cores this process may use, less one when there are
//! more than two (llama.cpp's decode is memory-bound and collapses when a
//! thread competes with anything else: measured 70x slower with every core
//! busy). A warning goes to the log when the machine is oversubscribed.
//!
//! And how long the compute threads wait busily between two graph pieces
//! ([`start_with_short_openmp_spin`]).

/// Cores the process may run on (affinity and cgroup quota applied).
fn usable_cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// Physical cores (distinct `physical id`/`core id` pairs of
/// `/proc/cpuinfo`), at most the usable ones; the usable ones where
/// cpuinfo does not say.
fn physical_cores() -> u32 {
    let usable = usable_cores();
    let Ok(text) = std::fs::read_to_string("/proc/cpuinfo") else {
        return usable;
    };
    let mut cores = std::collections::HashSet::new();
    let mut package = String::new();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        match key.trim() {
            "physical id" => package = value.trim().to_string(),
            "core id" => {
                cores.insert((package.clone(), value.trim().to_string()));
            }
            _ => {}
        }
    }
    match cores.len() as u32 {
        0 => usable,
        n => n.min(usable),
    }
}

/// The default for `cores` physical cores: one left for the server and
/// everything else when there are more than two.
pub fn default_for(cores: u32) -> u32 {
    if cores > 2 {
        cores - 1
    } else {
        cores.max(1)
    }
}

/// The decode threads per model, warning when they, with the machine's
/// current load, are more than its cores.
pub fn decode_threads(configured: Option<u32>) -> u32 {
    let usable = usable_cores();
    let threads = configured
        .filter(|&n| n > 0)
        .unwrap_or_else(|| default_for(physical_cores()));
    if threads > usable {
        tracing::warn!(
            "{threads} decode threads on {usable} usable cores: decoding slows down sharply \
             when threads outnumber cores; lower --threads"
        );
    } else if let Some(load) = load_average() {
        if load + f64::from(threads) > f64::from(usable) + 0.5 {
            tracing::warn!(
                "the machine is busy (load average {load:.1} on {usable} cores): {threads} \
                 decode threads will compete with other processes and decode slowly"
            );
        }
    }
    eprintln!("hypura: {threads} decode threads per model ({usable} usable cores)");
    threads
}

/// The 1-minute load average.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// How many times llama.cpp's OpenMP threads spin once a piece of the graph
/// is computed, before they sleep. libgomp's default, 300,000 spins while
/// the threads fit the cores, keeps every core busy between pieces; a
/// streamed decode computes its graph in one piece per streamed layer, and
/// the stream's readers and the hook then wait for cores. 3,000 spins made
/// a streamed decode faster and a decode all in RAM no slower on dev; no
/// spinning at all cost the resident decode 25% (figures and commands:
/// docs/design.md, "The compute threads between pieces").
pub const OPENMP_SPIN_COUNT: &str = "3000";

/// libgomp reads its spin count once, as it loads, from `GOMP_SPINCOUNT`
/// (else from `OMP_WAIT_POLICY`): where neither is set, starts this
/// program again, same process and arguments, with
/// `GOMP_SPINCOUNT=`[`OPENMP_SPIN_COUNT`]. Runners inherit it. A setting
/// of the user's wins; where the program cannot start again, it goes on
/// with libgomp's default. Call first thing in `main`.
pub fn start_with_short_openmp_spin() {
    use std::os::unix::process::CommandExt;
    if std::env::var_os("GOMP_SPINCOUNT").is_some() || std::env::var_os("OMP_WAIT_POLICY").is_some()
    {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| exe.clone().into_os_string());
    // Returns only where the exec failed.
    let _ = std::process::Command::new(&exe)
        .arg0(arg0)
        .args(args)
        .env("GOMP_SPINCOUNT", OPENMP_SPIN_COUNT)
        .exec();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_core_is_left_free_above_two() {
        assert_eq!(default_for(1), 1);
        assert_eq!(default_for(2), 2);
        assert_eq!(default_for(3), 2);
        assert_eq!(default_for(16), 15);
        assert_eq!(decode_threads(Some(3)), 3);
        let physical = physical_cores();
        assert!(physical >= 1 && physical <= usable_cores());
    }
}
