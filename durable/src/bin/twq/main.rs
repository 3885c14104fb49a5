//! `twq`: an operator's command line for a tokio-wheel-durable queue (feature `cli`).
//!
//! ```text
//! twq --file tasks.redb stats
//! twq --redis redis://:password@host:6379/ --queue webhooks list dead --limit 50
//! twq --file tasks.redb schedule --payload '{"order":42}' --after 10m --id order-42
//! ```
//!
//! Tables for people, `--json` for scripts (one document per command). Exit status: 0 done;
//! 1 the task named (or the Redis queue named) is not there, or not in a state the command
//! can act on; 2 an error, with one line on standard error. A password in a Redis URL is
//! never printed. Commands that only look (stats, list, get, recurring list) open a Redis
//! queue read-only and write nothing to the server. Built only on the public API of
//! `tokio_wheel_durable`.

mod args;
mod board;
mod detail;
mod show;
// Shared with the board (`dashboard`): the same file, compiled in both.
#[path = "../../units.rs"]
mod units;

use std::io::{Read, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::Parser;
use clap::error::ErrorKind;
use serde_json::{Value, json};
use tokio_wheel::Wheel;
use tokio_wheel_durable::{
    Cursor, DurableQueue, Error, Task, TaskFilter, TaskId, TaskInfo, TaskState,
};

use crate::args::{Cli, Command, RecurringCommand, StateArg};
use crate::show::{
    clean, mask_url, passwords_in_args, scrub, state_name, stats_json, stats_table, task_block,
    task_json, task_table,
};
use crate::units::{rfc3339, short};

/// What a command printed: for people, and for scripts.
struct Output {
    human: String,
    json: Value,
}

/// Why a command did not do what it was asked.
enum Failure {
    /// Exit 1: the task is not there, or not in a state the command can act on. The message
    /// goes to standard error; the document (with `--json`) to standard output.
    NotFound(String, Value),
    /// Exit 2: bad arguments, an unreachable or refusing store, a timeout, …
    Error(String),
}

fn main() -> ExitCode {
    // Every password any argument or variable could carry, so that no output ever shows one
    // (whatever the library, clap or this file formats).
    let mut urls: Vec<String> = std::env::args_os()
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect();
    urls.extend(
        ["TWQ_REDIS", "TWQ_CLUSTER"]
            .iter()
            .filter_map(|name| std::env::var(name).ok())
            .flat_map(|value| value.split(',').map(str::to_owned).collect::<Vec<String>>()),
    );
    let secrets = passwords_in_args(&urls);

    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage(&error, &secrets),
    };
    // (Not clap's `requires`: it misses a global --queue when the URL comes from TWQ_REDIS.)
    if (cli.redis.is_some() || cli.cluster.is_some()) && cli.queue.is_none() {
        let message = "the following required arguments were not provided: --queue <NAME> \
                       (with --redis or --cluster) (see twq --help)";
        return fail(2, message, &secrets);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            return fail(2, &format!("cannot start a runtime: {error}"), &secrets);
        }
    };
    let json = cli.json;
    let outcome = runtime.block_on(run(&cli));
    // A call given up on may leave the library retrying or a file being opened on a
    // blocking thread: do not wait for them.
    runtime.shutdown_background();
    match outcome {
        Ok(output) => {
            let text = if json {
                format!("{:#}\n", output.json)
            } else {
                output.human
            };
            print_out(&scrub(&text, &secrets));
            ExitCode::SUCCESS
        }
        Err(Failure::NotFound(message, document)) => {
            if json {
                print_out(&scrub(&format!("{document:#}\n"), &secrets));
            }
            fail(1, &message, &secrets)
        }
        Err(Failure::Error(message)) => fail(2, &message, &secrets),
    }
}

/// A clap error: help and version on standard output (exit 0); anything else as one line on
/// standard error (exit 2).
fn usage(error: &clap::Error, secrets: &[String]) -> ExitCode {
    match error.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            print_out(&scrub(&error.to_string(), secrets));
            ExitCode::SUCCESS
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            eprint!("{}", scrub(&error.to_string(), secrets));
            ExitCode::from(2)
        }
        _ => {
            let text = error.to_string();
            let lines: Vec<&str> = text
                .lines()
                .take_while(|line| !line.starts_with("Usage:"))
                .filter(|line| !line.starts_with("For more information"))
                .map(str::trim)
                .filter(|line| !line.is_empty())
                .collect();
            let message = lines.join(" ");
            let message = message.strip_prefix("error: ").unwrap_or(&message);
            fail(2, &format!("{message} (see twq --help)"), secrets)
        }
    }
}

