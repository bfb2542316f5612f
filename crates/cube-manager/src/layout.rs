//! Where the large per-project tables keep their records: the tasks and the waiting list.
//!
//! On one store file (redb, memory) a task is under its ID and a waiting-list entry under
//! its own key (`task/ID`, `job/NAME`): the manager holds every shard and reads the
//! whole table. On etcd each is under its project's shard first (`0003/ID`,
//! `0003/task/ID`), so that a manager taking a dead one's shards reads only what it takes
//! (the tables of 200,000 tasks and their waiting list took 3.3 s to read whole, to keep
//! half). The shard is the project's in the cluster's ring, whose size never changes once
//! the cluster is made. A record written under its plain key by an older Cube, or
//! imported from an export, is moved under its shard when a manager starts
//! ([`move_to_shards`]).

use cube_store::{EtcdDb, Optimistic, Store, StoreError, Unchanged};
use cube_types::queue::QueueEntry;
use cube_types::shard::ShardScope;
use cube_types::task::Task;
use uuid::Uuid;

/// How the keys of tasks and waiting-list entries are made in a manager's store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyLayout {
    /// Under their own key: one store file, one manager holding every shard.
    #[default]
    Plain,
    /// Under their project's shard of a ring of `ring` first: etcd.
    Sharded { ring: u32 },
}

impl KeyLayout {
    /// The store key of the task `id` of `project` (no project: `default`).
    pub fn task(&self, project: &str, id: Uuid) -> String {
        match self.prefix_of(project) {
            Some(prefix) => format!("{prefix}{id}"),
            None => id.to_string(),
        }
    }

    /// The store key of `task`.
    pub fn task_of(&self, task: &Task) -> String {
        self.task(&task.spec.project, task.id)
    }

    /// The store key of the waiting-list entry under `key` (`task/ID`, `job/NAME`) of
    /// `project`.
    pub fn queue(&self, project: &str, key: &str) -> String {
        match self.prefix_of(project) {
            Some(prefix) => format!("{prefix}{key}"),
            None => key.to_string(),
        }
    }

    /// Every key the task `id` may be under, its project unknown: one per shard.
    pub fn task_anywhere(&self, id: Uuid) -> Vec<String> {
        match self {
            KeyLayout::Plain => vec![id.to_string()],
            KeyLayout::Sharded { ring } => (0..*ring)
                .map(|shard| format!("{}{id}", shard_prefix(shard)))
                .collect(),
        }
    }

    /// The key prefixes that hold the records of `scope`'s shards; `None` when a read of
    /// them is a read of the whole table (the plain layout, or every shard held).
    pub fn prefixes(&self, scope: &ShardScope) -> Option<Vec<String>> {
        match self {
            KeyLayout::Sharded { ring } if *ring == scope.ring() && !scope.is_whole() => {
                Some(scope.shards().into_iter().map(shard_prefix).collect())
            }
            _ => None,
        }
    }

    fn prefix_of(&self, project: &str) -> Option<String> {
        match self {
            KeyLayout::Plain => None,
            KeyLayout::Sharded { ring } => Some(shard_prefix(cube_types::shard::shard_of(
                cube_types::project::name_or_default(project),
                *ring,
            ))),
        }
    }
}

/// The prefix of a shard's records: its number in four digits (a ring holds at most 4,096
/// shards) and a slash.
fn shard_prefix(shard: u32) -> String {
    format!("{shard:04}/")
}

/// `key` without the shard prefix a sharded layout put before it: the plain key, as
/// `cube store import` writes it (the first manager on the target moves it under its
/// shard again, in that cluster's ring).
pub fn plain_key(key: &str) -> &str {
    match key.split_once('/') {
        Some((shard, rest)) if shard.len() == 4 && shard.bytes().all(|b| b.is_ascii_digit()) => {
            rest
        }
        _ => key,
    }
}

/// How many records [`move_to_shards`] moved, of each table.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    pub tasks: usize,
    pub queue: usize,
}

