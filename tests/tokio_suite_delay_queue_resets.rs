//! tokio-util's own `DelayQueue` suite, ported (second half: resets and late inserts; the
//! first half and the table of every test's class are in `tokio_suite_delay_queue.rs`): an
//! adaptation of
//! `tokio-util/tests/time_delay_queue.rs` from tokio-util 0.7.20, translated test by test to
//! the wheel's keyed timers, keeping upstream's names, timing and assertions wherever the API
//! is the same.
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
use tokio::time::{self, Duration, Instant, sleep, sleep_until};

both! {
    #[tokio::test]
    async fn expires_before_last_insert(mode) {
        time::pause();

        let (mut timers, mut queue) = delay_queue(mode);

        let now = Instant::now();

        timers.insert_at("foo", now + ms(10_000));

        // Delay should be set to 8.192s here.
        assert_pending!(poll!(queue));

        // Delay should be set to the delay of the new item here
        timers.insert_at("bar", now + ms(600));

        assert_pending!(poll!(queue));

        sleep(ms(600)).await;

        assert!(queue.is_woken());

        let entry = assert_ready_some!(poll!(queue)).into_parts().1;
        assert_eq!(entry, "bar");
    }
}

both! {
    #[tokio::test]
    async fn multi_reset(mode) {
        time::pause();

        let (mut timers, mut queue) = delay_queue(mode);

        let now = Instant::now();

        let one = timers.insert_at("one", now + ms(200));
        let two = timers.insert_at("two", now + ms(250));

        assert_pending!(poll!(queue));

        timers.reset_at(&one, now + ms(300));
        timers.reset_at(&two, now + ms(350));
        timers.reset_at(&one, now + ms(400));

        sleep(ms(310)).await;

        assert_pending!(poll!(queue));

        sleep(ms(50)).await;

        let entry = assert_ready_some!(poll!(queue));
        assert_eq!(*entry.value(), "two");

        assert_pending!(poll!(queue));

        sleep(ms(50)).await;

        let entry = assert_ready_some!(poll!(queue));
        assert_eq!(*entry.value(), "one");

        assert_ends(timers, &mut queue).await;
    }
}

both! {
    #[tokio::test]
    async fn expire_first_key_when_reset_to_expire_earlier(mode) {
        time::pause();

        let (mut timers, mut queue) = delay_queue(mode);

        let now = Instant::now();

        let one = timers.insert_at("one", now + ms(200));
        timers.insert_at("two", now + ms(250));

        assert_pending!(poll!(queue));

        timers.reset_at(&one, now + ms(100));

        sleep(ms(100)).await;

        assert!(queue.is_woken());

        let entry = assert_ready_some!(poll!(queue)).into_parts().1;
        assert_eq!(entry, "one");
    }
}

both! {
    #[tokio::test]
    async fn expire_second_key_when_reset_to_expire_earlier(mode) {
        time::pause();

        let (mut timers, mut queue) = delay_queue(mode);

        let now = Instant::now();

        timers.insert_at("one", now + ms(200));
        let two = timers.insert_at("two", now + ms(250));

        assert_pending!(poll!(queue));

        timers.reset_at(&two, now + ms(100));

        sleep(ms(100)).await;

        assert!(queue.is_woken());

        let entry = assert_ready_some!(poll!(queue)).into_parts().1;
        assert_eq!(entry, "two");
    }
}

both! {
    #[tokio::test]
    async fn reset_first_expiring_item_to_expire_later(mode) {
        time::pause();

        let (mut timers, mut queue) = delay_queue(mode);

        let now = Instant::now();

        let one = timers.insert_at("one", now + ms(200));
        let _two = timers.insert_at("two", now + ms(250));

        assert_pending!(poll!(queue));

        timers.reset_at(&one, now + ms(300));
        sleep(ms(250)).await;

        assert!(queue.is_woken());

        let entry = assert_ready_some!(poll!(queue)).into_parts().1;
        assert_eq!(entry, "two");
    }
}

