//! Outside attacks on API.md §1 (Sleep::is_elapsed, JobHandle::deadline, Wheel::stopped) and
//! §3 (keyed timers, the `Timers::insert` → `KeyedTimer` handle). Written from the contract
//! only; a broken promise is kept as an `#[ignore = "finding: …"]` test.
// Trait probes are constants by design: the assertions state the contract.
#![allow(clippy::assertions_on_constants)]

use std::cell::Cell;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt;
use futures::task::noop_waker_ref;
use tokio::time::Instant;
use tokio_wheel::{Expirations, Schedule, Wheel};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}
fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    Pin::new(f).poll(&mut Context::from_waker(noop_waker_ref()))
}

/// Lets the actors run (paused time does not move: yields only).
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// Nothing expired right now (paused time).
async fn quiet<K, V>(expired: &mut Expirations<K, V>) {
    settle().await;
    let mut next = expired.next();
    assert!(poll_once(&mut next).is_pending(), "an expiration came");
}

/// Runtime Send/Sync probes (inherent consts beat trait consts for concrete types).
struct Probe<T: ?Sized>(PhantomData<T>);
trait NoSync {
    const SYNC: bool = false;
}
impl<T: ?Sized> NoSync for Probe<T> {}
impl<T: ?Sized + Sync> Probe<T> {
    #[allow(dead_code)]
    const SYNC: bool = true;
}

/// A key that is `Send` but not `Sync`, as `K: Eq + Hash + Clone + Send + 'static` allows.
#[derive(Clone, Debug)]
struct SendKey(Cell<u32>);
impl PartialEq for SendKey {
    fn eq(&self, o: &Self) -> bool {
        self.0.get() == o.0.get()
    }
}
impl Eq for SendKey {}
impl Hash for SendKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.get().hash(h)
    }
}

// ───────────────────────────── §3 handle: traits ─────────────────────────────

fn assert_send<T: Send>() {}
fn assert_clone<T: Clone>() {}

#[test]
fn handle_is_clone_send_with_a_send_only_value() {
    // V is only `Send` in the contract: a `Cell` value must not take Send/Clone away.
    assert_send::<tokio_wheel::KeyedTimer<u32, Cell<u32>>>();
    assert_clone::<tokio_wheel::KeyedTimer<u32, Cell<u32>>>();
    assert_send::<tokio_wheel::Timers<u32, Cell<u32>>>();
    assert!(
        <Probe<tokio_wheel::Timers<u32, Cell<u32>>>>::SYNC,
        "Timers Sync with V: Send"
    );
    assert_send::<Expirations<u32, Cell<u32>>>();
    assert!(
        <Probe<tokio_wheel::KeyedTimer<u32, Cell<u32>>>>::SYNC,
        "KeyedTimer Sync with V: Send only"
    );
}

/// API.md §3: "`KeyedTimer<K>`: Clone + Send + Sync", with `K: Eq + Hash + Clone + Send`.
#[test]
#[ignore = "finding, kept as a declared deviation (CHANGELOG): KeyedTimer is Sync only when K is Sync; `key()` lends `&K`, so a Sync handle over a !Sync key would be unsound"]
fn handle_is_sync_for_a_send_only_key() {
    assert_send::<tokio_wheel::KeyedTimer<SendKey, u8>>();
    assert!(
        <Probe<tokio_wheel::KeyedTimer<SendKey, u8>>>::SYNC,
        "KeyedTimer<SendKey, _> is not Sync"
    );
}

#[test]
fn timers_are_sync_for_a_send_only_key() {
    assert!(<Probe<tokio_wheel::Timers<SendKey, u8>>>::SYNC);
    assert_send::<Expirations<SendKey, u8>>();
}

#[tokio::test(start_paused = true)]
async fn a_send_only_key_works_through_a_handle() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<SendKey, u8>();
    let t = timers.insert(SendKey(Cell::new(3)), 3, secs(5));
    t.reset(secs(8));
    let e = expired.next().await.unwrap();
    assert_eq!(start.elapsed(), secs(8));
    assert_eq!(*e.value(), 3);
}

// ─────────────────────────── §3 handle: stale rules ──────────────────────────

#[tokio::test(start_paused = true)]
async fn stale_after_insert_again_even_without_yielding() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u8, &str>();
    let old = timers.insert(1, "old", secs(10));
    let new = timers.insert(1, "new", secs(20));
    // No yield between: the replacement is still a command in flight.
    old.reset(secs(100)); // later: would be a CAS on the old word
    old.reset_at(start + secs(1)); // earlier: a command
    old.remove();
    assert_eq!(old.take().await, None, "replaced: take answers None");
    assert!(old.is_stale());
    assert!(!new.is_stale());
    assert_eq!(new.deadline(), start + secs(20));
    let e = expired.next().await.unwrap();
    assert_eq!(
        start.elapsed(),
        secs(20),
        "the new entry keeps its own deadline"
    );
    assert_eq!(e.into_parts(), (1, "new"));
    quiet(&mut expired).await;
}