/// One record to move from its plain key to its shard's, keys relative to the store's
/// prefix (`tasks/ID` → `tasks/0003/ID`).
struct Move {
    from: String,
    to: String,
    value: Vec<u8>,
    /// The plain key's `mod_revision` when read.
    revision: i64,
}

/// How many records one transaction moves: each is two keys compared and two written, and
/// a transaction takes 128 of each.
const MOVES_AT_ONCE: usize = 64;

/// Moves every task and waiting-list entry kept under its plain key to its key in
/// `layout`, on etcd: each move writes the shard key and deletes the plain one in one
/// transaction, only if the plain key is as read and the shard key absent, 64 moves a
/// transaction. A move that finds its shard key written (a manager that moved it first,
/// or wrote it since) only deletes the plain key, if that is still as read. Safe to run
/// from several managers at once and again after a crash half-way: a record is never lost
/// nor kept twice, and a newer write is never replaced by an older one. Reads the whole
/// tables: a manager runs it at start only while `meta`'s [`LAYOUT_KEY`] does not say it
/// was done.
pub async fn move_to_shards(
    db: &EtcdDb,
    tasks: &dyn Store<Task>,
    queue: &dyn Store<QueueEntry>,
    layout: KeyLayout,
) -> Result<Moved, StoreError> {
    let mut moves = Vec::new();
    for (key, task, revision) in tasks.list_with_revision()?.entries {
        if plain_key(&key) == key {
            moves.push(a_move(
                "tasks",
                &key,
                &layout.task_of(&task),
                &task,
                revision,
            )?);
        }
    }
    let tasks_moved = moves.len();
    for (key, entry, revision) in queue.list_with_revision()?.entries {
        if plain_key(&key) == key {
            let to = layout.queue(entry.project(), &key);
            moves.push(a_move("queue", &key, &to, &entry, revision)?);
        }
    }
    let moved = Moved {
        tasks: tasks_moved,
        queue: moves.len() - tasks_moved,
    };
    for batch in moves.chunks(MOVES_AT_ONCE) {
        let unchanged: Vec<Unchanged> = batch.iter().flat_map(compared).collect();
        let puts = batch.iter().flat_map(written).collect();
        if let Optimistic::Changed { .. } = db.write_if_unchanged(&unchanged, puts, None).await? {
            // Another manager moved some of them first: each on its own.
            for one in batch {
                move_alone(db, one).await?;
            }
        }
    }
    Ok(moved)
}

fn a_move<V: serde::Serialize>(
    table: &str,
    from: &str,
    to: &str,
    value: &V,
    revision: u64,
) -> Result<Move, StoreError> {
    Ok(Move {
        from: format!("{table}/{from}"),
        to: format!("{table}/{to}"),
        value: serde_json::to_vec(value).map_err(|source| StoreError::Encode {
            key: from.to_string(),
            source,
        })?,
        revision: i64::try_from(revision).unwrap_or(i64::MAX),
    })
}

/// What a move needs unchanged: the plain key as read, the shard key absent.
fn compared(one: &Move) -> [Unchanged; 2] {
    [
        Unchanged {
            key: one.from.clone(),
            mod_revision: one.revision,
        },
        Unchanged {
            key: one.to.clone(),
            mod_revision: 0,
        },
    ]
}

fn written(one: &Move) -> [(String, Option<Vec<u8>>); 2] {
    [
        (one.to.clone(), Some(one.value.clone())),
        (one.from.clone(), None),
    ]
}