both! {
    #[tokio::test]
    async fn insert_before_first_after_poll(mode) {
        time::pause();

        let (mut timers, mut queue) = delay_queue(mode);

        let now = Instant::now();

        let _one = timers.insert_at("one", now + ms(200));

        assert_pending!(poll!(queue));

        let _two = timers.insert_at("two", now + ms(100));

        sleep(ms(99)).await;

        assert_pending!(poll!(queue));

        sleep(ms(1)).await;

        assert!(queue.is_woken());

        let entry = assert_ready_some!(poll!(queue)).into_parts().1;
        assert_eq!(entry, "two");
    }
}

both! {
    #[tokio::test]
    async fn insert_after_ready_poll(mode) {
        time::pause();

        let (mut timers, mut queue) = delay_queue(mode);

        let now = Instant::now();

        timers.insert_at("1", now + ms(100));
        timers.insert_at("2", now + ms(100));
        timers.insert_at("3", now + ms(100));

        assert_pending!(poll!(queue));

        sleep(ms(100)).await;

        assert!(queue.is_woken());

        let mut res = vec![];

        while res.len() < 3 {
            let entry = assert_ready_some!(poll!(queue));
            res.push(entry.into_parts().1);
            timers.insert_at("foo", now + ms(500));
        }

        res.sort_unstable();

        assert_eq!("1", res[0]);
        assert_eq!("2", res[1]);
        assert_eq!("3", res[2]);
    }
}

both! {
    #[tokio::test]
    async fn reset_later_after_slot_starts(mode) {
        time::pause();

        let (mut timers, mut queue) = delay_queue(mode);

        let now = Instant::now();

        let foo = timers.insert_at("foo", now + ms(100));

        assert_pending!(poll!(queue));

        sleep_until(now + Duration::from_millis(80)).await;

        assert!(!queue.is_woken());

        // At this point the queue hasn't been polled, so `elapsed` on the wheel
        // for the queue is still at 0 and hence the 1ms resolution slots cover
        // [0-64).  Resetting the time on the entry to 120 causes it to get put in
        // the [64-128) slot.  As the queue knows that the first entry is within
        // that slot, but doesn't know when, it must wake immediately to advance
        // the wheel.
        timers.reset_at(&foo, now + ms(120));
        // Adapted: upstream's wake here is its wheel's own (the comment above): the consumer must
        // advance the queue's wheel itself. Ours is advanced by the set's actor, so the consumer
        // has nothing to wake for until the entry fires.
        tokio::task::yield_now().await;
        assert!(!queue.is_woken());

        assert_pending!(poll!(queue));

        sleep_until(now + Duration::from_millis(119)).await;
        assert!(!queue.is_woken());

        sleep(ms(1)).await;
        assert!(queue.is_woken());

        let entry = assert_ready_some!(poll!(queue)).into_parts().1;
        assert_eq!(entry, "foo");
    }
}

both! {
    #[tokio::test]
    async fn reset_inserted_expired(mode) {
        time::pause();

        // Instants before the start of the test seem to break in wasm.
        time::sleep(ms(1000)).await;

        let (mut timers, mut queue) = delay_queue(mode);
        let now = Instant::now();

        let key = timers.insert_at("foo", now - ms(100));

        // this causes the panic described in #2473
        timers.reset_at(&key, now + ms(100));

        assert_eq!(1, timers.len().await);

        sleep(ms(200)).await;

        let entry = assert_ready_some!(poll!(queue)).into_parts().1;
        assert_eq!(entry, "foo");

        assert_eq!(timers.len().await, 0);
    }
}

