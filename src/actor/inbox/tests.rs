//! Unit tests of the inbox (included from `inbox.rs`).

use super::*;
use crate::timer::pool::Pool;

/// Test commands are numbers; 0 is the placeholder.
macro_rules! numbers_have_a_placeholder {
    ($($number:ty),*) => {$(
        impl Placeholder for $number {
            fn placeholder() -> Self {
                0
            }
            fn is_placeholder(&self) -> bool {
                *self == 0
            }
        }
    )*};
}
numbers_have_a_placeholder!(i32, u32);

#[test]
fn placeholders_left_before_a_withdrawn_last_command_go_with_it() {
    let inbox = Inbox::new(1);
    let pool = Pool::default();
    let file = |inbox: &Inbox<i32>| {
        inbox
            .send_with_slot(0, &pool, Urgency::Now, |index, _| index as i32 + 100)
            .unwrap()
    };
    let (a, at_a) = file(&inbox);
    let (b, at_b) = file(&inbox);
    let (c, at_c) = file(&inbox);
    assert!(inbox.withdraw_or_send(0, at_a, |&x| x == a as i32 + 100, a, || 9));
    assert!(inbox.withdraw_or_send(0, at_b, |&x| x == b as i32 + 100, b, || 9));
    let mut batch = VecDeque::new();
    assert!(inbox.withdraw_or_send(0, at_c, |&x| x == c as i32 + 100, c, || 9));
    assert_eq!(
        inbox.take_all(&mut batch, &mut []),
        0,
        "nothing left behind"
    );
}

#[test]
fn take_all_moves_everything_in_order_per_shard() {
    let inbox = Inbox::new(2);
    for i in 0..3 {
        inbox.send(0, i, Urgency::Now).unwrap();
        inbox.send(1, 10 + i, Urgency::Now).unwrap();
    }
    let mut batch = VecDeque::new();
    assert_eq!(inbox.take_all(&mut batch, &mut []), 6);
    assert_eq!(batch, [0, 1, 2, 10, 11, 12]);
    batch.clear();
    assert_eq!(inbox.take_all(&mut batch, &mut []), 0);
}

#[test]
fn a_stopped_inbox_refuses_and_hands_back_the_rest() {
    let inbox = Inbox::new(1);
    inbox.send(0, 1, Urgency::Now).unwrap();
    let mut rest = VecDeque::new();
    inbox.stop(&mut rest);
    assert_eq!(rest, [1]);
    assert_eq!(inbox.send(0, 2, Urgency::Now), Err(2));
    let pool = Pool::default();
    assert_eq!(inbox.send_with_slot(0, &pool, Urgency::Now, |_, _| 3), None);
    assert!(!inbox.withdraw_or_send(0, 0, |_| true, 0, || 5));
}

#[test]
fn slots_come_from_the_shard_and_go_back_to_it() {
    let inbox = Inbox::new(2);
    let pool = Pool::default();
    let (a, _) = inbox
        .send_with_slot(1, &pool, Urgency::Now, |index, _| index)
        .unwrap();
    let (b, position) = inbox
        .send_with_slot(1, &pool, Urgency::Now, |index, _| index)
        .unwrap();
    assert_eq!((a, b, position), (0, 1, 1));
    let mut batch = VecDeque::new();
    let mut freed = vec![Vec::new(), vec![a, b]];
    inbox.take_all(&mut batch, &mut freed);
    assert!(freed[1].is_empty());
    assert_eq!(
        inbox.send_with_slot(1, &pool, Urgency::Now, |index, _| index),
        Some((b, 0))
    );
    // One slot is still held: its segment stays.
    assert!(inbox.release_segments(&pool, &mut freed, 0).is_empty());
    let mut freed = vec![Vec::new(), vec![b]];
    assert_eq!(
        inbox.release_segments(&pool, &mut freed, 0),
        vec![(0..1024)]
    );
    assert_eq!(pool.capacity(), 0);
    assert_eq!(
        inbox.send_with_slot(0, &pool, Urgency::Now, |index, _| index),
        Some((0, 0))
    );
}