#[tokio::test(start_paused = true)]
async fn stale_after_by_key_set_replacement_without_yielding() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u8, &str>();
    let old = timers.insert(1, "old", secs(10));
    timers.set(1, "new", secs(20));
    old.reset(secs(100));
    assert_eq!(old.take().await, None);
    let e = expired.next().await.unwrap();
    assert_eq!(start.elapsed(), secs(20));
    assert_eq!(e.into_parts(), (1, "new"));
    assert_eq!(timers.len().await, 0);
}

#[tokio::test(start_paused = true)]
async fn an_old_handle_never_touches_a_later_entry_of_its_key_aba() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u8, &str>();
    let old = timers.insert(1, "a", secs(10));
    timers.remove(&1);
    timers.set(1, "b", secs(30)); // same key again, no handle
    old.reset(secs(5)); // earlier: must not move "b"
    old.reset(secs(500)); // later: must not move "b"
    old.remove(); // must not remove "b"
    assert_eq!(old.take().await, None);
    assert_eq!(timers.len().await, 1, "b is still set");
    let e = expired.next().await.unwrap();
    assert_eq!(start.elapsed(), secs(30));
    assert_eq!(e.into_parts(), (1, "b"));
}

#[tokio::test(start_paused = true)]
async fn a_handle_stale_by_expiry_never_touches_the_next_entry() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u8, &str>();
    let old = timers.insert(1, "a", secs(10));
    let e = expired.next().await.unwrap();
    assert_eq!(e.into_parts(), (1, "a"));
    let new = timers.insert(1, "b", secs(10)); // due at 20 s
    old.reset(secs(1));
    old.reset(secs(100));
    assert_eq!(old.take().await, None);
    old.remove();
    assert_eq!(
        old.deadline(),
        start + secs(10),
        "the deadline it fired for"
    );
    assert_eq!(new.deadline(), start + secs(20));
    let e = expired.next().await.unwrap();
    assert_eq!(start.elapsed(), secs(20));
    assert_eq!(e.into_parts(), (1, "b"));
}

#[tokio::test(start_paused = true)]
async fn a_handle_stale_by_drain_and_by_key_take() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u8, u8>();
    let a = timers.insert(1, 1, secs(10));
    let b = timers.insert(2, 2, secs(10));
    let mut drained = timers.drain().await;
    drained.sort();
    assert_eq!(drained, vec![(1, 1), (2, 2)]);
    assert!(a.is_stale() && b.is_stale());
    a.reset(secs(1));
    assert_eq!(a.take().await, None);
    timers.set(2, 22, secs(10));
    assert_eq!(
        b.take().await,
        None,
        "drained handle must not take the new entry"
    );
    assert_eq!(timers.take(&2).await, Some(22));
    let c = timers.insert(3, 3, secs(10));
    assert_eq!(timers.take(&3).await, Some(3));
    c.reset(secs(1));
    assert_eq!(c.take().await, None);
    tokio::time::sleep(secs(60)).await;
    quiet(&mut expired).await;
}

#[tokio::test(start_paused = true)]
async fn handle_take_is_some_exactly_once_among_clones_and_by_key() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u8, String>();
    let t = timers.insert(1, "v".into(), secs(10));
    let c1 = t.clone();
    let c2 = c1.clone();
    let (a, b, c, d) = tokio::join!(t.take(), c1.take(), c2.take(), timers.take(&1));
    let somes = [&a, &b, &c, &d].iter().filter(|x| x.is_some()).count();
    assert_eq!(somes, 1, "{a:?} {b:?} {c:?} {d:?}");
    tokio::time::sleep(secs(60)).await;
    quiet(&mut expired).await;
}

#[tokio::test(start_paused = true)]
async fn clones_share_the_word() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u8, u8>();
    let t = timers.insert(1, 1, secs(10));
    let c = t.clone();
    c.reset(secs(40));
    assert_eq!(timers.len().await, 1); // barrier: the insert has landed
    assert_eq!(
        t.deadline(),
        start + secs(40),
        "a clone's move shows on the original"
    );
    c.reset(secs(45)); // now the CAS path
    assert_eq!(
        t.deadline(),
        start + secs(45),
        "a clone's CAS shows on the original at once"
    );
    t.reset_at(start + secs(15)); // earlier through the other clone
    assert_eq!(c.deadline(), start + secs(15));
    drop(t);
    drop(c); // dropping every handle leaves the entry set
    let e = expired.next().await.unwrap();
    assert_eq!(start.elapsed(), secs(15));
    assert_eq!(e.deadline(), start + secs(15));
}

// ──────────────────── §3 handle: order with by-key commands ───────────────────

#[tokio::test(start_paused = true)]
async fn handle_later_then_by_key_earlier_ends_earlier() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u8, ()>();
    let t = timers.insert(1, (), secs(10));
    t.reset(secs(50));
    timers.reset(&1, secs(5));
    expired.next().await.unwrap();
    assert_eq!(start.elapsed(), secs(5));
}