fn print_out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    // A closed pipe (`twq … | head`) is not an error worth a panic.
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
}

fn fail(code: u8, message: &str, secrets: &[String]) -> ExitCode {
    let line = message.replace(['\n', '\r'], " ");
    eprintln!("twq: {}", scrub(&line, secrets));
    ExitCode::from(code)
}

/// What the queue is, for messages: the file, or the queue's name and masked URL.
fn target(cli: &Cli) -> String {
    if let Some(path) = &cli.file {
        return path.display().to_string();
    }
    let name = cli.queue.as_deref().unwrap_or_default();
    match (&cli.redis, &cli.cluster) {
        (Some(url), _) => format!("queue {name:?} on {}", mask_url(url)),
        (None, Some(urls)) => {
            let urls: Vec<String> = urls.iter().map(|url| mask_url(url)).collect();
            format!("queue {name:?} on cluster {}", urls.join(","))
        }
        (None, None) => format!("queue {name:?}"),
    }
}

/// Opens the queue, runs the command, closes the queue.
async fn run(cli: &Cli) -> Result<Output, Failure> {
    let target = target(cli);
    let wheel = Wheel::new();
    let queue = within(cli.timeout, &target, open(cli, &wheel)).await?;
    let result = match &cli.command {
        Command::Dashboard(args) => board::serve(cli, args, &queue, &wheel, &target).await,
        _ => execute(cli, &queue, &target).await,
    };
    // Releases the file's lock (or the Redis connection) before exiting; nothing was claimed,
    // so this returns at once.
    let _ = tokio::time::timeout(cli.timeout, queue.close()).await;
    result
}

async fn open(cli: &Cli, wheel: &Wheel) -> Result<DurableQueue, Failure> {
    // Commands that only look open a Redis queue read-only: nothing is written to the
    // server (not even the partition count a handle records), and a queue that is not there
    // is reported as such rather than shown empty.
    let looks = matches!(
        cli.command,
        Command::Stats
            | Command::List(_)
            | Command::Get { .. }
            | Command::Recurring(RecurringCommand::List { .. })
            | Command::Dashboard(_)
    );
    let builder = DurableQueue::builder()
        .partitions(cli.partitions)
        .read_only(looks);
    let name = cli.queue.as_deref().unwrap_or_default();
    if let Some(url) = &cli.redis {
        return builder
            .redis(url, name, wheel)
            .await
            .map_err(|e| store_error(e, &target(cli)));
    }
    if let Some(urls) = &cli.cluster {
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        return builder
            .redis_cluster(&urls, name, wheel)
            .await
            .map_err(|e| store_error(e, &target(cli)));
    }
    let path = cli.file.as_deref().unwrap_or(Path::new(""));
    // Opening creates a missing file: only `schedule` may (a typo must not make a new store).
    if !matches!(cli.command, Command::Schedule(_)) && !path.exists() {
        return Err(Failure::Error(format!(
            "{}: no such file (only `twq schedule` creates a store)",
            path.display()
        )));
    }
    builder
        .open(path, wheel)
        .await
        .map_err(|e| store_error(e, &target(cli)))
}

/// `call`, given up on after `timeout`.
async fn within<T>(
    timeout: Duration,
    target: &str,
    call: impl Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    tokio::time::timeout(timeout, call).await.map_err(|_| {
        Failure::Error(format!(
            "{target}: no answer within {} (unreachable? see --timeout)",
            short(timeout)
        ))
    })?
}

fn store_error(error: Error, target: &str) -> Failure {
    if let Error::NoQueue(_) = &error {
        // Exit 1: the queue named is not there (a misspelt --queue?).
        let message = error.to_string();
        return Failure::NotFound(
            message.clone(),
            json!({"found": false, "queue": target, "message": message}),
        );
    }
    Failure::Error(match error {
        Error::Locked => format!(
            "{target} is locked by another process (an app holds it open): stop that app, or \
             inspect the queue from inside it"
        ),
        Error::Denied(_) => format!("{target}: access denied: {error}"),
        error => format!("{target}: {error}"),
    })
}

