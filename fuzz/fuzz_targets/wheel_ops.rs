//! Fuzzes operation sequences on the cascade wheel against the same `BTreeMap` model as the
//! property tests. Run with `cargo +nightly fuzz run wheel_ops` from the repository root.
#![no_main]

#[path = "../../tests/support/wheel_model.rs"]
mod wheel_model;

use libfuzzer_sys::fuzz_target;
use wheel_model::{Op, check};

/// Layouts the first input byte chooses between: clock at 1 ms, binary, and a tiny one.
const LAYOUTS: [&[u32]; 3] = [&[1000, 60, 60, 24, 365], &[64; 6], &[4, 3, 5]];

fuzz_target!(|data: &[u8]| {
    let Some((&layout, rest)) = data.split_first() else { return };
    let layout = LAYOUTS[usize::from(layout) % LAYOUTS.len()];
    let ops: Vec<Op> = rest.chunks_exact(9).map(decode).collect();
    check(layout, &ops);
});

/// One op from 9 bytes: a tag (operation and magnitude of the delta) and a 64-bit word.
fn decode(chunk: &[u8]) -> Op {
    let tag = chunk[0];
    let word = u64::from_le_bytes(chunk[1..9].try_into().expect("9-byte chunk"));
    let delta = match tag >> 4 {
        0..=5 => word % 8,
        6..=10 => word % 4_096,
        11..=14 => word % (1 << 40),
        _ => word,
    };
    let pick = (word >> 32) as usize;
    match tag % 5 {
        0 => Op::Insert(delta),
        1 => Op::Remove(pick),
        2 => Op::Reschedule(pick, delta),
        3 => Op::Advance(delta),
        _ => Op::AdvancePartly(delta, pick % 4),
    }
}
