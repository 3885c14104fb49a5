//! Wake-ups: a worker never polls. Scripts publish on a partition's wake channel the due
//! time of a task that became pending earlier than any other (workers re-arm their wheels),
//! and on one idle worker's own channel the partition it should claim from now. This listener
//! subscribes to both and passes what it hears to the engine.

use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;

/// What the wake channels tell the engine.
pub(super) enum Wake {
    /// This worker was picked to claim a task that is due in this partition (on its own
    /// channel).
    Claim(usize),
    /// A task of this partition became pending at this server time, earlier than any other.
    Due(usize, u64),
    /// (Re)subscribed: anything may have happened while away.
    Refresh,
}

/// Subscribes to the partitions' wake channels and this worker's own, resubscribing after
/// connection loss (trying each node in turn: in a cluster, a message published on any node
/// reaches every node), and passes every message to the engine.
pub(super) async fn listen(
    clients: Vec<redis::Client>,
    channels: Vec<String>,
    idle: Vec<String>,
    own: String,
    wake: mpsc::UnboundedSender<Wake>,
) {
    let mut delay = Duration::from_millis(50);
    for attempt in 0.. {
        let client = &clients[attempt % clients.len()];
        if let Ok(mut pubsub) = client.get_async_pubsub().await {
            let mut all: Vec<&str> = channels.iter().map(String::as_str).collect();
            all.push(&own);
            if pubsub.subscribe(&all).await.is_ok() {
                delay = Duration::from_millis(50);
                if wake.send(Wake::Refresh).is_err() {
                    return;
                }
                let mut messages = pubsub.on_message();
                while let Some(message) = messages.next().await {
                    let channel = message.get_channel_name();
                    // Anything else (the empty messages of `check_permissions`) is no news.
                    let event = if channel == own {
                        let key: String = message.get_payload().unwrap_or_default();
                        idle.iter().position(|k| *k == key).map(Wake::Claim)
                    } else {
                        let part = channels.iter().position(|c| c == channel).unwrap_or(0);
                        let at = message.get_payload::<u64>();
                        at.ok().map(|at| Wake::Due(part, at))
                    };
                    if let Some(event) = event
                        && wake.send(event).is_err()
                    {
                        return;
                    }
                }
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}