async fn execute(cli: &Cli, queue: &DurableQueue, target: &str) -> Result<Output, Failure> {
    let store = |e: Error| store_error(e, target);
    // One call to the store, given up on after --timeout.
    macro_rules! call {
        ($call:expr) => {
            within(cli.timeout, target, async { $call.await.map_err(store) }).await?
        };
    }
    let now = SystemTime::now();
    match &cli.command {
        Command::Stats => {
            let stats = call!(queue.stats());
            let mut json = stats_json(&stats);
            json["queue"] = json!(target);
            Ok(Output {
                human: stats_table(target.strip_prefix("queue ").unwrap_or(target), &stats),
                json,
            })
        }
        Command::List(list) => {
            let (filter, name) = match list.state {
                StateArg::Pending => (TaskFilter::Pending, "pending"),
                StateArg::InFlight => (TaskFilter::InFlight, "in-flight"),
                StateArg::Dead => (TaskFilter::Dead, "dead"),
            };
            let cursor = match &list.cursor {
                Some(text) => Some(text.parse::<Cursor>().map_err(|_| {
                    Failure::Error(format!(
                        "--cursor: {} is not a cursor (pass the one a previous page printed)",
                        clean(text)
                    ))
                })?),
                None => None,
            };
            let limit = usize::from(list.limit);
            let page = within(cli.timeout, target, async {
                match queue.list_page(filter, cursor.as_ref(), limit).await {
                    // A cursor of another list (pending, in flight, dead).
                    Err(Error::Invalid(why)) => Err(Failure::Error(format!("--cursor: {why}"))),
                    result => result.map_err(store),
                }
            })
            .await?;
            let tasks = page.items;
            let next = page.next.map(|cursor| cursor.to_string());
            let mut human = if tasks.is_empty() {
                format!(
                    "no {name} tasks{}\n",
                    match &list.cursor {
                        Some(cursor) => format!(" after {}", clean(cursor)),
                        None => String::new(),
                    }
                )
            } else {
                task_table(&tasks, now)
            };
            if let Some(next) = &next {
                human.push_str(&format!("next page: --cursor {}\n", shell_word(next)));
            }
            Ok(Output {
                human,
                json: json!({
                    "state": name,
                    "tasks": tasks.iter().map(task_json).collect::<Vec<_>>(),
                    "next_cursor": next,
                }),
            })
        }
        Command::Get { id, payload } => {
            let id = TaskId::from(id.as_str());
            let info = call!(queue.get(&id));
            let Some(info) = info else {
                return Err(not_found(&id, None, "", ""));
            };
            let mut output = Output {
                human: task_block(&info, now),
                json: task_json(&info),
            };
            if *payload {
                // Read after the record: a task finished in between has none any more.
                match call!(queue.payload(&id)) {
                    Some(bytes) => {
                        output.human.push_str(&detail::payload_human(&bytes));
                        output.json["payload"] = detail::payload_json(&bytes);
                    }
                    None => {
                        output
                            .human
                            .push_str("payload: gone (the task was finished meanwhile)\n");
                        output.json["payload"] = Value::Null;
                    }
                }
            }
            Ok(output)
        }
        Command::Schedule(schedule) => {
            let payload = match (&schedule.payload, &schedule.payload_file) {
                (Some(text), _) => text.clone().into_bytes(),
                (None, Some(file)) => read_payload(file)?,
                (None, None) => Vec::new(),
            };
            let mut task = Task::new(payload);
            if let Some(id) = &schedule.id {
                task = task.id(id.as_str());
            }
            if let Some(after) = schedule.when.after {
                task = task.after(after);
            }
            if let Some(at) = schedule.when.at {
                task = task.at(at);
            }
            let given = schedule.id.clone().map(TaskId::from);
            let scheduled = within(cli.timeout, target, async {
                match queue.schedule(task).await {
                    Err(Error::InFlight) => Ok(Err(())),
                    result => result.map(Ok).map_err(store),
                }
            })
            .await?;
            let Ok(id) = scheduled else {
                let id = given.unwrap_or_else(|| TaskId::from(""));
                let message = format!(
                    "task {} is in flight: it cannot be replaced until it is acked, retried or \
                     failed",
                    clean(id.as_str())
                );
                return Err(Failure::NotFound(
                    message.clone(),
                    json!({"id": id.as_str(), "scheduled": false, "state": "in-flight", "message": message}),
                ));
            };
            // What the store made of it (the due time by its clock); a task due now may
            // already be gone to a consumer.
            let info = call!(queue.get(&id));
            let human = match &info {
                Some(info) => format!("scheduled\n{}", task_block(info, SystemTime::now())),
                None => format!("scheduled {}\n", clean(id.as_str())),
            };
            Ok(Output {
                human,
                json: json!({
                    "id": id.as_str(),
                    "scheduled": true,
                    "task": info.as_ref().map(task_json),
                }),
            })
        }
        Command::Cancel { id } => {
            let id = TaskId::from(id.as_str());
            let done = call!(queue.cancel(&id));
            if done {
                return Ok(Output {
                    human: format!("cancelled {}\n", clean(id.as_str())),
                    json: json!({"id": id.as_str(), "cancelled": true}),
                });
            }
            let info = call!(queue.get(&id));
            Err(not_found(&id, info.as_ref(), "cancelled", "cancelled"))
        }
        Command::Reschedule(reschedule) => {
            let id = TaskId::from(reschedule.id.as_str());
            let when = match (reschedule.when.at, reschedule.when.after) {
                (Some(at), _) => at,
                (None, after) => units::after_now(now, after.unwrap_or_default())
                    .map_err(|why| Failure::Error(format!("--after: {why}")))?,
            };
            let done = call!(queue.reschedule(&id, when));
            if done {
                return Ok(Output {
                    human: format!(
                        "rescheduled {} to {} ({})\n",
                        clean(id.as_str()),
                        rfc3339(when, false),
                        units::relative(when, SystemTime::now())
                    ),
                    json: json!({
                        "id": id.as_str(),
                        "rescheduled": true,
                        "due": rfc3339(when, true),
                        "due_ms": units::epoch_ms(when),
                    }),
                });
            }
            let info = call!(queue.get(&id));
            Err(not_found(&id, info.as_ref(), "rescheduled", "rescheduled"))
        }
        Command::Redrive { id } => {
            let id = TaskId::from(id.as_str());
            let done = call!(queue.redrive(&id));
            if done {
                return Ok(Output {
                    human: format!("redriven {} (pending, due now)\n", clean(id.as_str())),
                    json: json!({"id": id.as_str(), "redriven": true}),
                });
            }
            let info = call!(queue.get(&id));
            Err(not_found(&id, info.as_ref(), "redriven", "redriven"))
        }
        Command::PurgeDead { older_than } => {
            let purged = call!(queue.purge_dead(*older_than));
            let age = if older_than.is_zero() {
                String::new()
            } else {
                format!(" older than {}", short(*older_than))
            };
            Ok(Output {
                human: format!(
                    "purged {purged} dead letter{}{age}\n",
                    if purged == 1 { "" } else { "s" }
                ),
                json: json!({"purged": purged, "older_than_ms": u64::try_from(older_than.as_millis()).unwrap_or(u64::MAX)}),
            })
        }
        Command::Dashboard(_) => Err(Failure::Error(
            "the board is served by `board::serve`, not run as one command".into(),
        )),
        Command::Pause | Command::Resume => {
            let pause = matches!(cli.command, Command::Pause);
            if pause {
                call!(queue.pause());
            } else {
                call!(queue.resume());
            }
            let word = if pause { "paused" } else { "resumed" };
            Ok(Output {
                human: format!("{word} {target}\n"),
                json: json!({"queue": target, "paused": pause}),
            })
        }
        Command::Recurring(RecurringCommand::List { limit, cursor }) => {
            recurring_list(cli, queue, target, usize::from(*limit), cursor.as_deref()).await
        }
        Command::Recurring(RecurringCommand::Cancel { id }) => {
            let id = TaskId::from(id.as_str());
            let done = call!(queue.cancel_recurring(&id));
            if done {
                return Ok(Output {
                    human: format!("cancelled recurring schedule {}\n", clean(id.as_str())),
                    json: json!({"id": id.as_str(), "cancelled": true}),
                });
            }
            let info = call!(queue.get(&id));
            let shown = clean(id.as_str());
            let message = match &info {
                None => format!("no recurring schedule {shown}"),
                Some(info) => format!(
                    "{shown} is not a recurring schedule but a {} task: use `twq cancel`",
                    state_name(&info.state)
                ),
            };
            Err(Failure::NotFound(
                message.clone(),
                json!({
                    "id": id.as_str(),
                    "cancelled": false,
                    "state": info.as_ref().map(|info| state_name(&info.state)),
                    "message": message,
                }),
            ))
        }
    }
}