#[tokio::test(start_paused = true)]
async fn by_key_earlier_then_handle_later_ends_later() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u8, ()>();
    let t = timers.insert(1, (), secs(10));
    timers.reset(&1, secs(5));
    t.reset(secs(50));
    let e = expired.next().await.unwrap();
    assert_eq!(start.elapsed(), secs(50));
    assert_eq!(e.deadline(), start + secs(50));
}

#[tokio::test(start_paused = true)]
async fn by_key_later_then_handle_earlier_ends_earlier() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u8, ()>();
    let t = timers.insert(1, (), secs(10));
    timers.reset(&1, secs(100));
    t.reset(secs(20)); // earlier than 100 but later than the original 10
    let e = expired.next().await.unwrap();
    assert_eq!(start.elapsed(), secs(20));
    assert_eq!(e.deadline(), start + secs(20));
}

#[tokio::test(start_paused = true)]
async fn by_key_remove_then_handle_reset_stays_removed() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u8, ()>();
    let t = timers.insert(1, (), secs(10));
    timers.remove(&1);
    t.reset(secs(50));
    t.reset(secs(2));
    tokio::time::sleep(secs(100)).await;
    quiet(&mut expired).await;
    assert_eq!(timers.len().await, 0);
    assert!(t.is_stale());
}

#[tokio::test(start_paused = true)]
async fn handle_remove_then_by_key_set_is_set() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u8, u8>();
    let t = timers.insert(1, 1, secs(10));
    t.remove();
    timers.set(1, 2, secs(20));
    let e = expired.next().await.unwrap();
    assert_eq!(start.elapsed(), secs(20));
    assert_eq!(e.into_parts(), (1, 2));
}

#[tokio::test(start_paused = true)]
async fn by_key_reset_reaches_handle_deadline() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, _expired) = wheel.keyed::<u8, u8>();
    let t = timers.insert(1, 1, secs(10));
    timers.reset(&1, secs(33));
    assert_eq!(timers.len().await, 1); // barrier: the by-key call has reached the actor
    assert_eq!(t.deadline(), start + secs(33));
}

#[tokio::test(start_paused = true)]
async fn a_long_mixed_script_ends_where_the_last_call_says() {
    // Randomised single-task script of handle and by-key moves; the last move wins.
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u8, u32>();
    let mut seed = 0x9E3779B97F4A7C15u64;
    let mut rnd = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for round in 0..200u32 {
        let start = Instant::now();
        let t = timers.insert(1, round, secs(1000));
        let mut last = start + secs(1000);
        for _ in 0..(1 + rnd(12)) {
            let d = start + secs(10 + rnd(900));
            match rnd(3) {
                0 => t.reset_at(d),
                1 => timers.reset_at(&1, d),
                _ => t.reset(d - start),
            }
            last = d;
            if rnd(4) == 0 {
                tokio::task::yield_now().await;
            }
        }
        let e = expired.next().await.unwrap();
        assert_eq!(e.deadline(), last, "round {round}");
        assert_eq!(
            Instant::now(),
            last,
            "round {round}: fired at the last deadline"
        );
        assert_eq!(e.into_parts(), (1, round));
        assert_eq!(t.deadline(), last);
    }
}

// ─────────────────────────── §3 handle: edge deadlines ───────────────────────

#[tokio::test(start_paused = true)]
async fn reset_at_the_past_fires_promptly_once() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u8, ()>();
    tokio::time::advance(secs(10)).await;
    let start = Instant::now();
    let t = timers.insert(1, (), secs(100));
    t.reset_at(start - secs(5));
    let e = expired.next().await.unwrap();
    assert!(start.elapsed() <= ms(2), "fired {:?} late", start.elapsed());
    assert!(e.deadline() <= start);
    quiet(&mut expired).await;
    let t2 = timers.insert(2, (), secs(100));
    t2.reset(Duration::ZERO);
    let e = expired.next().await.unwrap();
    assert_eq!(*e.key(), 2);
    assert!(start.elapsed() <= ms(2));
}

#[tokio::test(start_paused = true)]
async fn duration_max_through_a_handle_never_fires_and_can_come_back() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u8, ()>();
    let t = timers.insert(1, (), secs(10));
    t.reset(Duration::MAX);
    assert_eq!(timers.len().await, 1); // barrier
    assert!(t.deadline() > start + secs(10 * 365 * 86400));
    let u = timers.insert(2, (), Duration::MAX);
    tokio::time::sleep(secs(20 * 365 * 86400)).await; // 20 years
    quiet(&mut expired).await;
    u.reset(secs(5)); // earlier, from "forever"
    let e = expired.next().await.unwrap();
    assert_eq!(*e.key(), 2);
    assert_eq!(e.deadline(), start + secs(20 * 365 * 86400 + 5));
    t.reset(secs(1));
    let e = expired.next().await.unwrap();
    assert_eq!(*e.key(), 1);
    // A handle reset_at a far-future instant (not Duration::MAX).
    let v = timers.insert(3, (), secs(1));
    let far = Instant::now().checked_add(secs(1 << 40)).unwrap();
    v.reset_at(far);
    tokio::time::sleep(secs(60 * 365 * 86400)).await; // 80 years in: past the 73-year range
    quiet(&mut expired).await;
    assert_eq!(timers.len().await, 1);
}

