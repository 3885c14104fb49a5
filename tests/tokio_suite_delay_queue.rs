//! tokio-util's own `DelayQueue` suite, ported: an adaptation of
//! `tokio-util/tests/time_delay_queue.rs` from tokio-util 0.7.20, translated test by test to
//! the wheel's keyed timers, keeping upstream's names, timing and assertions wherever the API
//! is the same.
//!
//! | class | count | tests |
//! |---|---|---|
//! | (a) strict | 12 | `multi_delay_at_start`, `reset_much_later`, `reset_twice`, `remove_expired_item`, `expires_before_last_insert`, `expire_first_key_when_reset_to_expire_earlier`, `expire_second_key_when_reset_to_expire_earlier`, `reset_first_expiring_item_to_expire_later`, `insert_before_first_after_poll`, `insert_after_ready_poll`, `reset_inserted_expired`, `item_expiry_greater_than_wheel` |
//! | (b) adapted: end of stream | 8 | `single_immediate_delay`, `multi_immediate_delays`, `single_short_delay`, `remove_entry`, `reset_entry`, `repeatedly_reset_entry_inserted_as_expired`, `multi_reset`, `delay_queue_poll_expired_when_empty`: timing and every other assertion as upstream; `DelayQueue` answers `Ready(None)` whenever it is empty, our stream ends once its `Timers` are dropped (API.md §3), see `assert_ends` |
//! | (b) adapted: no wake when emptied | 2 | `wake_after_remove_last`, `wake_after_clear`: `DelayQueue` wakes its task to answer `Ready(None)` once emptied; ours stays open (and quiet) while the `Timers` live, and wakes its task when they go |
//! | (b) adapted: one actor turn | 3 | `insert_in_past_fires_immediately`, `insert_in_past_after_poll_fires_immediately`, `reset_to_past_wakes_pending_queue` (also ends as the row above): an entry set or moved into the past is delivered on the set's actor's next turn — after the caller yields once, no time passing — not inside the call (`DelayQueue` runs its wheel inside the consumer's poll; our set's actor is its own task). The port adds that one `yield_now` and keeps every assertion |
//! | (b) adapted: no spurious wake | 2 | `reset_later_after_slot_starts`, `reset_earlier_after_slot_starts`: upstream asserts a wake that its own comment explains as its wheel's (the consumer must advance the queue's wheel); ours is advanced by the actor, so the port asserts no wake there, and the rest as upstream |
//! | (b) adapted: buffered expirations | 1 | `remove_at_timer_wheel_threshold`: both entries fire at 64 ms and are buffered (API.md §3), so the second is read from the stream rather than removed (`take` answers `None`: it fired) |
//! | (c) not applicable | 8 | `compact_expire_empty`, `compact_remove_empty`, `compact_remove_remapped_keys`, `compact_change_deadline` (no `compact`/`capacity`: a set gives its memory back by itself once idle, and keys are the caller's, never remapped); `remove_after_compact`, `remove_after_compact_poll` (a panic on a stale key after `compact`: no `compact`, and `take` of an unknown key answers `None`); `peek`, `peek_entries_sharing_a_wheel_slot` (no `peek`: the entries live in the set's actor) |
//!
//! 36 upstream tests: 12 strict, 16 adapted, 8 not applicable. This file has the first
//! half; `tokio_suite_delay_queue_resets.rs` the rest (split to keep files short).
//!
//! How the API maps (`support/delay_queue.rs`): `DelayQueue::new()` → `wheel.keyed()`, whose
//! `Timers` inserts (wrapped in `Queue`, which picks a fresh key per insert, as `DelayQueue`
//! hands out a fresh `Key`) and whose `Expirations` stream is the queue polled by the test task
//! (`poll_expired` → `poll_next`); `remove(&key)` → `take` (the value, as
//! `Expired::into_inner`); `len()` → `len().await`; `clear()` → `drain().await`;
//! `Expired::get_ref`/`into_inner` → `value`/`into_parts`. Time is driven by tokio's own
//! `sleep`, as upstream does. `tokio_test` is replaced by `support/mock_task.rs`.
//!
//! Every test runs twice with the same body, and the classes above hold for both: `name` names
//! entries by key (`set_at`, `reset_at(&key, ..)`, `take(&key)`), `name::via_handles` through
//! the `KeyedTimer` each `insert_at` returns (`handle.reset_at`, `handle.take()`: a later
//! deadline is then one atomic store, filed again by the actor when the old tick comes).

#[path = "support/mock_task.rs"]
#[macro_use]
mod mock_task;
#[path = "support/delay_queue.rs"]
#[macro_use]
mod delay_queue_port;

use delay_queue_port::{Mode, assert_ends, delay_queue, ms};
use tokio::time::{self, Instant, sleep};

