//! Peak memory of writing a snapshot with a long history: `to_pickle` then
//! a file write (the whole pickle in memory) against `write_pickle` streamed
//! to a file (issue 29). Prints the pickle's size and the peak resident
//! memory (Linux `VmHWM`) before and after writing.
//!
//! ```sh
//! cargo run --release -p reservoir --example snapshot_memory -- stream 1000000 /tmp/s.pickle
//! cargo run --release -p reservoir --example snapshot_memory -- whole 1000000 /tmp/s.pickle
//! ```

use std::io::Write;

use reservoir::caching::HistoryConfig;
use reservoir::sim::SimDevice;
use reservoir::{AllocatorConfig, CachingAllocator, StreamId};

/// Peak resident memory in MiB (0 where `/proc` is missing).
fn peak_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map_or("stream", String::as_str);
    let pairs: u64 = args
        .get(2)
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000);
    let path = args
        .get(3)
        .map_or("/tmp/snapshot_memory.pickle", String::as_str);
    let a = CachingAllocator::new(SimDevice::default(), AllocatorConfig::default());
    a.record_memory_history(HistoryConfig::events_only(usize::MAX));
    for i in 0..pairs {
        let p = a
            .raw_alloc(512 + (i % 4096) * 512, StreamId::DEFAULT)
            .unwrap();
        a.raw_free(p).unwrap();
    }
    let snapshot = a.snapshot(None);
    drop(a);
    let before = peak_mib();
    match mode {
        "whole" => {
            let bytes = snapshot.to_pickle().unwrap();
            std::fs::write(path, bytes).unwrap();
        }
        _ => {
            let mut w = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
            snapshot.write_pickle(&mut w).unwrap();
            w.flush().unwrap();
        }
    }
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    println!(
        "{mode}: {} trace entries, pickle {} MiB; peak RSS {before} MiB before writing, {} MiB after",
        snapshot.device_traces.iter().map(Vec::len).sum::<usize>(),
        size >> 20,
        peak_mib()
    );
}
