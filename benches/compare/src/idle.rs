//! Idle: CPU and wake-ups of a service holding far-future timers.

use super::*;

// ---------------------------------------------------------------- idle

/// What an idle period with many far-future timers pending cost.
#[derive(Debug, Clone, Copy)]
pub struct IdleReport {
    /// Process CPU time over the period.
    pub cpu: Duration,
    /// Thread wake-ups over the period: voluntary context switches summed over the process's
    /// threads (Linux `/proc`; `None` elsewhere). Includes the one of the thread that sleeps
    /// through the period.
    pub thread_wakeups: Option<u64>,
    /// Actor wake-ups during the period (tokio-wheel's `Stats`).
    pub wakeups: Option<u64>,
}

pub const IDLE_PERIOD: Duration = Duration::from_secs(2);

/// The name of pingora-timeout's clock thread, which wakes every 10 ms for the rest of the
/// process once any `fast_timeout` was created, and cannot be stopped.
pub const PINGORA_THREAD: &str = "Timer thread";

/// Voluntary context switches of every thread of this process except pingora-timeout's
/// clock thread (a process-wide background cost no idle peer should be charged with).
pub fn thread_wakeups() -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path();
        let Ok(name) = std::fs::read_to_string(path.join("comm")) else {
            continue; // the thread exited meanwhile
        };
        if name.trim_end() == PINGORA_THREAD {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(path.join("status")) else {
            continue;
        };
        total += status
            .lines()
            .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|count| count.trim().parse::<u64>().ok())?;
    }
    Some(total)
}

/// Whether pingora-timeout's clock thread runs in this process (its 10 ms ticks then show in
/// every idle CPU number).
pub fn pingora_clock_running() -> bool {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks.flatten().any(|task| {
                std::fs::read_to_string(task.path().join("comm"))
                    .is_ok_and(|name| name.trim_end() == PINGORA_THREAD)
            })
        })
        .unwrap_or(false)
}

/// Sleeps this worker thread through the idle period (not a Tokio timer: nothing of the
/// timers under test may wake for it) and returns the CPU time and thread wake-ups it saw.
pub(crate) fn idle_period() -> (Duration, Option<u64>) {
    let switches = thread_wakeups();
    let cpu = process_cpu_time();
    std::thread::sleep(IDLE_PERIOD);
    let cpu = process_cpu_time() - cpu;
    let switches = thread_wakeups()
        .zip(switches)
        .map(|(after, before)| after.saturating_sub(before));
    (cpu, switches)
}

pub(crate) fn far_delays(n: usize) -> Vec<Duration> {
    (0..n)
        .map(|i| Duration::from_secs(3_600 + i as u64 % 3_600))
        .collect()
}

pub async fn idle_tokio(n: usize) -> IdleReport {
    let _sleeps: Vec<_> = far_delays(n)
        .into_iter()
        .map(|delay| {
            let mut sleep = Box::pin(tokio::time::sleep(delay));
            assert!(poll_once(sleep.as_mut()).is_pending());
            sleep
        })
        .collect();
    let (cpu, thread_wakeups) = idle_period();
    IdleReport {
        cpu,
        thread_wakeups,
        wakeups: None,
    }
}

pub async fn idle_wheel(wheel: Wheel, n: usize) -> IdleReport {
    let sleeps: Vec<_> = far_delays(n)
        .into_iter()
        .map(|delay| {
            let mut sleep = wheel.sleep(delay);
            assert!(poll_once(Pin::new(&mut sleep)).is_pending());
            sleep
        })
        .collect();
    wheel.flush().await;
    let wakeups = wheel.stats().wakeups;
    let (cpu, thread_wakeups) = idle_period();
    let report = IdleReport {
        cpu,
        thread_wakeups,
        wakeups: Some(wheel.stats().wakeups - wakeups),
    };
    drop(sleeps);
    wheel.flush().await;
    report
}

/// `kestrel-timer` ticks every 10 ms whatever is pending: about 200 wake-ups in 2 s.
pub async fn idle_kestrel(timer: Kestrel, n: usize) -> IdleReport {
    let (ids, handles): (Vec<_>, Vec<_>) = far_delays(n)
        .into_iter()
        .map(|delay| kestrel_register(&timer, delay))
        .unzip();
    let (cpu, thread_wakeups) = idle_period();
    assert_eq!(timer.cancel_batch(&ids), n);
    drop(handles);
    IdleReport {
        cpu,
        thread_wakeups,
        wakeups: None,
    }
}

/// `hierarchical_hash_wheel_timer`'s thread sleeps until its wheel's next slot boundary.
pub async fn idle_hash_wheel(mut timer: HashWheelRef, n: usize) -> IdleReport {
    for (id, delay) in far_delays(n).into_iter().enumerate() {
        timer.schedule_action_once(id as u64, delay, |_| {});
    }
    hash_wheel_barrier(&mut timer).await;
    let (cpu, thread_wakeups) = idle_period();
    for id in 0..n as u64 {
        timer.cancel(&id);
    }
    hash_wheel_barrier(&mut timer).await;
    IdleReport {
        cpu,
        thread_wakeups,
        wakeups: None,
    }
}
