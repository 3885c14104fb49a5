//! Where durable tasks live: the [`Store`] trait, the embedded [`RedbStore`] and the
//! [`MemoryStore`] for tests.
//!
//! A store is a handful of ordered byte-keyed [`Table`]s with transactions. The queue keeps
//! its tasks *in the store*, not in memory: the records, the payloads and the indexes it
//! pages through (pending tasks by due time, dead letters by time of death, tasks in flight)
//! are all tables. An open queue holds in memory only what its process has in flight, so its
//! memory does not grow with the backlog, and opening it reads nothing but the tasks a
//! previous holder left in flight.
//!
//! Every change the queue makes in one step goes through one [`Store::transact`] call (one
//! transaction, one fsync on redb), so many concurrent `schedule` calls share one commit
//! (group commit).
//!
//! Implementing a store: keep each table's entries ordered by key bytes, and make
//! [`Store::transact`] all or nothing (the queue relies on a failed transaction leaving no
//! trace). [`MemoryStore`] is a complete example in a few dozen lines.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::Error;

/// The tables of a store. Keys and values are opaque bytes to the store; the queue defines
/// their layout (the format is versioned in [`Table::Meta`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// Task id → the task's record (state, due time, attempts, reason…), without its payload.
    Records,
    /// Task id → payload, read only when the task is handed out or inspected.
    Payloads,
    /// Due time and schedule order → id: the pending tasks, in delivery order.
    Pending,
    /// Time of death and schedule order → id: the dead letters, oldest first.
    Dead,
    /// Task id → nothing: the tasks handed out and not yet finished.
    InFlight,
    /// Name → value: the format version, the schedule counter, the queue's counters.
    Meta,
}