#[tokio::test(start_paused = true)]
async fn many_handles_for_one_key_replaced_repeatedly() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let (timers, mut expired) = wheel.keyed::<u8, u32>();
    let mut handles = Vec::new();
    for i in 0..2000u32 {
        handles.push(timers.insert(1, i, secs(10) + ms(u64::from(i))));
        if i % 7 == 0 {
            // Old handles poke in between replacements.
            handles[(i / 2) as usize].reset(secs(1));
            handles[(i / 3) as usize].reset(secs(10_000));
        }
        if i % 97 == 0 {
            tokio::task::yield_now().await;
        }
    }
    let last = handles.pop().unwrap();
    for (i, h) in handles.iter().enumerate() {
        h.reset(ms(1 + i as u64));
        h.remove();
    }
    for h in handles.iter().step_by(100) {
        assert_eq!(h.take().await, None);
    }
    assert_eq!(timers.len().await, 1);
    let e = expired.next().await.unwrap();
    assert_eq!(e.deadline(), start + secs(10) + ms(1999));
    assert_eq!(Instant::now(), e.deadline());
    assert_eq!(e.into_parts(), (1, 1999));
    assert!(last.is_stale());
    quiet(&mut expired).await;
    assert_eq!(wheel.stats().fired, 1);
}

// ─────────────────────── §3 handle: lifetime and shutdown ────────────────────

#[tokio::test(start_paused = true)]
async fn a_handle_outliving_timers_and_expirations_still_works() {
    let wheel = Wheel::new();
    let (timers, expired) = wheel.keyed::<u8, u8>();
    let t = timers.insert(1, 9, secs(10));
    let u = timers.insert(2, 8, secs(10));
    drop(timers);
    drop(expired);
    t.reset(secs(30));
    tokio::time::sleep(secs(20)).await;
    let got = tokio::time::timeout(secs(1), t.take())
        .await
        .expect("take hangs");
    assert_eq!(got, Some(9), "still set at 20 s (moved to 30 s)");
    let got = tokio::time::timeout(secs(1), u.take())
        .await
        .expect("take hangs");
    assert_eq!(got, None, "expired at 10 s (no reader)");
    assert!(u.is_stale());
}

#[tokio::test(start_paused = true)]
async fn a_handle_after_shutdown() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u8, u8>();
    let t = timers.insert(1, 1, secs(10));
    let gone = timers.insert(2, 2, secs(10));
    let moved = timers.insert(3, 3, secs(10));
    gone.remove(); // a handle command made before shutdown: never delivered
    moved.reset(secs(1000));
    moved.reset_at(Instant::now() + secs(3));
    wheel.shutdown().await;
    let mut got = Vec::new();
    while let Some(e) = tokio::time::timeout(secs(1), expired.next())
        .await
        .expect("stream ends after shutdown")
    {
        assert!(e.is_shutdown());
        got.push(e.into_parts());
    }
    got.sort();
    assert_eq!(got, vec![(1, 1), (3, 3)]);
    assert!(t.is_stale());
    t.reset(secs(1));
    t.reset_at(Instant::now());
    t.remove();
    let r = tokio::time::timeout(secs(1), t.take())
        .await
        .expect("take after shutdown hangs");
    assert_eq!(r, None);
    // insert on a stopped wheel: refused silently, a stale handle.
    let late = timers.insert(9, 9, secs(1));
    assert!(late.is_stale(), "a handle from a stopped wheel is stale");
    assert_eq!(
        tokio::time::timeout(secs(1), late.take()).await.unwrap(),
        None
    );
    late.reset(secs(5));
    assert_eq!(timers.len().await, 0);
}

#[tokio::test(start_paused = true)]
async fn a_take_through_a_handle_racing_shutdown_is_exclusive() {
    for round in 0..50u8 {
        let wheel = Wheel::new();
        let (timers, mut expired) = wheel.keyed::<u8, u8>();
        let t = timers.insert(1, round, secs(10));
        for _ in 0..round % 5 {
            tokio::task::yield_now().await;
        }
        let w = wheel.clone();
        let (taken, ()) = tokio::join!(t.take(), w.shutdown());
        let mut delivered = 0;
        while let Some(e) = tokio::time::timeout(secs(1), expired.next()).await.unwrap() {
            assert!(e.is_shutdown());
            delivered += 1;
        }
        assert_eq!(
            usize::from(taken.is_some()) + delivered,
            1,
            "round {round}: taken {taken:?}, delivered {delivered}"
        );
    }
}

