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

use cube_store::{Expected, Store, StoreError};
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
            KeyLayout::Sharded { ring } if *ring == scope.ring() && !scope.is_whole() => Some(
                scope
                    .shards()
                    .into_iter()
                    .map(shard_prefix)
                    .collect(),
            ),
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

/// Moves every task and waiting-list entry kept under its plain key to its key in
/// `layout`: written there if nothing is (a manager that moved it first, or wrote it since,
/// wins), then deleted from the plain key. Safe to run from several managers at once and
/// again after a crash half-way: a record is never lost (it is written before it is
/// deleted) nor kept twice once a run ends. Reads the whole tables: a manager runs it at
/// start only while `meta`'s [`LAYOUT_KEY`] does not say it was done.
pub fn move_to_shards(
    tasks: &dyn Store<Task>,
    queue: &dyn Store<QueueEntry>,
    layout: KeyLayout,
) -> Result<Moved, StoreError> {
    let mut moved = Moved::default();
    if layout == KeyLayout::Plain {
        return Ok(moved);
    }
    for (key, task, _) in tasks.list_with_revision()?.entries {
        let target = layout.task_of(&task);
        if plain_key(&key) != key || key == target {
            continue;
        }
        move_one(tasks, &key, &target, &task)?;
        moved.tasks += 1;
    }
    for (key, entry, _) in queue.list_with_revision()?.entries {
        let target = layout.queue(entry.project(), &key);
        if is_queue_shard_key(&key) || key == target {
            continue;
        }
        move_one(queue, &key, &target, &entry)?;
        moved.queue += 1;
    }
    Ok(moved)
}

/// Whether a waiting-list key is under a shard already (`0003/task/ID`); a plain one is
/// `task/ID` or `job/NAME`.
fn is_queue_shard_key(key: &str) -> bool {
    plain_key(key) != key
}

fn move_one<V>(store: &dyn Store<V>, from: &str, to: &str, value: &V) -> Result<(), StoreError> {
    // Taken already (another manager moved it, or wrote it since): only the old copy goes.
    let _ = store.put_if(to, value, Expected::Absent)?;
    store.delete(from)?;
    Ok(())
}

/// Puts `stores` in `layout` (a manager on etcd, at start): moves what an older Cube or an
/// import left under plain keys (once: `meta`'s [`LAYOUT_KEY`] remembers it was done), and
/// has `stores` make their keys so from now on. What was moved, when anything was.
pub fn settle(
    stores: &mut crate::ManagerStores,
    layout: KeyLayout,
) -> Result<Moved, StoreError> {
    stores.layout = layout;
    let KeyLayout::Sharded { ring } = layout else {
        return Ok(Moved::default());
    };
    if stores.meta.get(LAYOUT_KEY)? == Some(u64::from(ring)) {
        return Ok(Moved::default());
    }
    let moved = move_to_shards(&*stores.tasks, &*stores.queue, layout)?;
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