/// Most calls (each through at most 1000 pending entries) one `recurring list` makes.
const RECURRING_CALLS: usize = 100;

/// `recurring list`: pages of the library's `recurring_page` until `limit` schedules, the
/// end, or [`RECURRING_CALLS`] calls.
async fn recurring_list(
    cli: &Cli,
    queue: &DurableQueue,
    target: &str,
    limit: usize,
    given: Option<&str>,
) -> Result<Output, Failure> {
    let mut cursor = match given {
        Some(text) => Some(text.parse::<Cursor>().map_err(|_| {
            Failure::Error(format!(
                "--cursor: {} is not a cursor (pass the one a previous page printed)",
                clean(text)
            ))
        })?),
        None => None,
    };
    let mut items = Vec::new();
    for _ in 0..RECURRING_CALLS {
        let page = within(cli.timeout, target, async {
            match queue
                .recurring_page(cursor.as_ref(), limit - items.len())
                .await
            {
                Err(Error::Invalid(why)) => Err(Failure::Error(format!("--cursor: {why}"))),
                result => result.map_err(|e| store_error(e, target)),
            }
        })
        .await?;
        items.extend(page.items);
        cursor = page.next;
        if cursor.is_none() || items.len() == limit {
            break;
        }
    }
    let next = cursor.map(|cursor| cursor.to_string());
    let mut human = if items.is_empty() {
        format!(
            "no recurring schedules{}\n",
            match given {
                Some(cursor) => format!(" after {}", clean(cursor)),
                None => String::new(),
            }
        )
    } else {
        detail::recurring_table(&items, SystemTime::now())
    };
    if let Some(next) = &next {
        human.push_str(&format!("next page: --cursor {}\n", shell_word(next)));
    }
    Ok(Output {
        human,
        json: json!({
            "recurring": items.iter().map(detail::recurring_json).collect::<Vec<_>>(),
            "next_cursor": next,
        }),
    })
}

