use super::*;

const CLOCK_MS: [u32; 5] = [1000, 60, 60, 24, 365];
const BINARY: [u32; 6] = [64; 6];
const SMALL: [u32; 3] = [4, 3, 5];
const LAYOUTS: [&[u32]; 3] = [&CLOCK_MS, &BINARY, &SMALL];

/// Fires everything due by `now`, returning `(deadline, item)` in firing order.
fn fire<T>(wheel: &mut TimerWheel<T>, now: u64) -> Vec<(u64, T)> {
    let mut fired = Vec::new();
    wheel.advance(now, |e| fired.push((e.deadline, e.item)));
    fired
}

/// Asserts the entry fires exactly at `deadline`: not one tick before, and at it.
fn assert_fires_exactly_at(wheel: &mut TimerWheel<u64>, deadline: u64) {
    let before = fire(wheel, deadline - 1);
    assert!(
        before.is_empty(),
        "fired early: {before:?} before tick {deadline}"
    );
    assert_eq!(fire(wheel, deadline), vec![(deadline, deadline)]);
}

#[test]
fn deadline_at_or_before_now_is_due_at_once() {
    let mut wheel = TimerWheel::new(&CLOCK_MS).unwrap();
    fire(&mut wheel, 500);
    wheel.insert(500, "now");
    wheel.insert(3, "past");
    assert_eq!(wheel.next_expiration(), Some(500));
    let fired = fire(&mut wheel, 500);
    assert_eq!(fired, vec![(500, "now"), (3, "past")]);
}

#[test]
fn poll_behind_now_does_not_move_time_back() {
    let mut wheel = TimerWheel::new(&BINARY).unwrap();
    fire(&mut wheel, 1_000);
    wheel.insert(1_001, ());
    assert!(fire(&mut wheel, 10).is_empty());
    assert_eq!(wheel.now(), 1_000);
    assert_eq!(fire(&mut wheel, 1_001).len(), 1);
}

#[test]
fn u64_max_deadline_saturates_and_fires_only_at_the_end_of_time() {
    for layout in LAYOUTS {
        let mut wheel = TimerWheel::new(layout).unwrap();
        wheel.insert(u64::MAX, u64::MAX);
        wheel.insert(7, 7);
        assert_eq!(fire(&mut wheel, 7), vec![(7, 7)]);
        assert!(wheel.next_expiration().unwrap() > 7);
        assert_fires_exactly_at(&mut wheel, u64::MAX);
        assert!(wheel.is_empty());
        assert_eq!(wheel.next_expiration(), None);
    }
}

#[test]
fn every_level_of_every_layout_wraps_on_time() {
    for layout in LAYOUTS {
        let mut span = 1u64;
        for &slots in layout.iter() {
            span *= u64::from(slots);
            // Stand one tick before this level wraps, then cross the wrap with deadlines just
            // before, at and after it, and one a whole level-span later.
            let start = span * 3 - 1;
            for offset in [1, 2, span - 1, span, span + 1, 2 * span] {
                let mut wheel = TimerWheel::new(layout).unwrap();
                fire(&mut wheel, start);
                wheel.insert(start + offset, start + offset);
                assert_fires_exactly_at(&mut wheel, start + offset);
            }
        }
    }
}

#[test]
fn overflow_entries_re_enter_and_fire_in_order() {
    let mut wheel = TimerWheel::new(&SMALL).unwrap();
    let span = wheel.span();
    assert_eq!(span, 60);
    let deadlines = [span * 10 + 3, span + 1, span * 2, span * 500 + 59, span - 1];
    for deadline in deadlines {
        wheel.insert(deadline, deadline);
    }
    let mut expected = deadlines.to_vec();
    expected.sort_unstable();
    for deadline in expected {
        assert_fires_exactly_at(&mut wheel, deadline);
    }
}

#[test]
fn overflow_skips_empty_wraps_after_the_earliest_entry_is_removed() {
    let mut wheel = TimerWheel::new(&SMALL).unwrap();
    let first = wheel.insert(1_000, 1_000);
    wheel.insert(1_000_000, 1_000_000);
    assert_eq!(wheel.remove(first), Some(1_000));
    // Overflow is kept per top-level block: the next work is the remaining entry's block.
    assert_eq!(wheel.next_expiration(), Some(999_960));
    assert!(fire(&mut wheel, 999_999).is_empty());
    assert_eq!(fire(&mut wheel, 1_000_000), vec![(1_000_000, 1_000_000)]);
}

#[test]
fn a_tiny_layout_moves_each_far_entry_out_of_overflow_once() {
    // Two levels of two slots span four ticks: almost everything waits in overflow.
    let mut wheel = TimerWheel::new(&[2, 2]).unwrap();
    let n = 100_000u64;
    for i in 0..n {
        wheel.insert((i * 7_919) % 1_000_000 + 5, i);
    }
    let fired = fire(&mut wheel, 2_000_000);
    assert_eq!(fired.len() as u64, n);
    assert!(fired.windows(2).all(|w| w[0].0 <= w[1].0), "deadline order");
    // Out of overflow once, then at most once per level.
    assert!(
        wheel.cascades() <= 3 * n,
        "{} cascades for {n} entries",
        wheel.cascades()
    );
}