#[test]
fn a_handle_after_its_runtime_died() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (wheel, timers, expired, t) = rt.block_on(async {
        let wheel = Wheel::new();
        let (timers, expired) = wheel.keyed::<u8, u8>();
        let t = timers.insert(1, 1, secs(3600));
        t.reset(secs(7200));
        (wheel, timers, expired, t)
    });
    drop(rt);
    let other = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    other.block_on(async move {
        let r = tokio::time::timeout(secs(5), t.take())
            .await
            .expect("take hangs on a dead runtime");
        assert_eq!(r, None);
        t.reset(secs(1));
        assert!(t.is_stale());
        let u = timers.insert(2, 2, secs(1));
        assert!(u.is_stale());
        tokio::time::timeout(secs(5), wheel.stopped())
            .await
            .expect("stopped resolves");
        let mut expired = expired;
        let mut n = 0;
        while let Some(e) = tokio::time::timeout(secs(5), expired.next())
            .await
            .expect("stream ends")
        {
            assert!(e.is_shutdown());
            assert_eq!(e.into_parts(), (1, 1));
            n += 1;
        }
        assert_eq!(n, 1, "the entry is delivered once, marked shutdown");
    });
}

// ──────────────────── §3 handle: races on a 2-worker runtime ─────────────────

/// A later `reset` through the handle that *returned* before the entry's current deadline
/// must win ("fires once, never early"); one that lost must find the entry gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_that_returned_before_the_deadline_always_wins() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u32, u32>();
    let fired: Arc<std::sync::Mutex<Vec<(u32, Instant, Instant)>>> = Default::default();
    let reader = {
        let fired = fired.clone();
        tokio::spawn(async move {
            while let Some(e) = expired.next().await {
                let now = Instant::now();
                fired.lock().unwrap().push((*e.key(), e.deadline(), now));
            }
        })
    };
    let mut tasks = Vec::new();
    for k in 0..64u32 {
        let t = timers.insert(k, k, ms(3 + u64::from(k % 5)));
        tasks.push(tokio::spawn(async move {
            // Moves later; each record: (deadline before, new deadline, returned at).
            let mut log = Vec::new();
            let began = std::time::Instant::now();
            let mut step = 0u64;
            while !t.is_stale() && began.elapsed() < ms(60) {
                let before = t.deadline();
                let new = Instant::now() + Duration::from_micros(500 + (step * 37) % 2500);
                t.reset_at(new.max(before)); // never earlier
                let returned = Instant::now();
                log.push((before, new.max(before), returned));
                step += 1;
                if step % 3 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            (t, log)
        }));
    }
    let mut logs = Vec::new();
    for task in tasks {
        let (t, log) = task.await.unwrap();
        logs.push((*t.key(), log)); // handles dropped: they would keep the stream open
    }
    // Everything ends within 60 ms of resets + a few ms; be generous.
    tokio::time::sleep(ms(500)).await;
    drop(timers);
    tokio::time::timeout(secs(10), reader)
        .await
        .expect("stream ends")
        .unwrap();
    let fired = fired.lock().unwrap();
    for (k, log) in &logs {
        let k = *k;
        let mine: Vec<_> = fired.iter().filter(|f| f.0 == k).collect();
        assert_eq!(mine.len(), 1, "key {k} fired {} times", mine.len());
        let (_, deadline, seen) = *mine[0];
        assert!(seen >= deadline, "key {k} delivered before its deadline");
        for &(before, new, returned) in log {
            if returned < before {
                // The entry could not have fired yet (never early): this reset landed.
                assert!(
                    deadline >= new,
                    "key {k}: a reset to {new:?} returned at {returned:?} before the old deadline {before:?}, yet the entry fired for {deadline:?}"
                );
            }
        }
    }
}

/// `take` racing expiry on two workers: exactly one of (Some from take, an expiration).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_racing_expiry_is_exclusive() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u32, u32>();
    let taken = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for k in 0..200u32 {
        let t = timers.insert(k, k, Duration::from_micros(u64::from(k % 20) * 200));
        let taken = taken.clone();
        tasks.push(tokio::spawn(async move {
            let spin = std::time::Instant::now();
            while spin.elapsed() < Duration::from_micros(u64::from(k % 17) * 250) {
                std::hint::spin_loop();
            }
            if t.take().await.is_some() {
                taken.fetch_add(1, Ordering::SeqCst);
                Some(k)
            } else {
                None
            }
        }));
    }
    let mut took = std::collections::HashSet::new();
    for task in tasks {
        if let Some(k) = task.await.unwrap() {
            took.insert(k);
        }
    }
    drop(timers);
    let mut fired = std::collections::HashSet::new();
    while let Some(e) = tokio::time::timeout(secs(10), expired.next())
        .await
        .expect("stream ends")
    {
        assert!(fired.insert(*e.key()), "fired twice: {}", e.key());
        assert!(!took.contains(e.key()), "taken and fired: {}", e.key());
    }
    assert_eq!(fired.len() + took.len(), 200);
}

