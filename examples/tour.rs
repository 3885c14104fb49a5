//! A guided tour of tokio-wheel: sleeps and timeouts, delayed and periodic jobs, keyed timers,
//! stats and shutdown — each in miniature, in real time.
//!
//! Run: `cargo run --release --example tour` (a few seconds; `-- --quick` for under one).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tokio_wheel::{JobError, Schedule, Wheel};

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|arg| arg == "--quick");
    // Every delay in the tour is a multiple of this unit.
    let unit = if quick {
        Duration::from_millis(40)
    } else {
        Duration::from_millis(200)
    };
    let start = Instant::now();
    let at = move || format!("[{:>6.3} s]", start.elapsed().as_secs_f64());

    // The tour makes a job panic on purpose: report panics in one line.
    std::panic::set_hook(Box::new(|info| eprintln!("  (panic hook: {info})")));

    let wheel = Wheel::builder().name("tour").build();
    println!(
        "tokio-wheel tour: one actor task, {:?} ticks\n",
        wheel.tick()
    );

    println!("1. Futures that resolve at a deadline");
    wheel.sleep(unit).await;
    println!("{} slept {unit:?}", at());
    let slow = wheel.sleep(unit * 10);
    match wheel.timeout(unit, slow).await {
        Ok(()) => println!("{} the slow future finished in time (unexpected)", at()),
        Err(elapsed) => println!("{} timeout after {unit:?}: {elapsed}", at()),
    }
    let mut interval = wheel.interval(unit / 2);
    for _ in 0..3 {
        let scheduled = interval.tick().await;
        println!(
            "{} interval tick scheduled at +{:?}",
            at(),
            scheduled - start
        );
    }

    println!("\n2. Delayed async jobs");
    let report = wheel.spawn_after(unit, async { "nightly report sent" });
    let reminder = wheel.spawn_after(unit * 20, async { "reminder" });
    println!(
        "{} reminder due at +{:?}; cancelling it: {}",
        at(),
        reminder.deadline() - start,
        reminder.cancel()
    );
    let report = report.await;
    println!("{} report job: {report:?}", at());
    let reminder = reminder.await;
    println!("{} reminder job: {reminder:?} (answered at once)", at());
    let crashing = wheel.spawn_after(unit / 2, async { panic!("disk full") });
    match crashing.await {
        Err(JobError::Panicked(message)) => {
            println!("{} a job panicked ({message}); the wheel keeps going", at())
        }
        other => println!("{} unexpected: {other:?}", at()),
    }
    let runs = Arc::new(AtomicU32::new(0));
    let counter = runs.clone();
    let heartbeat = wheel.spawn_every(unit / 2, Schedule::FixedRate, move || {
        let counter = counter.clone();
        async move {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            println!("{} heartbeat #{n}", at());
        }
    });
    wheel.sleep(unit * 2 + unit / 4).await;
    heartbeat.cancel();
    println!(
        "{} heartbeat stopped after {} runs: {:?}",
        at(),
        runs.load(Ordering::SeqCst),
        heartbeat.await
    );

    println!(
        "\n3. Keyed timers: idle connections close after {:?} of silence",
        unit * 3
    );
    let (timers, mut expired) = wheel.keyed::<&str, u32>();
    for (port, conn) in [(40_001, "alice"), (40_002, "bob"), (40_003, "carol")] {
        timers.set(conn, port, unit * 3);
    }
    let chatty = timers.clone();
    let chatter = tokio::spawn(async move {
        for _ in 0..4 {
            tokio::time::sleep(unit).await;
            chatty.reset(&"alice", unit * 3); // alice keeps talking
        }
    });
    for _ in 0..2 {
        let e = expired.next().await.expect("two idle connections");
        println!(
            "{} closing idle connection {} (port {})",
            at(),
            e.key(),
            e.value()
        );
    }
    chatter.await.expect("chatter task");
    println!(
        "{} alice is still open: {} connection(s) tracked",
        at(),
        timers.len().await
    );

    println!("\n4. Keyed timers: message ack timeouts");
    let (pending_acks, mut unacked) = wheel.keyed::<u32, u32>(); // message id → attempt
    for message in 1..=4 {
        pending_acks.set(message, 1, unit * 2);
    }
    for message in [1, 3] {
        let acked = pending_acks.take(&message).await.is_some();
        println!(
            "{} ack for message {message} arrived in time: {acked}",
            at()
        );
    }
    for _ in 0..2 {
        let expiry = unacked.next().await.expect("two unacked messages");
        let (message, attempt) = expiry.into_parts();
        println!(
            "{} message {message} not acked within {:?}: resend (attempt {})",
            at(),
            unit * 2,
            attempt + 1
        );
    }

    println!("\n5. Stats and shutdown");
    let stats = wheel.stats();
    println!(
        "{} pending {} · fired {} · cancelled {} · commands {} · max lateness {:?}",
        at(),
        stats.pending,
        stats.fired,
        stats.cancelled,
        stats.commands,
        stats.max_lateness
    );
    wheel.shutdown().await;
    while let Some(e) = expired.next().await {
        println!(
            "{} shutdown delivered {} (is_shutdown = {})",
            at(),
            e.key(),
            e.is_shutdown()
        );
    }
    let stats = wheel.stats();
    assert_eq!(
        stats.inserted,
        stats.fired + stats.cancelled + stats.pending
    );
    println!(
        "{} stopped cleanly; inserted {} = fired {} + cancelled {} + pending {}",
        at(),
        stats.inserted,
        stats.fired,
        stats.cancelled,
        stats.pending
    );
    println!(
        "\nEach part as a real program: cargo run --release --example keepalive | delayed_jobs | ack_timeouts | periodic\n(the job queue, crate tokio-wheel-durable: cargo run --release -p tokio-wheel-durable --example durable;\n with --features redis: redis_queue)"
    );
}