/// Exit 1 for a task that `verb` could not act on, saying why from what `get` found.
fn not_found(id: &TaskId, info: Option<&TaskInfo>, key: &str, verb: &str) -> Failure {
    let shown = clean(id.as_str());
    let message = match info.map(|info| &info.state) {
        None => format!("no task {shown}"),
        Some(TaskState::InFlight { attempt, .. }) => format!(
            "task {shown} is in flight (attempt {attempt}): it cannot be {verb} until it is \
             acked, retried or failed"
        ),
        Some(TaskState::Dead { .. }) if verb == "redriven" => {
            format!("task {shown} is dead but was not redriven: it moved meanwhile (try again)")
        }
        Some(TaskState::Dead { .. }) => format!(
            "task {shown} is dead: it cannot be {verb} (`twq redrive` brings it back, \
             `twq purge-dead` removes dead letters)"
        ),
        Some(TaskState::Pending) if verb == "redriven" => {
            format!("task {shown} is pending, not dead: there is nothing to redrive")
        }
        Some(TaskState::Pending) => format!(
            "task {shown} is pending but was not {verb}: it is a recurring schedule (use `twq \
             recurring cancel`), or it moved meanwhile (try again)"
        ),
        Some(_) => format!("task {shown} is in an unknown state: it was not {verb}"),
    };
    let mut document = json!({
        "id": id.as_str(),
        "found": info.is_some(),
        "state": info.map(|info| state_name(&info.state)),
        "message": message,
    });
    if !key.is_empty() {
        document[key] = json!(false);
    }
    Failure::NotFound(message, document)
}

/// A payload from a file, or from standard input for `-`.
fn read_payload(file: &Path) -> Result<Vec<u8>, Failure> {
    let mut payload = Vec::new();
    let result = if file == Path::new("-") {
        std::io::stdin().read_to_end(&mut payload).map(|_| ())
    } else {
        std::fs::read(file).map(|bytes| payload = bytes)
    };
    result.map_err(|e| Failure::Error(format!("{}: {e}", file.display())))?;
    Ok(payload)
}

/// `id` as one shell word: as it is if it needs no quoting, else in single quotes.
fn shell_word(id: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_.@:/+=,%".contains(c);
    if !id.is_empty() && id.chars().all(plain) {
        id.to_owned()
    } else {
        format!("'{}'", clean(id).replace('\'', r"'\''"))
    }
}
