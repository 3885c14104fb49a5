//! Where durable tasks live: the [`Store`] trait, the embedded [`RedbStore`] and the
//! [`MemoryStore`] for tests.
//!
//! A store is a durable map from task id to [`StoredTask`]. The queue keeps its working state
//! in memory and writes every change through [`Store::apply`] in batches — one transaction per
//! batch, so many concurrent `schedule` calls share one fsync (group commit).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use redb::{Database, ReadableTable, TableDefinition};

use super::Error;

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    /// Waiting for its due time.
    Pending,
    /// Handed to a consumer, under a lease.
    InFlight,
    /// Given up on: in the dead letters.
    Dead,
}

/// A task as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredTask {
    /// The task's id.
    pub id: String,
    /// The opaque payload.
    pub payload: Vec<u8>,
    /// Due time, milliseconds since the Unix epoch.
    pub due_ms: u64,
    /// Schedule order, for ties in due time.
    pub seq: u64,
    /// Deliveries so far.
    pub attempts: u32,
    /// Pending, in flight or dead.
    pub state: TaskState,
    /// For an in-flight task: when its lease ends, milliseconds since the Unix epoch.
    pub lease_until_ms: u64,
    /// For a dead task: why.
    pub reason: String,
}

/// One change to a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mutation {
    /// Insert or replace the task.
    Put(StoredTask),
    /// Delete the task with this id.
    Delete(String),
}

/// A durable home for tasks. Implementations are used from one thread at a time (the queue's
/// engine, through `spawn_blocking`), so they may block.
pub trait Store: Send + 'static {
    /// Every task in the store.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] for unreadable contents, [`Error::Io`] for failed reads.
    fn load(&mut self) -> Result<Vec<StoredTask>, Error>;

    /// Applies the mutations atomically and durably: when this returns `Ok`, they survive a
    /// crash; when it returns `Err`, none of them took effect.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the transaction could not be committed.
    fn apply(&mut self, mutations: &[Mutation]) -> Result<(), Error>;
}

/// A store in memory: for tests, and for queues that need the API without durability.
#[derive(Debug, Default, Clone)]
pub struct MemoryStore {
    tasks: Arc<Mutex<HashMap<String, StoredTask>>>,
}

impl MemoryStore {
    /// An empty store. Clones share their contents, so a test can "restart" a queue on one.
    pub fn new() -> Self {
        MemoryStore::default()
    }
}

impl Store for MemoryStore {
    fn load(&mut self) -> Result<Vec<StoredTask>, Error> {
        Ok(self
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect())
    }

    fn apply(&mut self, mutations: &[Mutation]) -> Result<(), Error> {
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        for mutation in mutations {
            match mutation {
                Mutation::Put(task) => {
                    tasks.insert(task.id.clone(), task.clone());
                }
                Mutation::Delete(id) => {
                    tasks.remove(id);
                }
            }
        }
        Ok(())
    }
}

const TASKS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("tasks");

/// The embedded store: one [redb](https://docs.rs/redb) file.
///
/// Opening takes the file's lock; a second open, in this process or another, fails with
/// [`Error::Locked`]. A file that is not a task store is reported as [`Error::Corrupt`] and
/// left untouched; an empty file becomes a new store.
pub struct RedbStore {
    database: Database,
    /// Removes the path from the in-process registry when dropped.
    _claim: PathClaim,
}

impl fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedbStore")
            .field("path", &self._claim.0)
            .finish()
    }
}

/// Paths this process has open: redb's file lock may not exclude a second open from the same
/// process on every platform, so the queue refuses it itself.
fn open_paths() -> &'static Mutex<HashSet<PathBuf>> {
    static PATHS: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    PATHS.get_or_init(Default::default)
}

struct PathClaim(PathBuf);

impl Drop for PathClaim {
    fn drop(&mut self) {
        open_paths()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.0);
    }
}

impl RedbStore {
    /// Opens (or creates) the store at `path`. Blocks on file I/O.
    ///
    /// # Errors
    ///
    /// [`Error::Locked`], [`Error::Corrupt`] or [`Error::Io`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
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
        if !open_paths()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(canonical.clone())
        {
            return Err(Error::Locked);
        }
        let claim = PathClaim(canonical);
        let database = redb::Builder::new()
            .set_check_integrity_on_open(true)
            .create(path)
            .map_err(database_error)?;
        let write = database
            .begin_write()
            .map_err(|e| Error::Io(e.to_string()))?;
        write
            .open_table(TASKS)
            .map_err(|e| Error::Corrupt(e.to_string()))?;
        write.commit().map_err(|e| Error::Io(e.to_string()))?;
        Ok(RedbStore {
            database,
            _claim: claim,
        })
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

impl Store for RedbStore {
    fn load(&mut self) -> Result<Vec<StoredTask>, Error> {
        use redb::ReadableDatabase;
        let read = self
            .database
            .begin_read()
            .map_err(|e| Error::Io(e.to_string()))?;
        let table = read
            .open_table(TASKS)
            .map_err(|e| Error::Corrupt(e.to_string()))?;
        let mut tasks = Vec::new();
        for entry in table.iter().map_err(|e| Error::Io(e.to_string()))? {
            let (id, record) = entry.map_err(|e| Error::Io(e.to_string()))?;
            tasks.push(decode(id.value(), record.value())?);
        }
        Ok(tasks)
    }

