//! Outside attacks on API.md §1 and §2 edges: `Sleep::is_elapsed` (as tokio's),
//! `JobHandle::deadline` during a periodic run, and `Wheel::stopped`. Written from the
//! contract only.

use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tokio_wheel::{Schedule, Wheel};

#[path = "support/attack.rs"]
mod attack;
use attack::{ms, poll_once, secs, settle};

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
