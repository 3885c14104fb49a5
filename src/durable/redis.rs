//! The durable queue shared across processes through Redis (feature `redis`).
//!
//! # Data layout
//!
//! Every key of a queue named `orders` carries the hash tag `{orders}`, so the whole queue
//! lives in one Redis Cluster slot and every script is atomic:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `tw:{orders}:payload` | hash | id → payload |
//! | `tw:{orders}:meta` | hash | id → `state|due|seq|attempts|token|reason` |
//! | `tw:{orders}:due` | sorted set | pending tasks, score = due (ms), member = zero-padded seq + id, so ties go in schedule order |
//! | `tw:{orders}:inflight` | sorted set | in-flight ids, score = lease end (ms) |
//! | `tw:{orders}:dead` | sorted set | dead ids, score = seq |
//! | `tw:{orders}:seq`, `tw:{orders}:token` | counters | schedule order, delivery tokens |
//! | `tw:{orders}:done` | sorted set | `id:token` of recent finishes, so a retried ack is recognised (kept an hour) |
//!
//! A claim is one Lua script: it moves expired leases back to pending (or to the dead letters),
//! then moves due tasks to in-flight with a lease and returns them, plus the next due time and
//! next lease end so the process's wheel can sleep exactly until then. Newly scheduled or
//! moved tasks are announced on the channel `tw:{orders}:wake`, which wakes idle workers at
//! once. No worker polls.
//!
//! To spread load, use several queues (each its own slot); a queue's throughput is bounded by
//! the one Redis node that holds its slot.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use super::engine::{
    Consumer, Request, Settings, far_future, instant_of, last_attempt_reason, now_ms, system_time,
};
use super::{DeadLetter, Delivery, Error, Task, TaskId};
use crate::Wheel;

/// Most tasks one claim script hands out.
const CLAIM_BATCH: usize = 256;
/// Tries of a command before its error is surfaced; with the backoff between them (25 ms
/// doubling to 2 s) this rides out about ten seconds of outage or of a restarting server.
const TRIES: u32 = 10;

const SCHEDULE: &str = r#"
local m = redis.call('HGET', KEYS[2], ARGV[1])
if m then
  local st, due, seq = string.match(m, '^(%a)|(%d+)|(%d+)|')
  if st == 'i' then return 'INFLIGHT' end
  if st == 'p' then redis.call('ZREM', KEYS[3], string.format('%020d', tonumber(seq)) .. ':' .. ARGV[1]) end
  if st == 'd' then redis.call('ZREM', KEYS[4], ARGV[1]) end
end
local seq = redis.call('INCR', KEYS[5])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], 'p|' .. ARGV[3] .. '|' .. seq .. '|0|0|')
redis.call('ZADD', KEYS[3], ARGV[3], string.format('%020d', seq) .. ':' .. ARGV[1])
redis.call('PUBLISH', ARGV[4], ARGV[3])
return 'OK'
"#;

const CLAIM: &str = r#"
local now = tonumber(ARGV[1])
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for _, id in ipairs(expired) do
  redis.call('ZREM', KEYS[3], id)
  local m = redis.call('HGET', KEYS[1], id)
  if m then
    local st, due, seq, att = string.match(m, '^(%a)|(%d+)|(%d+)|(%d+)|')
    if tonumber(att) >= tonumber(ARGV[4]) then
      redis.call('HSET', KEYS[1], id, 'd|' .. due .. '|' .. seq .. '|' .. att .. '|0|lease expired on delivery ' .. att .. ' of ' .. ARGV[4])
      redis.call('ZADD', KEYS[4], seq, id)
    else
      redis.call('HSET', KEYS[1], id, 'p|' .. now .. '|' .. seq .. '|' .. att .. '|0|')
      redis.call('ZADD', KEYS[2], now, string.format('%020d', tonumber(seq)) .. ':' .. id)
    end
  end
end
local out = {}
if tonumber(ARGV[3]) > 0 then
  local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, ARGV[3])
  for _, member in ipairs(due) do
    redis.call('ZREM', KEYS[2], member)
    local id = string.sub(member, 22)
    local m = redis.call('HGET', KEYS[1], id)
    local st, d, seq, att = string.match(m, '^(%a)|(%d+)|(%d+)|(%d+)|')
    att = tonumber(att) + 1
    local token = redis.call('INCR', KEYS[5])
    redis.call('HSET', KEYS[1], id, 'i|' .. d .. '|' .. seq .. '|' .. att .. '|' .. token .. '|')
    redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), id)
    table.insert(out, id)
    table.insert(out, d)
    table.insert(out, tostring(att))
    table.insert(out, tostring(token))
  end