both! {
    #[tokio::test]
    async fn single_immediate_delay(mode) {
        time::pause();

        let (mut timers, mut queue) = delay_queue(mode);
        let _key = timers.insert_at("foo", Instant::now());

        // Advance time by 1ms to handle thee rounding
        sleep(ms(1)).await;

        assert_ready_some!(poll!(queue));

        assert_ends(timers, &mut queue).await;
    }
}

both! {
    #[tokio::test]
    async fn multi_immediate_delays(mode) {
        time::pause();

        let (mut timers, mut queue) = delay_queue(mode);

        let _k = timers.insert_at("1", Instant::now());
        let _k = timers.insert_at("2", Instant::now());
        let _k = timers.insert_at("3", Instant::now());

        sleep(ms(1)).await;

        let mut res = vec![];

        while res.len() < 3 {
            let entry = assert_ready_some!(poll!(queue));
            res.push(entry.into_parts().1);
        }

        assert_ends(timers, &mut queue).await;

        res.sort_unstable();

        assert_eq!("1", res[0]);
        assert_eq!("2", res[1]);
        assert_eq!("3", res[2]);
    }
}

both! {
    #[tokio::test]
    async fn single_short_delay(mode) {
        time::pause();

        let (mut timers, mut queue) = delay_queue(mode);
        let _key = timers.insert_at("foo", Instant::now() + ms(5));

        assert_pending!(poll!(queue));

        sleep(ms(1)).await;

        assert!(!queue.is_woken());

        sleep(ms(5)).await;

        assert!(queue.is_woken());

        let entry = assert_ready_some!(poll!(queue));
        assert_eq!(*entry.value(), "foo");

        assert_ends(timers, &mut queue).await;
    }
}

both! {
    #[tokio::test]
    async fn multi_delay_at_start(mode) {
        time::pause();

        let long = 262_144 + 9 * 4096;
        let delays = &[1000, 2, 234, long, 60, 10];

        let (mut timers, mut queue) = delay_queue(mode);

        // Setup the delays
        for &i in delays {
            let _key = timers.insert_at(i, Instant::now() + ms(i));
        }

        assert_pending!(poll!(queue));
        assert!(!queue.is_woken());

        let start = Instant::now();
        for elapsed in 0..1200 {
            let elapsed = elapsed + 1;
            tokio::time::sleep_until(start + ms(elapsed)).await;

            if delays.contains(&elapsed) {
                assert!(queue.is_woken(), "elapsed={elapsed}");
                assert_ready!(poll!(queue));
                assert_pending!(poll!(queue));
            } else if queue.is_woken() {
                let cascade = &[192, 960];
                assert!(
                    cascade.contains(&elapsed),
                    "elapsed={} dt={:?}",
                    elapsed,
                    Instant::now() - start
                );

                assert_pending!(poll!(queue));
            }
        }
    }
}

both! {
    #[tokio::test]
    async fn insert_in_past_fires_immediately(mode) {
        time::pause();

        let (mut timers, mut queue) = delay_queue(mode);
        let now = Instant::now();

        sleep(ms(10)).await;

        timers.insert_at("foo", now);

        // Adapted: the set's actor applies commands on its own task, so an entry set (or moved)
        // into the past is delivered on its next turn — after this task yields once, with no
        // time passing — not inside the call, as `DelayQueue` (which runs its wheel inside the
        // caller's poll) does.
        tokio::task::yield_now().await;

        assert_ready!(poll!(queue));
    }
}

both! {
    #[tokio::test]
    async fn remove_entry(mode) {
        time::pause();

        let (mut timers, mut queue) = delay_queue(mode);

        let key = timers.insert_at("foo", Instant::now() + ms(5));

        assert_pending!(poll!(queue));

        let entry = timers.remove(&key).await;
        assert_eq!(entry, "foo");

        sleep(ms(10)).await;

        assert_ends(timers, &mut queue).await;
    }
}

both! {
    #[tokio::test]
    async fn reset_entry(mode) {
        time::pause();

        let (mut timers, mut queue) = delay_queue(mode);

        let now = Instant::now();
        let key = timers.insert_at("foo", now + ms(5));

        assert_pending!(poll!(queue));
        sleep(ms(1)).await;

        timers.reset_at(&key, now + ms(10));

        assert_pending!(poll!(queue));

        sleep(ms(7)).await;

        assert!(!queue.is_woken());

        assert_pending!(poll!(queue));

        sleep(ms(3)).await;

        assert!(queue.is_woken());

        let entry = assert_ready_some!(poll!(queue));
        assert_eq!(*entry.value(), "foo");

        assert_ends(timers, &mut queue).await;
    }
}

