//! Unit tests of the keyed entry's word and ledger (included from `keyed.rs`).

use super::*;

#[test]
fn a_later_move_needs_nothing_more_and_the_actor_sees_it() {
    let word = DeadlineWord::new(10);
    assert_eq!(word.move_to(50), Moved::Later);
    assert_eq!(word.on_due(10, None), Due::Later(50));
    assert_eq!(word.move_to(20), Moved::Earlier);
    assert_eq!(word.on_due(20, None), Due::Fire(20));
    assert_eq!(word.load(), (true, 20));
    assert_eq!(word.move_to(90), Moved::Gone);
    assert_eq!(
        word.load(),
        (true, 20),
        "a gone word keeps its last deadline"
    );
}

#[test]
fn a_held_word_fires_once_released_by_a_time_after_its_deadline() {
    let word = DeadlineWord::new(10);
    assert!(word.sending());
    assert_eq!(word.on_due(20, None), Due::Held);
    assert_eq!(
        word.on_due(20, Some(9)),
        Due::Held,
        "released only by a time at or after its deadline"
    );
    assert_eq!(word.on_due(20, Some(10)), Due::Fire(10));
    assert_eq!(word.load(), (true, 10));
}

#[test]
fn a_stripe_is_applied_past_a_mark_once_every_command_counted_before_it_is() {
    let ledger = Ledger::default();
    ledger.sending(3);
    ledger.sending(3);
    let mark = ledger.mark(3);
    ledger.sending(3);
    ledger.applied(3);
    assert!(!ledger.applied_past(3, mark));
    ledger.applied(3);
    assert!(
        ledger.applied_past(3, mark),
        "the third was counted after the mark"
    );
    assert!(ledger.applied_past(4, ledger.mark(4)));
}

#[test]
fn a_retired_word_refuses_moves() {
    let word = DeadlineWord::new(-7);
    assert_eq!(word.retire(), -7);
    assert_eq!(word.move_to(1), Moved::Gone);
    assert_eq!(word.load(), (true, -7));
}

#[test]
fn deadlines_round_trip_and_saturate() {
    for deadline in [
        0,
        1,
        -1,
        i64::from(u32::MAX),
        super::super::clock::NEVER as i64,
    ] {
        assert_eq!(DeadlineWord::new(deadline).load(), (false, deadline));
    }
    assert_eq!(DeadlineWord::new(i64::MIN).load(), (false, MIN_DEADLINE));
    assert_eq!(DeadlineWord::new(i64::MAX).load(), (false, MAX_DEADLINE));
    // Order is kept across the sign, so "later" means later.
    let word = DeadlineWord::new(-5);
    assert_eq!(word.move_to(5), Moved::Later);
    assert_eq!(word.move_to(-6), Moved::Earlier);
}

#[test]
fn a_handles_queued_command_holds_the_entry_until_the_last_is_applied() {
    let word = DeadlineWord::new(5);
    assert!(word.sending(), "live when it was sent");
    assert!(word.sending());
    assert_eq!(word.on_due(100, None), Due::Held);
    // Moves keep the hold; the first command applied lifts nothing.
    assert_eq!(word.move_to(50), Moved::Later);
    word.applied();
    assert_eq!(word.on_due(100, None), Due::Held);
    word.applied();
    assert!(word.is_quiet());
    assert_eq!(word.on_due(10, None), Due::Later(50));
    assert_eq!(word.on_due(50, None), Due::Fire(50));
    assert!(!word.sending(), "gone when it was sent");
    assert_eq!(word.load(), (true, 50));
}

#[test]
fn a_stripe_is_quiet_once_everything_counted_is_applied() {
    let ledger = Ledger::default();
    let stripe = Ledger::stripe(u64::MAX);
    assert!(ledger.is_quiet(stripe));
    ledger.sending(stripe);
    assert!(!ledger.is_quiet(stripe));
    ledger.sending_everywhere();
    ledger.applied(stripe);
    assert!(!ledger.is_quiet(stripe));
    ledger.applied_everywhere();
    assert!((0..STRIPES).all(|stripe| ledger.is_quiet(stripe)));
}