/// Earlier moves (commands) racing expiry: fires once, never early, never for a deadline
/// nobody set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn earlier_moves_racing_expiry_fire_once() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u32, ()>();
    let mut tasks = Vec::new();
    for k in 0..100u32 {
        let t = timers.insert(k, (), ms(2 + u64::from(k % 4)));
        tasks.push(tokio::spawn(async move {
            let mut set = vec![t.deadline()];
            for i in 0..20u64 {
                if t.is_stale() {
                    break;
                }
                let d = Instant::now() + Duration::from_micros(1500u64.saturating_sub(i * 80));
                t.reset_at(d);
                set.push(d);
                tokio::task::yield_now().await;
            }
            (t, set)
        }));
    }
    let mut sets = std::collections::HashMap::new();
    for task in tasks {
        let (t, set) = task.await.unwrap();
        sets.insert(*t.key(), set);
    }
    drop(timers);
    let mut count = std::collections::HashMap::new();
    while let Some(e) = tokio::time::timeout(secs(10), expired.next())
        .await
        .expect("stream ends")
    {
        let seen = Instant::now();
        assert!(seen >= e.deadline());
        let set = &sets[e.key()];
        assert!(
            set.contains(&e.deadline()),
            "key {}: fired for a deadline never set",
            e.key()
        );
        *count.entry(*e.key()).or_insert(0) += 1;
    }
    assert_eq!(count.len(), 100);
    assert!(count.values().all(|&c| c == 1), "{count:?}");
}

// ─────────────────────────────── §1 Sleep::is_elapsed ────────────────────────

#[tokio::test(start_paused = true)]
async fn is_elapsed_follows_tokio() {
    let wheel = Wheel::new();
    let mut s = Box::pin(wheel.sleep(secs(5)));
    assert!(!s.is_elapsed());
    tokio::time::advance(secs(6)).await;
    assert!(!s.is_elapsed(), "never polled: not elapsed");
    assert!(poll_once(&mut s).is_ready());
    assert!(s.is_elapsed());
    // Reset later: no longer elapsed (tokio's reset clears it).
    let now = Instant::now();
    s.as_mut().reset(now + secs(5));
    assert!(!s.is_elapsed(), "re-armed: not elapsed");
    assert!(poll_once(&mut s).is_pending());
    assert!(!s.is_elapsed());
    // Fired by the wheel without a poll.
    tokio::time::advance(secs(5)).await;
    settle().await;
    assert!(s.is_elapsed(), "fired by the wheel: elapsed");
    assert!(poll_once(&mut s).is_ready());
    // Reset to the past: ready on that poll.
    s.as_mut().reset(now);
    assert!(poll_once(&mut s).is_ready());
    assert!(s.is_elapsed());
}

#[tokio::test(start_paused = true)]
async fn is_elapsed_after_shutdown() {
    let wheel = Wheel::new();
    let mut pending = Box::pin(wheel.sleep(secs(50)));
    assert!(poll_once(&mut pending).is_pending());
    wheel.shutdown().await;
    settle().await;
    assert!(pending.is_elapsed(), "resolved at shutdown: elapsed");
    assert!(poll_once(&mut pending).is_ready());
    let mut late = Box::pin(wheel.sleep(secs(50)));
    assert!(
        poll_once(&mut late).is_ready(),
        "refused after shutdown: resolves at once"
    );
    assert!(late.is_elapsed());
    // Reset after shutdown: must not hang.
    late.as_mut().reset(Instant::now() + secs(50));
    tokio::time::timeout(ms(1), late)
        .await
        .expect("a re-armed sleep after shutdown hangs");
}

#[tokio::test(start_paused = true)]
async fn advance_then_one_poll_completes_everything_due() {
    let wheel = Wheel::new();
    let mut sleeps: Vec<_> = (1..=50).map(|i| Box::pin(wheel.sleep(ms(i * 7)))).collect();
    for s in &mut sleeps {
        assert!(poll_once(s).is_pending());
    }
    let mut to = Box::pin(wheel.timeout(ms(100), std::future::pending::<()>()));
    assert!(poll_once(&mut to).is_pending());
    tokio::time::advance(ms(203)).await; // sleep 29 (203 ms) is due exactly now
    for (i, s) in sleeps.iter_mut().enumerate() {
        let due = (i as u64 + 1) * 7 <= 203;
        assert_eq!(
            poll_once(s).is_ready(),
            due,
            "sleep {i} (due {due}) after advance"
        );
    }
    assert!(matches!(poll_once(&mut to), Poll::Ready(Err(_))));
}

#[tokio::test(start_paused = true)]
async fn reset_racing_own_fire_completes_at_the_new_deadline() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let mut s = Box::pin(wheel.sleep(secs(1)));
    assert!(poll_once(&mut s).is_pending());
    tokio::time::advance(secs(1)).await; // due; maybe already fired by the actor
    s.as_mut().reset(start + secs(10));
    settle().await;
    assert!(poll_once(&mut s).is_pending(), "re-armed later: pending");
    tokio::time::advance(secs(8)).await;
    settle().await;
    assert!(poll_once(&mut s).is_pending(), "early at 9 s");
    tokio::time::advance(secs(1)).await;
    assert!(poll_once(&mut s).is_ready());
}

// ─────────────────────────── §2 JobHandle::deadline ─────────────────────────

