//! Webhook delivery with retries, built on delayed jobs.
//!
//! The example serves a flaky HTTP endpoint on loopback and delivers webhooks to it. Each
//! attempt is a job (`spawn_after`) scheduled with exponential backoff; when the endpoint
//! answers `503` with `Retry-After`, the already scheduled retry is moved with
//! `JobHandle::reschedule`; each webhook also has a give-up job that a success cancels.
//!
//! Run: `cargo run --release --example delayed_jobs` (`-- --quick` for shorter backoffs).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_wheel::{JobError, Wheel};

const MAX_ATTEMPTS: u32 = 4;

/// How the endpoint treats webhook `id` on its `attempt`-th request: a status code and an
/// optional `Retry-After` in seconds.
fn endpoint_answer(id: u32, attempt: u32) -> (u16, Option<u64>) {
    match (id % 4, attempt) {
        (0, _) => (200, None),     // healthy
        (1, 1..=2) => (500, None), // fails twice, then recovers
        (2, 1) => (503, Some(1)),  // overloaded: asks for a pause
        (3, _) => (500, None),     // broken: retries run out
        _ => (200, None),
    }
}

/// A minimal HTTP/1.1 endpoint: reads one request per connection and answers by the script
/// above, counting attempts per webhook.
async fn flaky_endpoint(listener: TcpListener) {
    let attempts = Arc::new(Mutex::new(HashMap::<u32, u32>::new()));
    while let Ok((stream, _)) = listener.accept().await {
        let attempts = attempts.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stream);
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).await.is_err() {
                return;
            }
            // "POST /hook/<id> HTTP/1.1"
            let id: u32 = request_line
                .split_whitespace()
                .nth(1)
                .and_then(|path| path.strip_prefix("/hook/"))
                .and_then(|id| id.parse().ok())
                .unwrap_or(0);
            let mut content_length = 0;
            loop {
                let mut header = String::new();
                if reader.read_line(&mut header).await.unwrap_or(0) == 0 || header == "\r\n" {
                    break;
                }
                if let Some(value) = header.to_ascii_lowercase().strip_prefix("content-length:") {
                    content_length = value.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; content_length];
            let _ = reader.read_exact(&mut body).await;
            let attempt = {
                let mut attempts = attempts.lock().expect("attempts");
                let count = attempts.entry(id).or_insert(0);
                *count += 1;
                *count
            };
            let (status, retry_after) = endpoint_answer(id, attempt);
            let reason = match status {
                200 => "OK",
                503 => "Service Unavailable",
                _ => "Internal Server Error",
            };
            let retry = retry_after
                .map(|s| format!("Retry-After: {s}\r\n"))
                .unwrap_or_default();
            let response = format!(
                "HTTP/1.1 {status} {reason}\r\nContent-Length: 0\r\n{retry}Connection: close\r\n\r\n"
            );
            let _ = reader.get_mut().write_all(response.as_bytes()).await;
        });
    }
}

/// What one delivery attempt got back.
#[derive(Debug, Clone, Copy)]
struct Answer {
    status: u16,
    retry_after: Option<Duration>,
}

/// Posts webhook `id` and reads the status line and `Retry-After`.
async fn post(address: SocketAddr, id: u32) -> std::io::Result<Answer> {
    let mut stream = TcpStream::connect(address).await?;
    let body = format!("{{\"event\":\"order.paid\",\"id\":{id}}}");
    let request = format!(
        "POST /hook/{id} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).await?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut retry_after = None;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).await? == 0 || header == "\r\n" {
            break;
        }
        if let Some(value) = header.to_ascii_lowercase().strip_prefix("retry-after:") {
            retry_after = value.trim().parse().ok().map(Duration::from_secs);
        }
    }
    Ok(Answer {
        status,
        retry_after,
    })
}

/// How a webhook's delivery ended.
#[derive(Debug, PartialEq, Eq)]
enum Delivery {
    Delivered { attempts: u32 },
    Exhausted,
    GaveUp,
}

