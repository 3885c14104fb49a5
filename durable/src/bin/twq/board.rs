//! `twq dashboard`: the queue's web board (`tokio_wheel_durable::dashboard`) served on its
//! own, until Ctrl-C.

use std::time::Duration;

use serde_json::json;
use tokio::net::TcpListener;
use tokio_wheel::Wheel;
use tokio_wheel::axum::{IdleListener, busy_aware};
use tokio_wheel_durable::DurableQueue;
use tokio_wheel_durable::dashboard::Dashboard;

use crate::args::{Cli, Dashboard as Args};
use crate::{Failure, Output};

/// How long a browser's idle keep-alive connection is kept open.
const IDLE: Duration = Duration::from_secs(60);

/// Serves the board on `queue` (opened read-only on Redis) until Ctrl-C.
pub(crate) async fn serve(
    cli: &Cli,
    args: &Args,
    queue: &DurableQueue,
    wheel: &Wheel,
    target: &str,
) -> Result<Output, Failure> {
    let token = match &args.token_file {
        Some(file) => {
            let text = std::fs::read_to_string(file)
                .map_err(|e| Failure::Error(format!("--token-file {}: {e}", file.display())))?;
            let token = text.trim().to_owned();
            if token.is_empty() {
                return Err(Failure::Error(format!(
                    "--token-file {}: the file is empty",
                    file.display()
                )));
            }
            Some(token)
        }
        None => None,
    };
    if !args.listen.ip().is_loopback() && token.is_none() {
        return Err(Failure::Error(format!(
            "--listen {}: a board reachable from other machines needs --token-file (or listen \
             on 127.0.0.1)",
            args.listen
        )));
    }
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| Failure::Error(format!("cannot listen on {}: {e}", args.listen)))?;
    let address = listener
        .local_addr()
        .map_err(|e| Failure::Error(format!("cannot listen on {}: {e}", args.listen)))?;

    let mut board = Dashboard::new(queue.clone())
        .title(target.strip_prefix("queue ").unwrap_or(target))
        .read_only(args.read_only)
        .call_timeout(cli.timeout);
    // A password may sit in a payload or a reason too: the board never shows one.
    let urls: Vec<&str> = cli
        .redis
        .iter()
        .chain(cli.cluster.iter().flatten())
        .map(String::as_str)
        .collect();
    for secret in crate::show::passwords(urls.into_iter()) {
        board = board.hide(secret);
    }
    // On loopback without a token, only requests addressed to loopback names are answered
    // (a page elsewhere that rebinds its name to 127.0.0.1 is not).
    board = board.local_only(token.is_none() && args.listen.ip().is_loopback());
    if let Some(token) = token {
        board = board.token(token);
    }
    // On Redis the pages read through the read-only handle; the one that writes (it records
    // the partition count) is opened at the first action.
    if !args.read_only && (cli.redis.is_some() || cli.cluster.is_some()) {
        let redis = cli.redis.clone();
        let cluster = cli.cluster.clone().unwrap_or_default();
        let name = cli.queue.clone().unwrap_or_default();
        let partitions = cli.partitions;
        let wheel = wheel.clone();
        board = board.act_through(move || {
            let (redis, cluster, name, wheel) =
                (redis.clone(), cluster.clone(), name.clone(), wheel.clone());
            async move {
                let builder = DurableQueue::builder().partitions(partitions);
                match redis {
                    Some(url) => builder.redis(&url, &name, &wheel).await,
                    None => {
                        let urls: Vec<&str> = cluster.iter().map(String::as_str).collect();
                        builder.redis_cluster(&urls, &name, &wheel).await
                    }
                }
            }
        });
    }
    let mode = if args.read_only { " (read-only)" } else { "" };
    eprintln!("twq: board for {target} on http://{address}/{mode}; Ctrl-C stops it");
    let app = busy_aware(board.router());
    axum::serve(IdleListener::new(listener, wheel, IDLE), app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| Failure::Error(format!("the board stopped: {e}")))?;
    Ok(Output {
        human: "board stopped\n".to_owned(),
        json: json!({"stopped": true, "address": address.to_string()}),
    })
}
