//! The command line: global options (which queue, how to print, how long to wait) and one
//! subcommand.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};

use crate::units::{parse_duration, parse_time};

/// Inspect and operate a tokio-wheel-durable task queue: an embedded redb file, or a queue on
/// Redis or Redis Cluster.
///
/// Exit status: 0 done; 1 the task named is not there, or not in a state the command can act
/// on (the message says which); 2 an error (bad arguments, unreachable or refusing server,
/// file locked by a running app, timeout).
#[derive(Debug, Parser)]
#[command(name = "twq", version, max_term_width = 100)]
#[command(group(ArgGroup::new("backend").required(true).args(["redis", "cluster", "file"])))]
pub(crate) struct Cli {
    /// A queue on Redis: redis://host:port/, with a password redis://:password@host:port/
    /// (an ACL user: user:password@; rediss:// for TLS). The password is never printed; put
    /// the URL in TWQ_REDIS to keep it out of the process list.
    #[arg(long, value_name = "URL", env = "TWQ_REDIS", hide_env_values = true)]
    #[arg(global = true, help_heading = "Queue")]
    pub(crate) redis: Option<String>,

    /// A queue on Redis Cluster, through any of its nodes (comma-separated URLs).
    #[arg(
        long,
        value_name = "URL,URL…",
        env = "TWQ_CLUSTER",
        hide_env_values = true
    )]
    #[arg(
        value_delimiter = ',',
        requires = "queue",
        global = true,
        help_heading = "Queue"
    )]
    pub(crate) cluster: Option<Vec<String>>,

    /// The queue's name on Redis (required with --redis and --cluster).
    #[arg(
        long,
        short,
        value_name = "NAME",
        env = "TWQ_QUEUE",
        hide_env_values = true
    )]
    #[arg(global = true, help_heading = "Queue")]
    pub(crate) queue: Option<String>,

    /// How many partitions the Redis queue is spread over (as its apps open it). Needed only
    /// by commands that change the queue: stats, list, get and recurring list read the count
    /// from the queue (they open it read-only and write nothing to the server).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        global = true,
        help_heading = "Queue"
    )]
    pub(crate) partitions: usize,

    /// An embedded store (a redb file). It must not be open in a running app (the app holds a
    /// lock). Only `schedule` creates a missing file.
    #[arg(
        long,
        short,
        value_name = "PATH",
        env = "TWQ_FILE",
        hide_env_values = true
    )]
    #[arg(global = true, help_heading = "Queue")]
    pub(crate) file: Option<PathBuf>,

    /// Print one JSON document instead of tables.
    #[arg(long, global = true, help_heading = "Output")]
    pub(crate) json: bool,

    /// Give up on a call (connecting included) after this long.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    #[arg(global = true, help_heading = "Output")]
    pub(crate) timeout: Duration,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Counts (pending, in flight, dead) and counters since the queue was created.
    Stats,
    /// A page of tasks in one state: pending in due order, in flight by lease end, dead in
    /// the order they died.
    List(List),
    /// One task: state, due time, attempts, payload length, reason.
    Get {
        /// The task's id.
        id: String,
        /// Show the payload too: as text if it is UTF-8 (control characters escaped), else
        /// in hex; with --json as `payload.base64` (always) and `payload.text` (UTF-8 only).
        #[arg(long)]
        payload: bool,
    },
    /// Schedule a task (an existing pending or dead task of that id is replaced).
    Schedule(Schedule),
    /// Cancel a pending task.
    Cancel {
        /// The task's id.
        id: String,
    },
    /// Move a pending task to another due time.
    Reschedule(Reschedule),
    /// Move a dead letter back to pending, due now, its attempt count reset.
    Redrive {
        /// The dead letter's id.
        id: String,
    },
    /// Delete the dead letters that died more than a duration ago (0s: all of them).
    PurgeDead {
        /// E.g. 7d, 12h, 0s.
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        older_than: Duration,
    },
    /// Recurring schedules.
    #[command(subcommand)]
    Recurring(RecurringCommand),
    /// Stop every worker of the queue, in every process, from being handed tasks (scheduling
    /// goes on; it holds across restarts) until `resume`.
    Pause,
    /// Let the workers of a paused queue claim again (idle ones are woken).
    Resume,
    /// Serve the web board: overview with a chart, lists, search by id, task pages,
    /// recurring schedules and actions. Runs until Ctrl-C. Looking writes nothing to Redis:
    /// the pages read through a read-only handle, and the handle that writes is opened at
    /// the first action.
    Dashboard(Dashboard),
}