end
local nd = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local nl = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
table.insert(out, nd[2] or '')
table.insert(out, nl[2] or '')
return out
"#;

/// KEYS: payload meta inflight due dead done; ARGV: id token now outcome due reason.
/// outcome: 'ack' deletes, 'retry' pends at `due`, 'dead' buries with `reason`.
const FINISH: &str = r#"
local m = redis.call('HGET', KEYS[2], ARGV[1])
local mark = ARGV[1] .. ':' .. ARGV[2]
if m then
  local st, d, seq, att, tok = string.match(m, '^(%a)|(%d+)|(%d+)|(%d+)|(%d+)|')
  if st == 'i' and tok == ARGV[2] then
    redis.call('ZREM', KEYS[3], ARGV[1])
    if ARGV[4] == 'ack' then
      redis.call('HDEL', KEYS[1], ARGV[1])
      redis.call('HDEL', KEYS[2], ARGV[1])
    elseif ARGV[4] == 'retry' then
      redis.call('HSET', KEYS[2], ARGV[1], 'p|' .. ARGV[5] .. '|' .. seq .. '|' .. att .. '|0|')
      redis.call('ZADD', KEYS[4], ARGV[5], string.format('%020d', tonumber(seq)) .. ':' .. ARGV[1])
      redis.call('PUBLISH', ARGV[7], ARGV[5])
    else
      redis.call('HSET', KEYS[2], ARGV[1], 'd|' .. d .. '|' .. seq .. '|' .. att .. '|0|' .. ARGV[6])
      redis.call('ZADD', KEYS[5], seq, ARGV[1])
    end
    redis.call('ZADD', KEYS[6], ARGV[3], mark)
    redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', tonumber(ARGV[3]) - 3600000)
    return 1
  end
end
if redis.call('ZSCORE', KEYS[6], mark) then return 1 end
return 0
"#;

/// KEYS: payload meta due dead; ARGV: id op due channel now. op: cancel | reschedule | redrive.
const CHANGE: &str = r#"
local m = redis.call('HGET', KEYS[2], ARGV[1])
if not m then return 0 end
local st, d, seq, att, tok, reason = string.match(m, '^(%a)|(%d+)|(%d+)|(%d+)|(%d+)|(.*)$')
local member = string.format('%020d', tonumber(seq)) .. ':' .. ARGV[1]
if ARGV[2] == 'cancel' and st == 'p' then
  redis.call('ZREM', KEYS[3], member)
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  return 1
elseif ARGV[2] == 'reschedule' and st == 'p' then
  redis.call('HSET', KEYS[2], ARGV[1], 'p|' .. ARGV[3] .. '|' .. seq .. '|' .. att .. '|0|')
  redis.call('ZADD', KEYS[3], ARGV[3], member)
  redis.call('PUBLISH', ARGV[4], ARGV[3])
  return 1
elseif ARGV[2] == 'redrive' and st == 'd' then
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[1], 'p|' .. ARGV[5] .. '|' .. seq .. '|0|0|')
  redis.call('ZADD', KEYS[3], ARGV[5], member)
  redis.call('PUBLISH', ARGV[4], ARGV[5])
  return 1
end
return 0
"#;

/// Script arguments, each turned into Redis bytes once (so retries resend the same values).
macro_rules! redis_args {
    ($($value:expr),* $(,)?) => {{
        let mut args: Vec<Vec<u8>> = Vec::new();
        $(args.extend(redis::ToRedisArgs::to_redis_args(&$value));)*
        args
    }};
}
/// The keys and scripts of one queue.
struct Keys {
    payload: String,
    meta: String,
    due: String,
    inflight: String,
    dead: String,
    seq: String,
    token: String,
    done: String,
    channel: String,
}

impl Keys {
    fn new(name: &str) -> Keys {
        let key = |part: &str| format!("tw:{{{name}}}:{part}");
        Keys {
            payload: key("payload"),
            meta: key("meta"),
            due: key("due"),
            inflight: key("inflight"),
            dead: key("dead"),
            seq: key("seq"),
            token: key("token"),
            done: key("done"),
            channel: key("wake"),
        }
    }
}

struct Scripts {
    schedule: Script,
    claim: Script,
    finish: Script,
    change: Script,
}

/// What every request task of one queue shares.
struct Shared {
    keys: Keys,
    scripts: Scripts,
    connection: ConnectionManager,
    settings: Settings,
}

/// Whether trying again may succeed: a lost or refused connection, a timeout, a server still
/// loading its data after a restart. Anything else (a script error, bad data) is final.
fn is_transient(error: &redis::RedisError) -> bool {
    !matches!(error.retry_method(), redis::RetryMethod::NoRetry)
}