#[tokio::test(start_paused = true)]
async fn periodic_deadline_names_the_next_run() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let r = runs.clone();
    let w = wheel.clone();
    let rate = wheel.spawn_every(secs(10), Schedule::FixedRate, move || {
        let r = r.clone();
        let w = w.clone();
        async move {
            r.lock().unwrap().push(Instant::now());
            w.sleep(secs(3)).await;
        }
    });
    assert_eq!(rate.deadline(), start + secs(10));
    tokio::time::sleep(secs(11)).await; // in the first run (10..13)
    assert_eq!(runs.lock().unwrap().len(), 1);
    assert_eq!(
        rate.deadline(),
        start + secs(20),
        "FixedRate during a run: next slot"
    );
    tokio::time::sleep(secs(5)).await; // 16: between runs
    assert_eq!(rate.deadline(), start + secs(20));
    tokio::time::sleep(secs(20)).await; // 36
    assert_eq!(rate.deadline(), start + secs(40));
    assert_eq!(
        *runs.lock().unwrap(),
        vec![start + secs(10), start + secs(20), start + secs(30)]
    );
    assert!(rate.cancel());
    assert!(matches!(rate.await, Err(tokio_wheel::JobError::Cancelled)));

    let start = Instant::now();
    let w = wheel.clone();
    let delay = wheel.spawn_every(secs(10), Schedule::FixedDelay, move || {
        let w = w.clone();
        async move { w.sleep(secs(3)).await }
    });
    assert_eq!(delay.deadline(), start + secs(10));
    tokio::time::sleep(secs(11)).await;
    assert!(
        delay.deadline() >= start + secs(20),
        "FixedDelay during a run: at least +period"
    );
    tokio::time::sleep(secs(3)).await; // 14: the run ended at 13
    assert_eq!(
        delay.deadline(),
        start + secs(23),
        "FixedDelay after the run: end + period"
    );
}

/// FixedRate: a run that ends exactly on a slot does not skip that slot.
#[tokio::test(start_paused = true)]
async fn fixed_rate_run_ending_on_a_slot_keeps_it() {
    let wheel = Wheel::new();
    let start = Instant::now();
    let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let r = runs.clone();
    let w = wheel.clone();
    let job = wheel.spawn_every(secs(10), Schedule::FixedRate, move || {
        let r = r.clone();
        let w = w.clone();
        async move {
            r.lock().unwrap().push(Instant::now());
            w.sleep(secs(10)).await; // ends exactly on the next slot
        }
    });
    tokio::time::sleep(secs(45)).await;
    job.abort();
    let runs = runs.lock().unwrap().clone();
    assert_eq!(
        runs,
        vec![
            start + secs(10),
            start + secs(20),
            start + secs(30),
            start + secs(40)
        ]
    );
}

// ─────────────────────────────── Wheel::stopped ──────────────────────────────

#[tokio::test(start_paused = true)]
async fn stopped_resolves_on_shutdown_for_clones_and_stays_ready() {
    let wheel = Wheel::new();
    let mut a = wheel.stopped();
    let b = a.clone();
    assert!(poll_once(&mut a).is_pending());
    let waiter = tokio::spawn(b);
    settle().await;
    wheel.clone().shutdown().await;
    tokio::time::timeout(ms(10), waiter)
        .await
        .expect("clone resolves")
        .unwrap();
    assert!(poll_once(&mut a).is_ready());
    let mut late = wheel.stopped();
    assert!(
        poll_once(&mut late).is_ready(),
        "made after shutdown: ready at once"
    );
}

#[test]
fn stopped_resolves_when_the_runtime_dies() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (wheel, stopped) = rt.block_on(async {
        let wheel = Wheel::new();
        let s = wheel.stopped();
        wheel.sleep(ms(1)).await;
        (wheel, s)
    });
    let other = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let s2 = stopped.clone();
    let waiter = other.spawn(s2);
    drop(rt);
    other.block_on(async {
        tokio::time::timeout(secs(5), stopped)
            .await
            .expect("stopped after runtime death");
        tokio::time::timeout(secs(5), waiter)
            .await
            .expect("a waiting clone wakes")
            .unwrap();
        assert!(wheel.is_shutdown());
        // Every future from the dead wheel resolves.
        tokio::time::timeout(secs(5), wheel.sleep(secs(1000)))
            .await
            .expect("sleep resolves");
    });
}

#[tokio::test(start_paused = true)]
async fn stopped_does_not_keep_the_wheel_running() {
    let wheel = Wheel::new();
    let stopped = wheel.stopped();
    let job = wheel.spawn_after(secs(1), async { 5 });
    drop(wheel);
    // The detached job still fires; then nothing needs the actor.
    assert_eq!(job.await, Ok(5));
    let r = tokio::time::timeout(secs(3600), stopped).await;
    // Documented: "does not keep the wheel running"; whether it resolves once the actor exits
    // on its own is reported, not asserted.
    eprintln!("stopped after the wheel retired itself: {}", r.is_ok());
}