#[derive(Debug, Args)]
pub(crate) struct Dashboard {
    /// Where to listen. Loopback unless told otherwise; any other address needs
    /// --token-file.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub(crate) listen: std::net::SocketAddr,
    /// Show no action and refuse every POST (403).
    #[arg(long)]
    pub(crate) read_only: bool,
    /// A file holding the token every request must carry (`?token=…` once in a browser, or
    /// `Authorization: Bearer …`).
    #[arg(long, value_name = "FILE")]
    pub(crate) token_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum StateArg {
    Pending,
    InFlight,
    Dead,
}

#[derive(Debug, Args)]
pub(crate) struct List {
    /// Which tasks.
    pub(crate) state: StateArg,
    /// At most this many (at most 1000).
    #[arg(long, short = 'n', value_name = "N", default_value_t = 20)]
    #[arg(value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub(crate) limit: u16,
    /// Where to start: the cursor a previous page printed (a position in the list, so it
    /// stays valid whatever happens to the task it was taken at).
    #[arg(long, value_name = "CURSOR")]
    pub(crate) cursor: Option<String>,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("body").required(true).args(["payload", "payload_file"])))]
pub(crate) struct Schedule {
    /// The payload, as text.
    #[arg(long, value_name = "TEXT")]
    pub(crate) payload: Option<String>,
    /// The payload, read from a file (`-`: standard input).
    #[arg(long, value_name = "FILE")]
    pub(crate) payload_file: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) when: OptionalWhen,
    /// The task's id (default: a generated one).
    #[arg(long, value_name = "ID")]
    pub(crate) id: Option<String>,
}

/// When a task is due, if given (default: now).
#[derive(Debug, Args)]
#[group(multiple = false)]
pub(crate) struct OptionalWhen {
    /// Due after this delay (30s, 10m, 1h30m, 250ms, 2d), by the store's clock.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) after: Option<Duration>,
    /// Due at this time: RFC 3339, e.g. 2026-11-25T21:00:00Z.
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub(crate) at: Option<SystemTime>,
}

#[derive(Debug, Args)]
pub(crate) struct Reschedule {
    /// The task's id.
    pub(crate) id: String,
    #[command(flatten)]
    pub(crate) when: When,
}

/// When a task is due: exactly one of the two.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub(crate) struct When {
    /// Due after this delay from now (30s, 10m, 1h30m, 250ms, 2d), by this machine's clock.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) after: Option<Duration>,
    /// Due at this time: RFC 3339, e.g. 2026-11-25T21:00:00Z.
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub(crate) at: Option<SystemTime>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum RecurringCommand {
    /// A page of recurring schedules, in order of their next due time: kind (every period or
    /// cron expression), next occurrence, catch-up rule, payload length. Schedules are kept
    /// among the pending tasks, so this looks through the pending list, 1000 entries per
    /// call to the store, at most 100 calls per page: on a larger backlog a page may be
    /// short and still print a next cursor.
    List {
        /// At most this many (at most 1000).
        #[arg(long, short = 'n', value_name = "N", default_value_t = 20)]
        #[arg(value_parser = clap::value_parser!(u16).range(1..=1000))]
        limit: u16,
        /// Where to start: the cursor a previous page printed.
        #[arg(long, value_name = "CURSOR")]
        cursor: Option<String>,
    },
    /// Remove a recurring schedule (occurrences already made stay: cancel them as tasks).
    Cancel {
        /// The schedule's id.
        id: String,
    },
}