/// One move after its batch lost a race: moved if still as read; the plain key only
/// deleted when the shard key is written already; left alone when the plain key changed
/// (what changed it is not a manager of this layout: it is said, and kept).
async fn move_alone(db: &EtcdDb, one: &Move) -> Result<(), StoreError> {
    let Optimistic::Changed { now } = db
        .write_if_unchanged(&compared(one), written(one).into(), None)
        .await?
    else {
        return Ok(());
    };
    let plain_now = now.iter().find(|key| key.key == one.from);
    let shard_written = now.iter().any(|key| key.key == one.to);
    match plain_now {
        // Moved by another manager.
        None => Ok(()),
        Some(plain) if plain.mod_revision == one.revision && shard_written => {
            let only_plain = [Unchanged {
                key: one.from.clone(),
                mod_revision: one.revision,
            }];
            db.write_if_unchanged(&only_plain, vec![(one.from.clone(), None)], None)
                .await
                .map(|_| ())
        }
        Some(_) => {
            tracing::warn!(key = %one.from, "a record under its plain key changed while it was moved under its shard; left where it is");
            Ok(())
        }
    }
}

/// Puts `stores` in `layout` (a manager on etcd, at start): moves what an older Cube or an
/// import left under plain keys (once: `meta`'s [`LAYOUT_KEY`] remembers it was done), and
/// has `stores` make their keys so from now on. What was moved.
pub async fn settle(
    stores: &mut crate::ManagerStores,
    db: &EtcdDb,
    layout: KeyLayout,
) -> Result<Moved, StoreError> {
    stores.layout = layout;
    let KeyLayout::Sharded { ring } = layout else {
        return Ok(Moved::default());
    };
    if stores.meta.get(LAYOUT_KEY)? == Some(u64::from(ring)) {
        return Ok(Moved::default());
    }
    let moved = move_to_shards(db, &*stores.tasks, &*stores.queue, layout).await?;
    stores.meta.put(LAYOUT_KEY, &u64::from(ring))?;
    Ok(moved)
}

/// The `meta` key that says the tasks and the waiting list are under their shards: its value
/// is the ring they were moved for.
pub const LAYOUT_KEY: &str = "key_layout_ring";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_keys_are_the_records_own_and_sharded_ones_start_with_the_projects_shard() {
        let id = Uuid::from_u128(7);
        assert_eq!(KeyLayout::Plain.task("p-1", id), id.to_string());
        assert_eq!(KeyLayout::Plain.queue("p-1", "job/p-1/web"), "job/p-1/web");
        let sharded = KeyLayout::Sharded { ring: 16 };
        let shard = cube_types::shard::shard_of("p-1", 16);
        assert_eq!(sharded.task("p-1", id), format!("{shard:04}/{id}"));
        assert_eq!(
            sharded.queue("p-1", "job/p-1/web"),
            format!("{shard:04}/job/p-1/web")
        );
        // No project is `default`'s.
        assert_eq!(sharded.task("", id), sharded.task("default", id));
        // The task is under one of the keys tried for its ID alone.
        assert!(sharded.task_anywhere(id).contains(&sharded.task("p-1", id)));
        assert_eq!(sharded.task_anywhere(id).len(), 16);
    }

    #[test]
    fn a_shard_prefix_is_taken_off_and_nothing_else() {
        assert_eq!(plain_key("0003/task/abc"), "task/abc");
        assert_eq!(plain_key("0003/0f3e-9"), "0f3e-9");
        assert_eq!(plain_key("task/abc"), "task/abc");
        assert_eq!(plain_key("job/p-1/web"), "job/p-1/web");
        // A task's ID may begin with four digits: no slash follows them.
        assert_eq!(
            plain_key("0003a1b2-0000-0000-0000-000000000000"),
            "0003a1b2-0000-0000-0000-000000000000"
        );
    }

    #[test]
    fn prefixes_are_read_only_for_some_shards_of_the_same_ring() {
        let sharded = KeyLayout::Sharded { ring: 16 };
        assert_eq!(
            sharded.prefixes(&ShardScope::of(16, [3, 12])),
            Some(vec!["0003/".to_string(), "0012/".to_string()])
        );
        assert_eq!(sharded.prefixes(&ShardScope::all(16)), None);
        assert_eq!(KeyLayout::Plain.prefixes(&ShardScope::of(16, [3])), None);
    }
}