/// Runs a Redis operation, retrying with backoff while the server is unreachable.
async fn with_retries<T, F, Fut>(mut operation: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = redis::RedisResult<T>>,
{
    let mut delay = Duration::from_millis(25);
    let mut tries = 0;
    loop {
        match operation().await {
            Ok(value) => return Ok(value),
            Err(error) if !is_transient(&error) => return Err(Error::Io(error.to_string())),
            Err(error) => {
                tries += 1;
                if tries >= TRIES {
                    return Err(Error::Unreachable(error.to_string()));
                }
                tracing::debug!(%error, tries, "redis unreachable; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// Connects (failing with [`Error::Unreachable`] if it cannot) and starts the engine.
pub(crate) async fn start(
    url: &str,
    name: &str,
    settings: Settings,
    wheel: &Wheel,
) -> Result<mpsc::UnboundedSender<Request>, Error> {
    let client = redis::Client::open(url).map_err(|e| Error::Unreachable(e.to_string()))?;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_number_of_retries(2)
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(5)))
        .set_max_delay(Duration::from_secs(2));
    let mut connection = ConnectionManager::new_with_config(client.clone(), config)
        .await
        .map_err(|e| Error::Unreachable(e.to_string()))?;
    let _: () = redis::cmd("PING")
        .query_async(&mut connection)
        .await
        .map_err(|e| Error::Unreachable(e.to_string()))?;
    let shared = Arc::new(Shared {
        keys: Keys::new(name),
        scripts: Scripts {
            schedule: Script::new(SCHEDULE),
            claim: Script::new(CLAIM),
            finish: Script::new(FINISH),
            change: Script::new(CHANGE),
        },
        connection,
        settings,
    });
    let (requests, receiver) = mpsc::unbounded_channel();
    let wake = Arc::new(Notify::new());
    let runtime = &wheel.shared().runtime;
    let listener = runtime.spawn(listen(client, shared.keys.channel.clone(), wake.clone()));
    let engine = RedisEngine {
        shared,
        requests: receiver,
        handle: requests.downgrade(),
        consumers: Vec::new(),
        wheel: wheel.clone(),
        wake,
    };
    runtime.spawn(async move {
        engine.run().await;
        listener.abort();
    });
    Ok(requests)
}

/// Subscribes to the queue's wake channel, resubscribing after connection loss, and wakes the
/// engine on every message.
async fn listen(client: redis::Client, channel: String, wake: Arc<Notify>) {
    let mut delay = Duration::from_millis(50);
    loop {
        if let Ok(mut pubsub) = client.get_async_pubsub().await {
            if pubsub.subscribe(&channel).await.is_ok() {
                delay = Duration::from_millis(50);
                // Anything scheduled while we were away is picked up by this wake.
                wake.notify_one();
                let mut messages = pubsub.on_message();
                while messages.next().await.is_some() {
                    wake.notify_one();
                }
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

struct RedisEngine {
    shared: Arc<Shared>,
    requests: mpsc::UnboundedReceiver<Request>,
    handle: mpsc::WeakUnboundedSender<Request>,
    consumers: Vec<Consumer>,
    wheel: Wheel,
    wake: Arc<Notify>,
}

impl RedisEngine {
    async fn run(mut self) {
        let mut shutdown = self.wheel.shared().shutdown_signal();
        let mut next: Option<u64> = None;
        let mut retry_at: Option<Instant> = None;
        loop {
            if *shutdown.borrow_and_update() {
                break;
            }
            let wanted: usize = self
                .consumers
                .iter()
                .map(|c| c.credits.load(Ordering::Acquire))
                .sum();
            if wanted > 0 || next.is_some_and(|at| at <= now_ms()) {
                match self.claim(wanted).await {
                    Ok(wake_at) => {
                        next = wake_at;
                        retry_at = None;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "claiming from redis failed; retrying");
                        retry_at = Some(Instant::now() + Duration::from_millis(200));
                    }
                }
            }
            let wanted_now = self
                .consumers
                .iter()
                .any(|c| c.credits.load(Ordering::Acquire) > 0);
            let at = match (retry_at, next) {
                (Some(at), _) => Some(at),
                (None, Some(ms)) => Some(instant_of(ms)),
                (None, None) => None,
            };
            let sleep = self.wheel.sleep_until(at.unwrap_or_else(far_future));
            tokio::select! {
                biased;
                _ = shutdown.changed() => break,
                request = self.requests.recv() => match request {
                    Some(Request::Close(reply)) => {
                        let _ = reply.send(Ok(()));
                        break;
                    }
                    Some(request) => self.handle_request(request),
                    None => break,
                },
                () = self.wake.notified(), if wanted_now => {}
                () = sleep, if at.is_some() => {}
            }
            self.consumers.retain(|c| !c.sender.is_closed());
        }
        self.consumers.clear();
        self.requests.close();
    }

    fn handle_request(&mut self, request: Request) {
        let shared = self.shared.clone();
        match request {
            Request::Subscribe(consumer) => self.consumers.push(consumer),
            Request::Demand | Request::Close(_) => {}
            Request::Schedule(task, reply) => {
                tokio::spawn(async move { drop(reply.send(shared.schedule(task).await)) });
            }
            Request::Cancel(id, reply) => {
                tokio::spawn(
                    async move { drop(reply.send(shared.change(&id, "cancel", 0).await)) },
                );
            }
            Request::Reschedule(id, due, reply) => {
                tokio::spawn(async move {
                    drop(reply.send(shared.change(&id, "reschedule", due).await))
                });
            }
            Request::Redrive(id, reply) => {
                tokio::spawn(
                    async move { drop(reply.send(shared.change(&id, "redrive", 0).await)) },
                );
            }
            Request::Len(reply) => {
                tokio::spawn(async move { drop(reply.send(shared.len().await)) });
            }
            Request::DeadLetters(reply) => {
                tokio::spawn(async move { drop(reply.send(shared.dead_letters().await)) });
            }
            Request::Ack(id, token, reply) => {
                tokio::spawn(async move {
                    drop(reply.send(shared.finish(&id, token, "ack", 0, "").await))
                });
            }
            Request::Retry(id, token, attempt, after, reply) => {
                let policy = &shared.settings.policy;
                let last = after.is_none() && attempt >= policy.attempts();
                let delay = after.unwrap_or_else(|| policy.jittered_delay(attempt));
                let due = now_ms().saturating_add(delay.as_millis() as u64);
                let reason = last_attempt_reason(attempt);
                tokio::spawn(async move {
                    let outcome = if last { "dead" } else { "retry" };
                    drop(reply.send(shared.finish(&id, token, outcome, due, &reason).await))
                });
            }
            Request::Fail(id, token, reason, reply) => {
                tokio::spawn(async move {
                    drop(reply.send(shared.finish(&id, token, "dead", 0, &reason).await))
                });
            }
        }
    }

    /// Claims up to `wanted` due tasks for the consumers; returns when to look again.
    async fn claim(&mut self, wanted: usize) -> Result<Option<u64>, Error> {
        let shared = self.shared.clone();
        let keys = &shared.keys;
        let settings = &shared.settings;
        let wanted = wanted.min(CLAIM_BATCH);
        let now = now_ms();
        let reply: Vec<String> = shared
            .invoke(
                &shared.scripts.claim,
                &[
                    &keys.meta,
                    &keys.due,
                    &keys.inflight,
                    &keys.dead,
                    &keys.token,
                ],
                redis_args![
                    now,
                    settings.lease.as_millis() as u64,
                    wanted,
                    settings.policy.attempts()
                ],
            )
            .await?;
        let (claimed, tail) = reply.split_at(reply.len().saturating_sub(2));
        let next_due: Option<u64> = tail
            .first()
            .and_then(|s| s.parse::<f64>().ok())
            .map(|f| f as u64);
        let next_lease: Option<u64> = tail
            .get(1)
            .and_then(|s| s.parse::<f64>().ok())
            .map(|f| f as u64);
        if !claimed.is_empty() {
            let ids: Vec<&str> = claimed.chunks(4).map(|c| c[0].as_str()).collect();
            let payloads: Vec<Option<Vec<u8>>> = with_retries(|| {
                let mut connection = shared.connection.clone();
                let mut command = redis::cmd("HMGET");
                command.arg(&keys.payload).arg(&ids);
                async move { command.query_async(&mut connection).await }
            })
            .await
            .or_else(|_| Ok::<_, Error>(vec![None; ids.len()]))?;
            let Some(engine) = self.handle.upgrade() else {
                return Ok(None);
            };
            let mut consumer = 0;
            for (fields, payload) in claimed.chunks(4).zip(payloads) {
                let delivery = Delivery {
                    id: TaskId::from(fields[0].clone()),
                    payload: payload.unwrap_or_default(),
                    attempt: fields[2].parse().unwrap_or(1),
                    due: system_time(fields[1].parse().unwrap_or(0)),
                    token: fields[3].parse().unwrap_or(0),
                    engine: engine.clone(),
                };
                // Hand it to the next consumer with credit; one that vanished meanwhile drops
                // it, and its lease brings the task back.
                while consumer < self.consumers.len()
                    && self.consumers[consumer].credits.load(Ordering::Acquire) == 0
                {
                    consumer += 1;
                }
                if let Some(target) = self.consumers.get(consumer) {
                    target.credits.fetch_sub(1, Ordering::AcqRel);
                    let _ = target.sender.send(delivery);
                }
            }
        }
        let still_wanted = self
            .consumers
            .iter()
            .any(|c| c.credits.load(Ordering::Acquire) > 0);
        let due = next_due.filter(|_| still_wanted);
        Ok(match (due, next_lease) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }
}

impl Shared {
    /// Runs one of the queue's scripts, retrying while the server is unreachable.
    async fn invoke<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: Vec<Vec<u8>>,
    ) -> Result<T, Error> {
        with_retries(|| {
            let mut connection = self.connection.clone();
            let mut invocation = script.prepare_invoke();
            for key in keys {
                invocation.key(*key);
            }
            for arg in &args {
                invocation.arg(arg.as_slice());
            }
            async move { invocation.invoke_async(&mut connection).await }
        })
        .await
    }

    async fn schedule(&self, task: Task) -> Result<TaskId, Error> {
        let id = task.id.clone().unwrap_or_else(TaskId::generate);
        let due = task.due_ms();
        let keys = &self.keys;
        let answer: String = self
            .invoke(
                &self.scripts.schedule,
                &[&keys.payload, &keys.meta, &keys.due, &keys.dead, &keys.seq],
                redis_args![id.as_str(), task.payload.as_slice(), due, &keys.channel],
            )
            .await?;
        match answer.as_str() {
            "INFLIGHT" => Err(Error::InFlight),
            _ => Ok(id),
        }
    }

    async fn change(&self, id: &str, op: &str, due: u64) -> Result<bool, Error> {
        let keys = &self.keys;
        let changed: i64 = self
            .invoke(
                &self.scripts.change,
                &[&keys.payload, &keys.meta, &keys.due, &keys.dead],
                redis_args![id, op, due, &keys.channel, now_ms()],
            )
            .await?;
        Ok(changed == 1)
    }

    async fn finish(
        &self,
        id: &str,
        token: u64,
        outcome: &str,
        due: u64,
        reason: &str,
    ) -> Result<(), Error> {
        let keys = &self.keys;
        let done: i64 = self
            .invoke(
                &self.scripts.finish,
                &[
                    &keys.payload,
                    &keys.meta,
                    &keys.inflight,
                    &keys.due,
                    &keys.dead,
                    &keys.done,
                ],
                redis_args![id, token, now_ms(), outcome, due, reason, &keys.channel],
            )
            .await?;
        if done == 1 {
            Ok(())
        } else {
            Err(Error::LeaseLost)
        }
    }

    async fn len(&self) -> Result<usize, Error> {
        let (due, inflight): (usize, usize) = with_retries(|| {
            let mut connection = self.connection.clone();
            let mut pipe = redis::pipe();
            pipe.zcard(&self.keys.due).zcard(&self.keys.inflight);
            async move { pipe.query_async(&mut connection).await }
        })
        .await?;
        Ok(due + inflight)
    }

    async fn dead_letters(&self) -> Result<Vec<DeadLetter>, Error> {
        let ids: Vec<String> = with_retries(|| {
            let mut connection = self.connection.clone();
            let key = self.keys.dead.clone();
            async move { connection.zrange(key, 0, -1).await }
        })
        .await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let (metas, payloads): (Vec<Option<String>>, Vec<Option<Vec<u8>>>) = with_retries(|| {
            let mut connection = self.connection.clone();
            let mut pipe = redis::pipe();
            pipe.cmd("HMGET").arg(&self.keys.meta).arg(&ids);
            pipe.cmd("HMGET").arg(&self.keys.payload).arg(&ids);
            async move { pipe.query_async(&mut connection).await }
        })
        .await?;
        Ok(ids
            .into_iter()
            .zip(metas.into_iter().zip(payloads))
            .filter_map(|(id, (meta, payload))| {
                let meta = meta?;
                let mut fields = meta.splitn(6, '|');
                let attempts = fields.nth(3)?.parse().ok()?;
                let reason = fields.nth(1).unwrap_or_default().to_owned();
                Some(DeadLetter {
                    id: TaskId::from(id),
                    payload: payload.unwrap_or_default(),
                    attempts,
                    reason,
                })
            })
            .collect())
    }
}