/// API.md §3: "The stream ends once every `Timers` clone is dropped and nothing is pending".
/// A handle cannot set anything new, so with nothing pending it can add nothing; yet while a
/// (stale) `KeyedTimer` lives, the stream never ends.
#[tokio::test(start_paused = true)]
async fn the_stream_ends_with_timers_dropped_even_if_a_stale_handle_lives() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u8, u8>();
    let t = timers.insert(1, 1, secs(10));
    drop(timers);
    let e = expired.next().await.unwrap();
    assert_eq!(e.into_parts(), (1, 1));
    assert!(t.is_stale(), "expired: stale, nothing pending");
    let end = tokio::time::timeout(secs(3600), expired.next()).await;
    assert!(
        matches!(end, Ok(None)),
        "the stream did not end within an hour: nothing pending, no Timers"
    );
    drop(t);
}

#[tokio::test(start_paused = true)]
async fn the_stream_ends_once_the_last_handle_goes_too() {
    let wheel = Wheel::new();
    let (timers, mut expired) = wheel.keyed::<u8, u8>();
    let t = timers.insert(1, 1, secs(10));
    drop(timers);
    expired.next().await.unwrap();
    drop(t);
    let end = tokio::time::timeout(secs(1), expired.next()).await;
    assert!(matches!(end, Ok(None)));
}

/// Stopped docs: "Once resolved it stays resolved: polling it again (or a clone) is `Ready` at
/// once, so it can sit in a `select!` loop by `&mut`."
#[tokio::test(start_paused = true)]
async fn stopped_polled_again_after_ready_by_mut() {
    let wheel = Wheel::new();
    let mut stopped = wheel.stopped();
    wheel.shutdown().await;
    (&mut stopped).await;
    // Polled again after it completed: must be Ready, not a panic.
    let again = std::panic::AssertUnwindSafe(async { (&mut stopped).await });
    let r = futures::FutureExt::catch_unwind(again).await;
    assert!(r.is_ok(), "polling a resolved Stopped again panicked");
}

#[tokio::test(start_paused = true)]
async fn stopped_in_a_select_loop_by_mut() {
    let wheel = Wheel::new();
    let mut stopped = wheel.stopped();
    let w = wheel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(secs(1)).await;
        w.shutdown().await;
    });
    let mut seen_stop = 0;
    let mut ticks = 0;
    let body = async {
        loop {
            tokio::select! {
                _ = &mut stopped => { seen_stop += 1; if seen_stop == 3 { break; } }
                _ = tokio::time::sleep(ms(100)) => { ticks += 1; }
            }
        }
    };
    let r = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(body)).await;
    assert!(r.is_ok(), "select! loop over &mut Stopped panicked");
    assert!(ticks >= 9);
}

#[tokio::test(start_paused = true)]
async fn stopped_clone_of_a_resolved_one_is_ready() {
    let wheel = Wheel::new();
    let mut stopped = wheel.stopped();
    wheel.shutdown().await;
    (&mut stopped).await;
    let mut c = stopped.clone();
    assert!(
        poll_once(&mut c).is_ready(),
        "a clone of a resolved Stopped"
    );
}

/// §1: "`Duration::MAX` and far-future instants saturate: no panic, no overflow, never fires
/// early — with any tick, however fine (a deadline past the wheel's range waits forever rather
/// than firing at the range's end)". Observed: `Duration::MAX` becomes now + 30 years (tokio's
/// `far_future`) and everything fires then; an explicit 300-year instant does wait.
#[tokio::test(start_paused = true)]
async fn duration_max_never_fires_in_two_centuries() {
    let wheel = Wheel::new();
    let now = Instant::now();
    let mut max = Box::pin(wheel.sleep(Duration::MAX));
    let mut far = Box::pin(wheel.sleep_until(now + secs(300 * 365 * 86400)));
    let mut t = Box::pin(wheel.timeout(Duration::MAX, std::future::pending::<()>()));
    let (timers, mut expired) = wheel.keyed::<u8, ()>();
    timers.set(1, (), Duration::MAX);
    let job = wheel.spawn_after(Duration::MAX, async {});
    assert!(poll_once(&mut max).is_pending());
    assert!(poll_once(&mut far).is_pending());
    assert!(poll_once(&mut t).is_pending());
    let mut fired = Vec::new();
    for year in 1..=200u64 {
        tokio::time::advance(secs(86400 * 365)).await;
        settle().await;
        let mut nx = expired.next();
        for (what, ready) in [
            ("sleep(MAX)", poll_once(&mut max).is_ready()),
            ("sleep_until(+300 y)", poll_once(&mut far).is_ready()),
            ("timeout(MAX)", poll_once(&mut t).is_ready()),
            ("keyed set(MAX)", poll_once(&mut nx).is_ready()),
            ("spawn_after(MAX)", job.is_finished()),
        ] {
            if ready && !fired.iter().any(|(w, _)| *w == what) {
                fired.push((what, year));
            }
        }
    }
    assert!(fired.is_empty(), "fired (what, year): {fired:?}");
}