both! {
    #[tokio::test]
    async fn reset_to_past_wakes_pending_queue(mode) {
        time::pause();

        let (mut timers, mut queue) = delay_queue(mode);
        let key = timers.insert("foo", ms(10_000));

        assert_pending!(poll!(queue));
        assert!(!queue.is_woken());

        timers.reset_at(&key, Instant::now() - ms(100));

        // Adapted: the set's actor applies commands on its own task, so an entry set (or moved)
        // into the past is delivered on its next turn — after this task yields once, with no
        // time passing — not inside the call, as `DelayQueue` (which runs its wheel inside the
        // caller's poll) does.
        tokio::task::yield_now().await;

        assert!(queue.is_woken());

        let entry = assert_ready_some!(poll!(queue));
        assert_eq!(*entry.value(), "foo");

        assert_ends(timers, &mut queue).await;
    }
}

// Reproduces tokio-rs/tokio#849.
both! {
    #[tokio::test]
    async fn reset_much_later(mode) {
        time::pause();

        let (mut timers, mut queue) = delay_queue(mode);

        let now = Instant::now();
        sleep(ms(1)).await;

        let key = timers.insert_at("foo", now + ms(200));
        assert_pending!(poll!(queue));

        sleep(ms(3)).await;

        timers.reset_at(&key, now + ms(10));

        sleep(ms(20)).await;

        assert!(queue.is_woken());
    }
}

// Reproduces tokio-rs/tokio#849.
both! {
    #[tokio::test]
    async fn reset_twice(mode) {
        time::pause();

        let (mut timers, mut queue) = delay_queue(mode);
        let now = Instant::now();

        sleep(ms(1)).await;

        let key = timers.insert_at("foo", now + ms(200));

        assert_pending!(poll!(queue));

        sleep(ms(3)).await;

        timers.reset_at(&key, now + ms(50));

        sleep(ms(20)).await;

        timers.reset_at(&key, now + ms(40));

        sleep(ms(20)).await;

        assert!(queue.is_woken());
    }
}

both! {
    /// Regression test: Given an entry inserted with a deadline in the past, so
    /// that it is placed directly on the expired queue, reset the entry to a
    /// deadline in the future. Validate that this leaves the entry and queue in an
    /// internally consistent state by running an additional reset on the entry
    /// before polling it to completion.
    #[tokio::test]
    async fn repeatedly_reset_entry_inserted_as_expired(mode) {
        time::pause();

        // Instants before the start of the test seem to break in wasm.
        time::sleep(ms(1000)).await;

        let (mut timers, mut queue) = delay_queue(mode);
        let now = Instant::now();

        let key = timers.insert_at("foo", now - ms(100));

        timers.reset_at(&key, now + ms(100));
        timers.reset_at(&key, now + ms(50));

        assert_pending!(poll!(queue));

        time::sleep_until(now + ms(60)).await;

        assert!(queue.is_woken());

        let entry = assert_ready_some!(poll!(queue)).into_parts().1;
        assert_eq!(entry, "foo");

        assert_ends(timers, &mut queue).await;
    }
}

both! {
    #[tokio::test]
    async fn remove_expired_item(mode) {
        time::pause();

        let (mut timers, _queue) = delay_queue(mode);

        let now = Instant::now();

        sleep(ms(10)).await;

        let key = timers.insert_at("foo", now);

        let entry = timers.remove(&key).await;
        assert_eq!(entry, "foo");
    }
}

both! {
    /// Regression test: it should be possible to remove entries which fall in the
    /// 0th slot of the internal timer wheel — that is, entries whose expiration
    /// (a) falls at the beginning of one of the wheel's hierarchical levels and (b)
    /// is equal to the wheel's current elapsed time.
    #[tokio::test]
    async fn remove_at_timer_wheel_threshold(mode) {
        time::pause();

        let (mut timers, mut queue) = delay_queue(mode);

        let now = Instant::now();

        let key1 = timers.insert_at("foo", now + ms(64));
        let key2 = timers.insert_at("bar", now + ms(64));

        sleep(ms(80)).await;

        let entry = assert_ready_some!(poll!(queue)).into_parts().1;

        // Adapted: expirations are buffered (API.md §3): both entries fired at 64 ms, so the
        // other one is no longer removable (`take` answers `None`, "Some iff removed before it
        // fired") and is the stream's next item instead. `DelayQueue` hands expired entries out
        // one poll at a time and can still remove the second.
        let (other, value) = match entry {
            "foo" => (key2, "bar"),
            "bar" => (key1, "foo"),
            other => panic!("other: {other:?}"),
        };
        assert_eq!(timers.take(&other).await, None);
        assert_eq!(
            assert_ready_some!(poll!(queue)).into_parts(),
            (other, value)
        );
    }
}