impl Table {
    /// Every table, in a fixed order.
    pub const ALL: [Table; 6] = [
        Table::Records,
        Table::Payloads,
        Table::Pending,
        Table::Dead,
        Table::InFlight,
        Table::Meta,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// Entries of a table, in key order: `(key, value)`.
pub type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// The operations of one transaction, as [`Store::transact`] hands them to the queue.
pub trait Transaction {
    /// The value under `key`.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] for a failed read.
    fn get(&mut self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, Error>;

    /// Sets `key` to `value`, replacing any value.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] for a failed write.
    fn insert(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<(), Error>;

    /// Removes `key` (nothing if absent).
    ///
    /// # Errors
    ///
    /// [`Error::Io`] for a failed write.
    fn remove(&mut self, table: Table, key: &[u8]) -> Result<(), Error>;

    /// Up to `limit` entries in key order: from the first, or from the first key after
    /// `after` (exclusive).
    ///
    /// # Errors
    ///
    /// [`Error::Io`] for a failed read.
    fn range(&mut self, table: Table, after: Option<&[u8]>, limit: usize)
    -> Result<Entries, Error>;

    /// How many entries the table holds (in constant time: the queue asks often).
    ///
    /// # Errors
    ///
    /// [`Error::Io`] for a failed read.
    fn len(&mut self, table: Table) -> Result<u64, Error>;
}

/// The work of one transaction: the queue's step, run against the store's tables.
pub type Work<'w> = dyn FnMut(&mut dyn Transaction) -> Result<(), Error> + 'w;

/// A durable home for tasks. Implementations are used from one thread at a time (the queue's
/// engine, through `spawn_blocking`), so they may block.
pub trait Store: Send + 'static {
    /// Runs `work` in one transaction. If `work` returns `Ok`, commits: when this returns
    /// `Ok`, every change survives a crash. If `work` (or the commit) fails, none of its
    /// changes take effect and this returns the error.
    ///
    /// # Errors
    ///
    /// What `work` returned, or [`Error::Io`] when the transaction could not be committed.
    fn transact(&mut self, work: &mut Work<'_>) -> Result<(), Error>;

    /// The queue stops using this store: it is dropped after at most one more transaction,
    /// with no handle left to use it. A store that others may be waiting to open (a file)
    /// can let them wait for the drop rather than refuse them. Does nothing by default.
    fn closing(&self) {}
}

/// A store in memory: for tests, and for queues that need the API without durability.
#[derive(Debug, Default, Clone)]
pub struct MemoryStore {
    tables: Arc<Mutex<[MemoryTable; 6]>>,
}

type MemoryTable = BTreeMap<Vec<u8>, Vec<u8>>;

impl MemoryStore {
    /// An empty store. Clones share their contents, so a test can "restart" a queue on one.
    pub fn new() -> Self {
        MemoryStore::default()
    }
}

/// A transaction on a [`MemoryStore`]: changes apply at once and are undone from a log if the
/// work fails.
struct MemoryTransaction<'a> {
    tables: &'a mut [MemoryTable; 6],
    undo: Vec<(Table, Vec<u8>, Option<Vec<u8>>)>,
}

impl Transaction for MemoryTransaction<'_> {
    fn get(&mut self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.tables[table.index()].get(key).cloned())
    }

    fn insert(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<(), Error> {
        let old = self.tables[table.index()].insert(key.to_vec(), value.to_vec());
        self.undo.push((table, key.to_vec(), old));
        Ok(())
    }

    fn remove(&mut self, table: Table, key: &[u8]) -> Result<(), Error> {
        if let Some(old) = self.tables[table.index()].remove(key) {
            self.undo.push((table, key.to_vec(), Some(old)));
        }
        Ok(())
    }

    fn range(
        &mut self,
        table: Table,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Entries, Error> {
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        Ok(self.tables[table.index()]
            .range::<[u8], _>((start, Bound::Unbounded))
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn len(&mut self, table: Table) -> Result<u64, Error> {
        Ok(self.tables[table.index()].len() as u64)
    }
}

impl Store for MemoryStore {
    fn transact(&mut self, work: &mut Work<'_>) -> Result<(), Error> {
        let mut tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        let mut transaction = MemoryTransaction {
            tables: &mut tables,
            undo: Vec::new(),
        };
        let result = work(&mut transaction);
        if result.is_err() {
            while let Some((table, key, old)) = transaction.undo.pop() {
                let map = &mut transaction.tables[table.index()];
                match old {
                    Some(value) => map.insert(key, value),
                    None => map.remove(&key),
                };
            }
        }
        result
    }
}

type RedbTable = TableDefinition<'static, &'static [u8], &'static [u8]>;

const REDB_TABLES: [RedbTable; 6] = [
    TableDefinition::new("records"),
    TableDefinition::new("payloads"),
    TableDefinition::new("pending"),
    TableDefinition::new("dead"),
    TableDefinition::new("inflight"),
    TableDefinition::new("meta"),
];

/// The table of the first format (one record with its payload per task), read once to
/// migrate a store written by an earlier version.
pub(crate) const LEGACY_TASKS: TableDefinition<'static, &'static str, &'static [u8]> =
    TableDefinition::new("tasks");

/// redb's page cache: what the store may keep of the file in memory. Small, so an open queue's
/// memory stays bounded whatever the backlog (hot pages — the heads of the indexes — stay).
const CACHE_BYTES: usize = 32 << 20;

/// The embedded store: one [redb](https://docs.rs/redb) file.
///
/// Opening takes the file's lock; a second open, in this process or another, fails with
/// [`Error::Locked`]. A store of this process whose queue is closing (its last handle just
/// dropped: the engine returns buffered claims, then lets go of the file, in milliseconds) is
/// waited for instead, at most 10 s, so an open right after the drop gets the file (open
/// from a blocking context: [`DurableQueue::open`](crate::DurableQueue::open) does). A file
/// that is not a task store is reported as [`Error::Corrupt`] and left untouched; an empty
/// file becomes a new store. redb's page cache is limited to 32 MiB.
pub struct RedbStore {
    /// `None` only between a failed reopen and the next try.
    database: Option<Database>,
    /// The last transaction failed on the file itself: redb then refuses every later one
    /// ("Previous I/O error occurred. Please close and re-open the database"), so the next
    /// transaction reopens the file first — the same handle works again once the disk does.
    reopen: bool,
    /// Removes the path from the in-process registry when dropped; the path reopens from.
    claim: PathClaim,
}

impl RedbStore {
    /// The store's path as this process's registry of open stores names it (canonical).
    pub(crate) fn path(&self) -> &Path {
        &self.claim.0
    }
}

impl fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedbStore")
            .field("path", &self.claim.0)
            .finish()
    }
}

/// Paths this process has open: redb's file lock may not exclude a second open from the same
/// process on every platform, so the queue refuses it itself. A store whose handles are all
/// gone is closing, and an open waits for it to let go ([`CLOSING_WAIT`]).
struct OpenPaths {
    paths: Mutex<HashMap<PathBuf, Claimed>>,
    released: Condvar,
}

/// What holds an open path.
enum Claimed {
    /// A store, with a way to tell whether every handle of its queue is gone (once a queue
    /// has been made on it: [`watch_handles`]).
    Held(Option<Box<dyn Fn() -> bool + Send>>),
    /// Its engine said it is closing ([`Store::closing`]).
    Closing,
}

impl Claimed {
    /// Whether a handle may still use the store: an open must then be refused.
    fn in_use(&self) -> bool {
        match self {
            Claimed::Held(None) => true,
            Claimed::Held(Some(every_handle_gone)) => !every_handle_gone(),
            Claimed::Closing => false,
        }
    }
}

/// The queue made on the store at `path` (as [`RedbStore::path`] names it) has no handle
/// left once `every_handle_gone` says so: from then on an open of the path waits for the
/// store to close, even before its engine has noticed (the last handle's drop wakes it, and
/// it lets go of the file some milliseconds later).
pub(crate) fn watch_handles(path: &Path, every_handle_gone: impl Fn() -> bool + Send + 'static) {
    if let Some(claimed @ Claimed::Held(None)) = open_paths().lock().get_mut(path) {
        *claimed = Claimed::Held(Some(Box::new(every_handle_gone)));
    }
}

fn open_paths() -> &'static OpenPaths {
    static PATHS: OnceLock<OpenPaths> = OnceLock::new();
    PATHS.get_or_init(|| OpenPaths {
        paths: Mutex::default(),
        released: Condvar::new(),
    })
}

impl OpenPaths {
    fn lock(&self) -> MutexGuard<'_, HashMap<PathBuf, Claimed>> {
        self.paths.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims `path`: `false` if a store holds it for a handle. A store that is closing is
    /// waited for, at most [`CLOSING_WAIT`].
    fn claim(&self, path: &Path) -> bool {
        let mut paths = self.lock();
        let waited = self
            .released
            .wait_timeout_while(paths, CLOSING_WAIT, |paths| {
                paths.get(path).is_some_and(|claimed| !claimed.in_use())
            });
        paths = waited.unwrap_or_else(|e| e.into_inner()).0;
        if paths.contains_key(path) {
            return false;
        }
        paths.insert(path.to_owned(), Claimed::Held(None));
        true
    }
}

/// How long an open waits for a store of this process that is closing (its last handle
/// dropped, its engine returning buffered claims and letting go of the file: milliseconds).
/// Without it, an open right after the drop answered `Locked` for a few milliseconds.
const CLOSING_WAIT: Duration = Duration::from_secs(10);

struct PathClaim(PathBuf);

impl Drop for PathClaim {
    fn drop(&mut self) {
        open_paths().lock().remove(&self.0);
        open_paths().released.notify_all();
    }
}

fn io(error: impl fmt::Display) -> Error {
    Error::Io(error.to_string())
}

impl RedbStore {
    /// Opens (or creates) the store at `path`. Blocks on file I/O. Reads nothing but redb's
    /// header and table roots: the cost does not grow with the backlog (after a crash, redb
    /// itself first checks and repairs the file).
    ///
    /// # Errors
    ///
    /// [`Error::Locked`], [`Error::Corrupt`] or [`Error::Io`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        RedbStore::open_checked(path, false)
    }

    /// Opens the store at `path`, first verifying the checksum of every page if `verify`
    /// (redb's integrity check: reads the whole file, so it takes time in proportion to its
    /// size; a file changed behind redb's back is then reported as [`Error::Corrupt`]).
    ///
    /// # Errors
    ///
    /// [`Error::Locked`], [`Error::Corrupt`] or [`Error::Io`].
    pub fn open_checked(path: impl AsRef<Path>, verify: bool) -> Result<Self, Error> {
        let path = path.as_ref();
        // Canonicalize through the parent so a file that does not exist yet still has one name.
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let name = path
            .file_name()
            .ok_or_else(|| Error::Io(format!("{} is not a file path", path.display())))?;
        let canonical = parent
            .canonicalize()
            .map_err(|e| Error::Io(format!("{}: {e}", parent.display())))?
            .join(name);
        if !open_paths().claim(&canonical) {
            return Err(Error::Locked);
        }
        let claim = PathClaim(canonical);
        let database = redb::Builder::new()
            .set_check_integrity_on_open(verify)
            .set_cache_size(CACHE_BYTES)
            .create(path)
            .map_err(database_error)?;
        let write = database.begin_write().map_err(io)?;
        for table in REDB_TABLES {
            write
                .open_table(table)
                .map_err(|e| Error::Corrupt(e.to_string()))?;
        }
        write.commit().map_err(io)?;
        Ok(RedbStore {
            database: Some(database),
            reopen: false,
            claim,
        })
    }

    /// The database, reopened first after a failure of the file (see `reopen`).
    fn database(&mut self) -> Result<&Database, Error> {
        if self.reopen || self.database.is_none() {
            // Closed first: redb holds the file's lock while open.
            self.database = None;
            let database = redb::Builder::new()
                .set_cache_size(CACHE_BYTES)
                .create(&self.claim.0)
                .map_err(database_error)?;
            tracing::info!(path = %self.claim.0.display(), "store reopened after an I/O error");
            self.reopen = false;
            self.database = Some(database);
        }
        Ok(self.database.as_ref().expect("just opened"))
    }

    /// The records of the first format, if the file has any: `(id, record)` pages of up to
    /// `limit`, from after `after`. Used once, to migrate them.
    pub(crate) fn legacy_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, Error> {
        use redb::ReadableDatabase;
        let read = self.opened()?.begin_read().map_err(io)?;
        let table = match read.open_table(LEGACY_TASKS) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(Error::Corrupt(e.to_string())),
        };
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut page = Vec::new();
        for entry in table.range::<&str>((start, Bound::Unbounded)).map_err(io)? {
            let (id, record) = entry.map_err(io)?;
            page.push((id.value().to_owned(), record.value().to_vec()));
            if page.len() == limit {
                break;
            }
        }
        Ok(page)
    }