#[test]
fn a_held_slot_keeps_only_its_own_segment_and_new_slots_come_from_the_lowest() {
    let inbox = Inbox::new(2);
    let pool = Pool::default();
    // Segments 0, 1 and 2 (7168 slots), all taken through shard 0.
    let taken: Vec<u32> = (0..7168)
        .map(|_| {
            inbox
                .send_with_slot(0, &pool, Urgency::Now, |index, _| index)
                .unwrap()
                .0
        })
        .collect();
    assert_eq!(pool.capacity(), 7168);
    let mut batch = VecDeque::new();
    inbox.take_all(&mut batch, &mut []);
    // Everything comes back (in no useful order) but slot 5000, in segment 2, and slot
    // 10, in segment 0, which is kept anyway.
    let mut freed = vec![Vec::new(), Vec::new()];
    for &index in taken.iter().rev().filter(|&&i| i != 5000 && i != 10) {
        freed[(index % 2) as usize].push(index);
    }
    let released = inbox.release_segments(&pool, &mut freed, 1);
    assert_eq!(released, vec![(1024..3072)], "segment 2 holds slot 5000");
    assert_eq!(pool.capacity(), 1024 + 4096);
    assert_eq!(pool.get(5000).word.deadline(), 0);
    // Lowest segment first: shard 0 hands out segment 0's slots before segment 2's.
    let first = inbox
        .send_with_slot(0, &pool, Urgency::Now, |index, _| index)
        .unwrap()
        .0;
    assert!(first < 1024, "{first} is not in segment 0");
    // Slot 5000 and `first` come back: every segment but the kept one goes.
    let mut freed = vec![vec![5000, first], Vec::new()];
    assert_eq!(
        inbox.release_segments(&pool, &mut freed, 1),
        vec![(3072..7168)]
    );
    assert_eq!(pool.capacity(), 1024);
    inbox.take_all(&mut batch, &mut []);
    // The free lists hold segment 0's slots only (10 is still out), about half each.
    let mut indices = std::collections::HashSet::new();
    for i in 0..800 {
        let (index, _) = inbox
            .send_with_slot(i % 2, &pool, Urgency::Now, |index, _| index)
            .unwrap();
        assert!(index < 1024 && index != 10 && indices.insert(index));
    }
    assert_eq!(pool.capacity(), 1024, "no segment was needed");
}

#[test]
fn a_command_not_yet_taken_can_be_withdrawn() {
    let inbox = Inbox::new(1);
    let pool = Pool::default();
    let (slot, position) = inbox
        .send_with_slot(0, &pool, Urgency::Now, |index, _| index + 100)
        .unwrap();
    inbox.send(0, 7, Urgency::Now).unwrap();
    assert!(inbox.withdraw_or_send(0, position, |&c| c == slot + 100, slot, || 9));
    let mut batch = VecDeque::new();
    inbox.take_all(&mut batch, &mut []);
    assert_eq!(batch, [0, 7], "replaced in place");
    let (tail, position) = inbox
        .send_with_slot(0, &pool, Urgency::Now, |index, _| index + 100)
        .unwrap();
    assert!(inbox.withdraw_or_send(0, position, |&c| c == tail + 100, tail, || 9));
    assert_eq!(
        inbox.take_all(&mut batch, &mut []),
        0,
        "the last one is taken back"
    );
    batch.clear();
    assert!(
        !inbox.withdraw_or_send(0, position, |_| true, slot, || 9),
        "taken already: sent instead"
    );
    batch.clear();
    inbox.take_all(&mut batch, &mut []);
    assert_eq!(batch, [9]);
    assert_eq!(
        inbox.send_with_slot(0, &pool, Urgency::Now, |index, _| index),
        Some((slot, 0)),
        "the withdrawn slot went straight back to the shard"
    );
}

#[test]
fn a_send_wakes_the_actor_only_when_it_would_look_too_late() {
    let inbox = Inbox::new(1);
    let mut batch = VecDeque::new();
    // The actor looks again at offset 1000, within the lazy bound of now (900).
    inbox.publish_next_look(Some(1_000), 900);
    inbox.send(0, 1, Urgency::By(5_000)).unwrap();
    inbox.send(0, 2, Urgency::Lazy).unwrap();
    assert!(!inbox.state_notified(0), "it looks by then anyway");
    inbox.send(0, 3, Urgency::By(999)).unwrap();
    assert!(inbox.state_notified(0), "earlier than its next look");
    inbox.take_all(&mut batch, &mut []);
    assert!(!inbox.state_notified(0), "taking clears it");
    // Far from now: lazy commands notify, once.
    inbox.publish_next_look(None, 0);
    inbox.send(0, 4, Urgency::Lazy).unwrap();
    assert!(inbox.state_notified(0));
    inbox.take_all(&mut batch, &mut []);
    inbox.send(0, 5, Urgency::Now).unwrap();
    assert!(inbox.state_notified(0), "a question always notifies");
    assert!(inbox.has_pending());
    inbox.take_all(&mut batch, &mut []);
    assert!(!inbox.has_pending());
}

#[tokio::test]
async fn the_first_send_into_an_empty_shard_wakes_the_actor() {
    let inbox = std::sync::Arc::new(Inbox::new(1));
    let waiter = tokio::spawn({
        let inbox = inbox.clone();
        async move {
            inbox.wait().await;
            let mut batch = VecDeque::new();
            inbox.take_all(&mut batch, &mut []);
            batch
        }
    });
    tokio::task::yield_now().await;
    inbox.send(0, 7, Urgency::Now).unwrap();
    assert_eq!(waiter.await.unwrap(), [7]);
}

#[test]
fn close_is_seen() {
    let inbox = Inbox::<u8>::new(1);
    assert!(!inbox.senders_gone());
    inbox.close();
    assert!(inbox.senders_gone());
}
