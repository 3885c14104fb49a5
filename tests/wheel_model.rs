//! Property tests: random operation sequences against a `BTreeMap` model, per layout.

mod support;

use proptest::prelude::*;
use support::wheel_model::{Op, check};

fn delta(span: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0..8u64,
        4 => 0..2_000u64,
        4 => 0..span.saturating_mul(3),
        1 => any::<u64>(),
        1 => Just(u64::MAX),
    ]
}

fn ops(span: u64) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        5 => delta(span).prop_map(Op::Insert),
        2 => any::<usize>().prop_map(Op::Remove),
        2 => (any::<usize>(), delta(span)).prop_map(|(pick, d)| Op::Reschedule(pick, d)),
        2 => delta(span).prop_map(Op::Advance),
        1 => (delta(span), 0..4usize).prop_map(|(d, limit)| Op::AdvancePartly(d, limit)),
    ];
    prop::collection::vec(op, 0..120)
}

fn span(layout: &[u32]) -> u64 {
    layout.iter().map(|&slots| u64::from(slots)).product()
}

const CLOCK_MS: [u32; 5] = [1000, 60, 60, 24, 365];
const BINARY: [u32; 6] = [64; 6];
/// Tiny levels make every wrap and the overflow list common.
const TINY: [u32; 3] = [4, 3, 5];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn clock_layout_matches_model(ops in ops(span(&CLOCK_MS))) {
        check(&CLOCK_MS, &ops);
    }

    #[test]
    fn binary_layout_matches_model(ops in ops(span(&BINARY))) {
        check(&BINARY, &ops);
    }

    #[test]
    fn tiny_layout_matches_model(ops in ops(span(&TINY))) {
        check(&TINY, &ops);
    }
}