    /// The database as it is (the migration runs right after open).
    fn opened(&self) -> Result<&Database, Error> {
        self.database
            .as_ref()
            .ok_or_else(|| Error::Io("the store is closed after an I/O error".to_owned()))
    }

    /// Drops the first format's table once its records were migrated.
    pub(crate) fn drop_legacy(&self) -> Result<(), Error> {
        let write = self.opened()?.begin_write().map_err(io)?;
        write.delete_table(LEGACY_TASKS).map_err(io)?;
        write.commit().map_err(io)
    }
}

fn database_error(error: redb::DatabaseError) -> Error {
    match error {
        redb::DatabaseError::DatabaseAlreadyOpen | redb::DatabaseError::LockProtocolMismatch => {
            Error::Locked
        }
        // redb reports a file that is not a database as invalid data.
        redb::DatabaseError::Storage(redb::StorageError::Io(io))
            if io.kind() == std::io::ErrorKind::InvalidData =>
        {
            Error::Corrupt(io.to_string())
        }
        redb::DatabaseError::Storage(redb::StorageError::Io(io)) => Error::Io(io.to_string()),
        other => Error::Corrupt(other.to_string()),
    }
}

/// A transaction on a [`RedbStore`]: redb's write transaction with every table open.
struct RedbTransaction<'t> {
    tables: Vec<redb::Table<'t, &'static [u8], &'static [u8]>>,
    /// Whether anything was written: a transaction that only read is aborted, not committed.
    dirty: bool,
}

