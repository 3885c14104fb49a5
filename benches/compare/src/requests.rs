//! Request-shaped timers: a header-read sleep per request, dropped unfired.

use super::*;

// ---------------------------------------------------------------- requests

/// The request-shaped scenario's "network": a thread that answers every pending request once
/// per `wait` of real time (a `std::thread::sleep`, so that no Tokio timer of the runtime under
/// test is involved), standing for a round trip of `wait` to `2 · wait`. It samples the live
/// heap each time it wakes, for the peak.
pub(crate) struct Responder {
    requests: Option<std::sync::mpsc::Sender<tokio::sync::oneshot::Sender<()>>>,
    thread: std::thread::JoinHandle<isize>,
}

impl Responder {
    fn start(wait: Duration) -> Responder {
        let (requests, pending) = std::sync::mpsc::channel::<tokio::sync::oneshot::Sender<()>>();
        let thread = std::thread::Builder::new()
            .name("responder".into())
            .spawn(move || {
                let mut peak = live_bytes();
                loop {
                    std::thread::sleep(wait);
                    peak = peak.max(live_bytes());
                    loop {
                        match pending.try_recv() {
                            Ok(answer) => {
                                let _ = answer.send(());
                            }
                            Err(std::sync::mpsc::TryRecvError::Empty) => break,
                            Err(std::sync::mpsc::TryRecvError::Disconnected) => return peak,
                        }
                    }
                }
            })
            .expect("responder thread");
        Responder {
            requests: Some(requests),
            thread,
        }
    }

    fn sender(&self) -> std::sync::mpsc::Sender<tokio::sync::oneshot::Sender<()>> {
        self.requests.clone().expect("running")
    }

    /// Waits for the thread (every sender must be gone) and returns the peak live heap it saw.
    fn stop(mut self) -> isize {
        drop(self.requests.take());
        self.thread.join().expect("responder")
    }
}

/// What the request-shaped scenario cost.
#[derive(Debug, Clone, Copy)]
pub struct RequestReport {
    /// Process CPU time (every thread) per request.
    pub cpu_per_request: Duration,
    /// Wall time per request (all tasks together).
    pub wall_per_request: Duration,
    /// The largest live heap seen while it ran, minus the live heap before it started.
    pub peak_heap: isize,
}

/// The real wait of the request scenario's responder: round trips of 200–400 µs.
pub const REQUEST_WAIT: Duration = Duration::from_micros(200);
/// The header-read timeout every request arms and drops.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The request-shaped scenario (a keep-alive server's header-read timer): `tasks` tasks on the
/// runtime, each `per_task` times makes a 30 s timer with `make`, sends a request to the
/// responder thread, polls the answer and then the timer (which registers it, with the task's
/// waker), awaits the answer (a real round trip of 200–400 µs) and drops the timer unfired.
/// `finish` runs after the last task, inside the measured time (a flush, for tokio-wheel).
pub async fn requests<T, M, F>(tasks: usize, per_task: usize, make: M, finish: F) -> RequestReport
where
    M: Fn() -> T + Clone + Send + 'static,
    T: Future<Output = ()> + Send + 'static,
    F: Future<Output = ()>,
{
    let responder = Responder::start(REQUEST_WAIT);
    let before = live_bytes();
    let cpu = process_cpu_time();
    let start = Instant::now();
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let network = responder.sender();
            let make = make.clone();
            tokio::spawn(async move {
                for _ in 0..per_task {
                    let timer = pin!(make());
                    let mut timer = timer;
                    let (answer, answered) = tokio::sync::oneshot::channel();
                    network.send(answer).expect("responder");
                    let mut answered = pin!(answered);
                    std::future::poll_fn(|cx| {
                        if let Poll::Ready(answer) = answered.as_mut().poll(cx) {
                            answer.expect("answered");
                            return Poll::Ready(());
                        }
                        assert!(timer.as_mut().poll(cx).is_pending(), "the timer fired");
                        Poll::Pending
                    })
                    .await;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("request task");
    }
    finish.await;
    let wall = start.elapsed();
    let cpu = process_cpu_time() - cpu;
    let peak = responder.stop();
    let n = (tasks * per_task) as u32;
    RequestReport {
        cpu_per_request: cpu / n,
        wall_per_request: wall / n,
        peak_heap: peak - before,
    }
}

/// The request scenario with no timer at all: the floor every timer adds to.
pub async fn requests_none(tasks: usize, per_task: usize) -> RequestReport {
    requests(tasks, per_task, std::future::pending::<()>, async {}).await
}

/// The request scenario with `tokio::time::sleep` (unboxed, pinned in the task).
pub async fn requests_tokio(tasks: usize, per_task: usize) -> RequestReport {
    requests(
        tasks,
        per_task,
        || tokio::time::sleep(REQUEST_TIMEOUT),
        async {},
    )
    .await
}

/// The request scenario with pingora-timeout's `fast_sleep` (timers shared per 10 ms tick).
pub async fn requests_pingora(tasks: usize, per_task: usize) -> RequestReport {
    requests(
        tasks,
        per_task,
        || pingora_timeout::fast_timeout::fast_sleep(REQUEST_TIMEOUT),
        async {},
    )
    .await
}

/// The request scenario with tokio-wheel sleeps, until the actor has applied everything.
pub async fn requests_wheel(wheel: Wheel, tasks: usize, per_task: usize) -> RequestReport {
    let maker = wheel.clone();
    let stats = wheel.stats();
    let report = requests(tasks, per_task, move || maker.sleep(REQUEST_TIMEOUT), {
        let wheel = wheel.clone();
        async move { wheel.flush().await }
    })
    .await;
    if std::env::var_os("REQUEST_STATS").is_some() {
        let after = wheel.stats();
        let n = (tasks * per_task) as f64;
        eprintln!(
            "tokio-wheel requests: {:.3} actor wake-ups, {:.2} commands, {:.3} filed per request",
            (after.wakeups - stats.wakeups) as f64 / n,
            (after.commands - stats.commands) as f64 / n,
            (after.inserted - stats.inserted) as f64 / n,
        );
    }
    report
}