#[test]
fn removed_entries_never_fire_and_stale_keys_touch_nothing() {
    let mut wheel = TimerWheel::new(&CLOCK_MS).unwrap();
    let gone = wheel.insert(10, "gone");
    assert_eq!(wheel.remove(gone), Some("gone"));
    let reused = wheel.insert(10, "new");
    assert_eq!(gone.index, reused.index, "the slab reuses the index");
    assert_eq!(wheel.remove(gone), None);
    assert!(!wheel.reschedule(gone, 99));
    assert_eq!(wheel.get(gone), None);
    assert_eq!(fire(&mut wheel, 10), vec![(10, "new")]);
    assert_eq!(wheel.remove(reused), None, "a fired entry's key is stale");
}

#[test]
fn reschedule_moves_both_ways() {
    let mut wheel = TimerWheel::new(&CLOCK_MS).unwrap();
    let later = wheel.insert(100, 5_000_000);
    let earlier = wheel.insert(5_000_000, 100);
    assert!(wheel.reschedule(later, 5_000_000));
    assert!(wheel.reschedule(earlier, 100));
    assert_eq!(wheel.deadline(later), Some(5_000_000));
    assert_eq!(fire(&mut wheel, 4_999_999), vec![(100, 100)]);
    assert_eq!(fire(&mut wheel, 5_000_000), vec![(5_000_000, 5_000_000)]);
}

#[test]
fn rescheduling_into_the_past_makes_the_entry_due() {
    let mut wheel = TimerWheel::new(&BINARY).unwrap();
    fire(&mut wheel, 50);
    let key = wheel.insert(1_000, ());
    assert!(wheel.reschedule(key, 10));
    assert_eq!(wheel.next_expiration(), Some(50));
    assert_eq!(fire(&mut wheel, 50), vec![(10, ())]);
}

#[test]
fn next_expiration_never_scans_past_the_earliest_work() {
    let mut wheel = TimerWheel::new(&CLOCK_MS).unwrap();
    assert_eq!(wheel.next_expiration(), None);
    wheel.insert(3_600_000 * 5 + 17, ());
    // Hours level: work is due when the 5-hour slot starts, then cascades down.
    assert_eq!(wheel.next_expiration(), Some(3_600_000 * 5));
    assert!(fire(&mut wheel, 3_600_000 * 5).is_empty());
    assert_eq!(wheel.next_expiration(), Some(3_600_000 * 5 + 17));
    assert!(wheel.cascades() >= 1);
}

#[test]
fn entries_cascade_at_most_once_per_level() {
    let mut wheel = TimerWheel::new(&CLOCK_MS).unwrap();
    let n = 1_000u64;
    for i in 0..n {
        wheel.insert(86_400_000 * 3 + i * 7_919, i);
    }
    let fired = fire(&mut wheel, u64::MAX / 2);
    assert_eq!(fired.len() as u64, n);
    assert!(wheel.cascades() <= n * 4, "{} cascades", wheel.cascades());
}

#[test]
fn drain_empties_the_wheel_and_keeps_the_tick() {
    let mut wheel = TimerWheel::new(&SMALL).unwrap();
    fire(&mut wheel, 5);
    for deadline in [1, 6, 50, 10_000] {
        wheel.insert(deadline, deadline);
    }
    let mut drained: Vec<u64> = wheel.drain().map(|(_, item)| item).collect();
    drained.sort_unstable();
    assert_eq!(drained, [1, 6, 50, 10_000]);
    assert!(wheel.is_empty());
    assert_eq!(wheel.next_expiration(), None);
    assert_eq!(wheel.now(), 5);
    wheel.insert(7, 7);
    assert_fires_exactly_at(&mut wheel, 7);
}

#[test]
fn a_million_live_entries_fire_in_deadline_order() {
    let mut wheel = TimerWheel::with_capacity(&CLOCK_MS, 1_000_000).unwrap();
    // A multiplicative hash spreads deadlines over ~11 days without an RNG.
    let deadline_of = |i: u64| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 44) + 1;
    for i in 0..1_000_000u64 {
        wheel.insert(deadline_of(i), i);
    }
    assert_eq!(wheel.len(), 1_000_000);
    let mut last = 0;
    let mut count = 0u64;
    wheel.advance(u64::MAX, |e| {
        assert!(e.deadline >= last, "out of order");
        assert_eq!(e.deadline, deadline_of(e.item));
        last = e.deadline;
        count += 1;
    });
    assert_eq!(count, 1_000_000);
    assert!(wheel.is_empty());
}