    fn apply(&mut self, mutations: &[Mutation]) -> Result<(), Error> {
        let write = self
            .database
            .begin_write()
            .map_err(|e| Error::Io(e.to_string()))?;
        {
            let mut table = write
                .open_table(TASKS)
                .map_err(|e| Error::Io(e.to_string()))?;
            let mut buffer = Vec::new();
            for mutation in mutations {
                match mutation {
                    Mutation::Put(task) => {
                        encode(task, &mut buffer);
                        table
                            .insert(task.id.as_str(), buffer.as_slice())
                            .map_err(|e| Error::Io(e.to_string()))?;
                    }
                    Mutation::Delete(id) => {
                        table
                            .remove(id.as_str())
                            .map_err(|e| Error::Io(e.to_string()))?;
                    }
                }
            }
        }
        write.commit().map_err(|e| Error::Io(e.to_string()))
    }
}

/// Record layout, version 1: `[1][state][due u64][seq u64][attempts u32][lease u64]
/// [reason length u32][reason][payload]`, integers little-endian.
const RECORD_VERSION: u8 = 1;
const HEADER: usize = 1 + 1 + 8 + 8 + 4 + 8 + 4;

fn encode(task: &StoredTask, buffer: &mut Vec<u8>) {
    buffer.clear();
    buffer.push(RECORD_VERSION);
    buffer.push(match task.state {
        TaskState::Pending => 0,
        TaskState::InFlight => 1,
        TaskState::Dead => 2,
    });
    buffer.extend_from_slice(&task.due_ms.to_le_bytes());
    buffer.extend_from_slice(&task.seq.to_le_bytes());
    buffer.extend_from_slice(&task.attempts.to_le_bytes());
    buffer.extend_from_slice(&task.lease_until_ms.to_le_bytes());
    buffer.extend_from_slice(&(task.reason.len() as u32).to_le_bytes());
    buffer.extend_from_slice(task.reason.as_bytes());
    buffer.extend_from_slice(&task.payload);
}

fn decode(id: &str, record: &[u8]) -> Result<StoredTask, Error> {
    let corrupt = |why: &str| Error::Corrupt(format!("task {id:?}: {why}"));
    if record.len() < HEADER || record[0] != RECORD_VERSION {
        return Err(corrupt("unknown record format"));
    }
    let u64_at = |at: usize| u64::from_le_bytes(record[at..at + 8].try_into().expect("8 bytes"));
    let u32_at = |at: usize| u32::from_le_bytes(record[at..at + 4].try_into().expect("4 bytes"));
    let state = match record[1] {
        0 => TaskState::Pending,
        1 => TaskState::InFlight,
        2 => TaskState::Dead,
        _ => return Err(corrupt("unknown state")),
    };
    let reason_len = u32_at(30) as usize;
    let reason = record
        .get(HEADER..HEADER + reason_len)
        .ok_or_else(|| corrupt("truncated reason"))?;
    Ok(StoredTask {
        id: id.to_owned(),
        state,
        due_ms: u64_at(2),
        seq: u64_at(10),
        attempts: u32_at(18),
        lease_until_ms: u64_at(22),
        reason: String::from_utf8_lossy(reason).into_owned(),
        payload: record[HEADER + reason_len..].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: &str, state: TaskState) -> StoredTask {
        StoredTask {
            id: id.into(),
            payload: b"payload".to_vec(),
            due_ms: 1_700_000_000_000,
            seq: 42,
            attempts: 3,
            state,
            lease_until_ms: 99,
            reason: "because".into(),
        }
    }

    #[test]
    fn records_round_trip() {
        for state in [TaskState::Pending, TaskState::InFlight, TaskState::Dead] {
            let original = task("t-1", state);
            let mut buffer = Vec::new();
            encode(&original, &mut buffer);
            assert_eq!(decode("t-1", &buffer).unwrap(), original);
        }
    }

    #[test]
    fn damaged_records_are_corrupt_not_panics() {
        let mut buffer = Vec::new();
        encode(&task("t", TaskState::Pending), &mut buffer);
        for cut in 0..HEADER {
            assert!(matches!(
                decode("t", &buffer[..cut]),
                Err(Error::Corrupt(_))
            ));
        }
        buffer[1] = 9;
        assert!(matches!(decode("t", &buffer), Err(Error::Corrupt(_))));
    }
}