impl Transaction for RedbTransaction<'_> {
    fn get(&mut self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.tables[table.index()]
            .get(key)
            .map_err(io)?
            .map(|value| value.value().to_vec()))
    }

    fn insert(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<(), Error> {
        self.dirty = true;
        self.tables[table.index()].insert(key, value).map_err(io)?;
        Ok(())
    }

    fn remove(&mut self, table: Table, key: &[u8]) -> Result<(), Error> {
        self.dirty = true;
        self.tables[table.index()].remove(key).map_err(io)?;
        Ok(())
    }

    fn range(
        &mut self,
        table: Table,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Entries, Error> {
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut page = Vec::new();
        if limit == 0 {
            return Ok(page);
        }
        for entry in self.tables[table.index()]
            .range::<&[u8]>((start, Bound::Unbounded))
            .map_err(io)?
        {
            let (key, value) = entry.map_err(io)?;
            page.push((key.value().to_vec(), value.value().to_vec()));
            if page.len() == limit {
                break;
            }
        }
        Ok(page)
    }

    fn len(&mut self, table: Table) -> Result<u64, Error> {
        self.tables[table.index()].len().map_err(io)
    }
}

impl Store for RedbStore {
    fn transact(&mut self, work: &mut Work<'_>) -> Result<(), Error> {
        let result = RedbStore::run(self.database()?, work);
        if matches!(result, Err(Error::Io(_))) {
            // Perhaps the file failed (a full disk): redb refuses every later transaction
            // until it is reopened, so the next one reopens it. A plain error of `work`
            // costs one reopen, cheap (redb reads its header and table roots).
            self.reopen = true;
        }
        result
    }

    fn closing(&self) {
        if let Some(claimed) = open_paths().lock().get_mut(&self.claim.0) {
            *claimed = Claimed::Closing;
        }
    }
}

impl RedbStore {
    fn run(database: &Database, work: &mut Work<'_>) -> Result<(), Error> {
        let write = database.begin_write().map_err(io)?;
        let dirty = {
            let mut tables = Vec::with_capacity(REDB_TABLES.len());
            for table in REDB_TABLES {
                tables.push(write.open_table(table).map_err(io)?);
            }
            let mut transaction = RedbTransaction {
                tables,
                dirty: false,
            };
            if let Err(error) = work(&mut transaction) {
                drop(transaction);
                let _ = write.abort();
                return Err(error);
            }
            transaction.dirty
        };
        if dirty {
            write.commit().map_err(io)
        } else {
            write.abort().map_err(io)
        }
    }
}
