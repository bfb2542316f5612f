//! Cube's controller framework: the pipeline that drives observed state toward desired state,
//! after the controller field report (watchers → stores → transformers → syncers) and
//! kube-runtime's reflector and runner.
//!
//! - [`store`]: an [`store::ObservedStore`] holds the observed snapshot of one collection, a
//!   revision per change, a bounded change log, change notification and the in-sync flag.
//! - [`syncer`]: the diff of desired against observed (create, update, delete, duplicates,
//!   deleting only what the controller owns): the pure decision a controller takes before it
//!   writes its actions as one batch.
//! - [`marks`]: the keys a pass over a whole collection must read again ([`marks::Marks`]),
//!   so that each change costs a look at its key, not at the collection.
//! - [`runner`]: the keyed delay queue that runs reconciles: one pending entry per key, never
//!   two reconciles of one key at once, bounded concurrency, an error policy, a readiness gate,
//!   panics caught, shutdown that waits.
//!
//! A controller is wired as: its writes go through to the observed records it shares with
//! the others (the manager's write-through cache: a write is durable, then applied in memory,
//! then wakes what it concerns); a change marks keys or wakes a runner; a reconcile reads the
//! observed records, plans what it wants, and writes the difference ([`syncer::diff`]) as
//! one batch. (A watch-fed reflector, a `Watcher` filling an `ObservedStore` from the
//! store's watch, was tried for the jobs and removed: every other kind of record was
//! write-through, and one manager per term is the only writer. Sharded managers that read
//! each other's writes would bring it back.) Every part here is used by Cube's
//! manager or worker: a part no controller uses is deleted, not kept as a framework piece.
//!
//! Invariants: a runner never reconciles one key twice at once; a controller acts only while
//! its observed stores are in sync; a diff deletes only what its controller owns. Decisions are
//! pure and run in one place; IO happens only in the functions the caller hands in
//! (reconciles, sources). This crate knows nothing of tasks, HTTP, Docker or the store engine,
//! and must not learn of them: it is generic over keys and values.

pub mod marks;
pub mod runner;
pub mod store;
pub mod syncer;