both! {
    #[tokio::test]
    async fn reset_earlier_after_slot_starts(mode) {
        time::pause();

        let (mut timers, mut queue) = delay_queue(mode);

        let now = Instant::now();

        let foo = timers.insert_at("foo", now + ms(200));

        assert_pending!(poll!(queue));

        sleep_until(now + Duration::from_millis(80)).await;

        assert!(!queue.is_woken());

        // At this point the queue hasn't been polled, so `elapsed` on the wheel
        // for the queue is still at 0 and hence the 1ms resolution slots cover
        // [0-64).  Resetting the time on the entry to 120 causes it to get put in
        // the [64-128) slot.  As the queue knows that the first entry is within
        // that slot, but doesn't know when, it must wake immediately to advance
        // the wheel.
        timers.reset_at(&foo, now + ms(120));
        // Adapted: upstream's wake here is its wheel's own (the comment above): the consumer must
        // advance the queue's wheel itself. Ours is advanced by the set's actor, so the consumer
        // has nothing to wake for until the entry fires.
        tokio::task::yield_now().await;
        assert!(!queue.is_woken());

        assert_pending!(poll!(queue));

        sleep_until(now + Duration::from_millis(119)).await;
        assert!(!queue.is_woken());

        sleep(ms(1)).await;
        assert!(queue.is_woken());

        let entry = assert_ready_some!(poll!(queue)).into_parts().1;
        assert_eq!(entry, "foo");
    }
}

both! {
    #[tokio::test]
    async fn insert_in_past_after_poll_fires_immediately(mode) {
        time::pause();

        let (mut timers, mut queue) = delay_queue(mode);

        let now = Instant::now();

        timers.insert_at("foo", now + ms(200));

        assert_pending!(poll!(queue));

        sleep(ms(80)).await;

        assert!(!queue.is_woken());
        timers.insert_at("bar", now + ms(40));

        // Adapted: the set's actor applies commands on its own task, so an entry set (or moved)
        // into the past is delivered on its next turn — after this task yields once, with no
        // time passing — not inside the call, as `DelayQueue` (which runs its wheel inside the
        // caller's poll) does.
        tokio::task::yield_now().await;

        assert!(queue.is_woken());

        let entry = assert_ready_some!(poll!(queue)).into_parts().1;
        assert_eq!(entry, "bar");
    }
}

both! {
    #[tokio::test]
    async fn delay_queue_poll_expired_when_empty(mode) {
        let (mut timers, mut delay_queue) = delay_queue(mode);
        let key = timers.insert(0, std::time::Duration::from_secs(10));
        assert_pending!(poll!(delay_queue));

        timers.remove(&key).await;
        assert_ends(timers, &mut delay_queue).await;
    }
}

both! {
    #[tokio::test(start_paused = true)]
    async fn item_expiry_greater_than_wheel(mode) {
        use futures::StreamExt;
        // This function tests that a delay queue that has existed for at least 2^36 milliseconds won't panic when a new item is inserted.
        let (mut timers, mut queue) = delay_queue(mode);
        let queue = &mut *queue;
        for _ in 0..2 {
            tokio::time::advance(Duration::from_millis(1 << 35)).await;
            timers.insert(0, Duration::from_millis(0));
            queue.next().await;
        }
        // This should not panic
        let no_panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            timers.insert(1, Duration::from_millis(1));
        }));
        assert!(no_panic.is_ok());
    }
}

both! {
    #[tokio::test(start_paused = true)]
    async fn wake_after_remove_last(mode) {
        let (mut timers, mut queue) = delay_queue(mode);
        let key = timers.insert("foo", ms(1000));

        assert_pending!(poll!(queue));

        timers.remove(&key).await;

        // Adapted: `DelayQueue` wakes its task because, empty, it now answers `Ready(None)`; ours
        // stays open while the `Timers` live (see `assert_ends`), so the wake comes when they go.
        assert!(!queue.is_woken());
        assert_ends(timers, &mut queue).await;
    }
}

both! {
    #[tokio::test(start_paused = true)]
    async fn wake_after_clear(mode) {
        let (mut timers, mut queue) = delay_queue(mode);
        timers.insert("foo", ms(1000));

        assert_pending!(poll!(queue));
        assert!(!queue.is_woken());

        timers.clear().await;

        // Adapted as `wake_after_remove_last`: the wake comes when the `Timers` go.
        assert!(!queue.is_woken());
        assert_ends(timers, &mut queue).await;
    }
}
