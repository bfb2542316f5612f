//! Cube's controller framework: the pipeline that drives observed state toward desired state,
//! after the controller field report (watchers → stores → transformers → syncers) and
//! kube-runtime's reflector and runner.
//!
//! - [`watcher`]: a [`watcher::Watcher`] lists a collection from a [`watcher::Source`], then
//!   follows its changes; when it falls behind or loses its source it says so (the store
//!   loses sync) and lists again, with backoff. [`watcher::StoreSource`] makes any store a
//!   source, through its change index.
//! - [`store`]: an [`store::ObservedStore`] holds the observed snapshot of one collection, a
//!   revision per change, a bounded change log, change notification and the in-sync flag.
//! - [`transformer`]: pure functions from observed collections to a desired collection, and
//!   the reconciliation mask that says whether a change is one a transformer reads.
//! - [`syncer`]: the diff of desired against observed (create, update, delete, duplicates,
//!   deleting only what the controller owns) and a [`syncer::Syncer`] that carries it out
//!   through an [`syncer::Executor`], only while both sides are in sync.
//! - [`marks`]: the keys a pass over a whole collection must read again ([`marks::Marks`]),
//!   so that each change costs a look at its key, not at the collection.
//! - [`runner`]: the keyed delay queue that runs reconciles: one pending entry per key, never
//!   two reconciles of one key at once, bounded concurrency, an error policy, a readiness gate,
//!   panics caught, shutdown that waits.
//!
//! A controller is wired as: watchers fill observed stores; [`transformer::run_transformer`]
//! turns observed stores into a desired store (in sync exactly while its inputs are); a
//! [`syncer::Syncer`] compares the desired store with an observed one and acts.
//!
//! Invariants: a runner never reconciles one key twice at once; nothing is executed while an
//! input is out of sync; a syncer deletes only what its controller owns. Decisions are pure
//! and run in one place; IO happens only in the functions the caller hands in (reconciles,
//! executors, sources). This crate knows nothing of tasks, HTTP, Docker or the store engine,
//! and must not learn of them: it is generic over keys and values.

pub mod marks;
pub mod runner;
pub mod store;
pub mod syncer;
pub mod transformer;
pub mod watcher;