async fn deliver(
    wheel: Wheel,
    address: SocketAddr,
    id: u32,
    base: Duration,
    give_up_after: Duration,
    log: Log,
) -> Delivery {
    // The give-up job fires only if delivery is still going on at the deadline.
    let mut give_up = wheel.spawn_after(give_up_after, async {});
    let mut attempt = 1;
    let mut job = wheel.spawn_after(Duration::ZERO, post(address, id));
    loop {
        let result = tokio::select! {
            result = &mut job => result,
            _ = &mut give_up => {
                job.cancel();
                log.line(id, format!("gave up after {give_up_after:?}"));
                return Delivery::GaveUp;
            }
        };
        let answer = match result {
            Ok(Ok(answer)) => answer,
            Ok(Err(error)) => {
                log.line(id, format!("attempt {attempt}: connection failed: {error}"));
                Answer {
                    status: 0,
                    retry_after: None,
                }
            }
            Err(error @ (JobError::Cancelled | JobError::Panicked(_))) => {
                panic!("attempt job failed: {error}")
            }
            Err(error) => {
                log.line(id, format!("attempt {attempt}: {error}"));
                return Delivery::GaveUp;
            }
        };
        if answer.status == 200 {
            give_up.cancel();
            log.line(
                id,
                format!("attempt {attempt}: 200 OK — delivered; give-up job cancelled"),
            );
            return Delivery::Delivered { attempts: attempt };
        }
        if attempt == MAX_ATTEMPTS {
            give_up.cancel();
            log.line(
                id,
                format!("attempt {attempt}: {} — no attempts left", answer.status),
            );
            return Delivery::Exhausted;
        }
        let backoff = base * 2u32.pow(attempt - 1);
        job = wheel.spawn_after(backoff, post(address, id));
        let mut note = format!(
            "attempt {attempt}: {} — retry in {backoff:?}",
            answer.status
        );
        if let Some(after) = answer.retry_after {
            job.reschedule(Instant::now() + after);
            note = format!(
                "attempt {attempt}: {} with Retry-After {after:?} — retry moved to then",
                answer.status
            );
        }
        log.line(id, note);
        attempt += 1;
    }
}

/// A shared, timestamped timeline.
#[derive(Clone)]
struct Log {
    start: Instant,
}

impl Log {
    fn line(&self, id: u32, text: String) {
        println!(
            "[{:>6.3} s] webhook {id}: {text}",
            self.start.elapsed().as_secs_f64()
        );
    }
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|arg| arg == "--quick");
    let base = Duration::from_millis(if quick { 50 } else { 250 });
    let give_up_after = Duration::from_secs(10);
    let wheel = Wheel::builder().name("webhooks").build();
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind on loopback");
    let address = listener.local_addr().expect("local address");
    let endpoint = tokio::spawn(flaky_endpoint(listener));
    println!(
        "flaky endpoint on http://{address}/hook/<id>; backoff {base:?} × 2^(attempt-1), {MAX_ATTEMPTS} attempts at most\n"
    );

    let log = Log {
        start: Instant::now(),
    };
    let deliveries: Vec<_> = (0..8)
        .map(|id| {
            tokio::spawn(deliver(
                wheel.clone(),
                address,
                id,
                base,
                give_up_after,
                log.clone(),
            ))
        })
        .collect();
    let mut outcomes = Vec::new();
    for (id, delivery) in deliveries.into_iter().enumerate() {
        outcomes.push((id as u32, delivery.await.expect("delivery task")));
    }
    endpoint.abort();

    println!("\nsummary:");
    for (id, outcome) in &outcomes {
        println!("  webhook {id}: {outcome:?}");
        let expected = match id % 4 {
            0 => Delivery::Delivered { attempts: 1 },
            1 => Delivery::Delivered { attempts: 3 },
            2 => Delivery::Delivered { attempts: 2 },
            _ => Delivery::Exhausted,
        };
        assert_eq!(*outcome, expected, "webhook {id}");
    }
    wheel.flush().await;
    let stats = wheel.stats();
    println!(
        "wheel: {} jobs scheduled, {} started, {} cancelled, {} pending",
        stats.inserted, stats.fired, stats.cancelled, stats.pending
    );
    wheel.shutdown().await;
}
