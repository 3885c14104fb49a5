//! The embedded backend (the default): tasks in one [redb](https://docs.rs/redb) file (or in
//! memory, for tests), and the engine task that owns the store.
//!
//! - `store.rs`: the [`Store`](store::Store) trait — ordered byte-keyed tables in
//!   transactions — with [`RedbStore`](store::RedbStore) and
//!   [`MemoryStore`](store::MemoryStore);
//! - `tasks.rs`: task records, the due and lease indexes on those tables, and the migration of
//!   first-format files;
//! - `engine/`: the engine (batches, one transaction per step, claims and leases, retries and
//!   dead letters, streams and prefetch).

pub(crate) mod engine;
pub mod store;
pub(crate) mod tasks;
