//! Where a page of tasks starts (`?next=` of `GET /tasks` and `GET /jobs/{name}`).
//!
//! Lists of tasks are in one order everywhere: oldest first (`CreatedTime`), then by ID. A
//! page token is the **position** of the next page's first task in that order, not the task
//! itself: a page goes on from there whether or not that task is still held here — removed
//! since, or, with `--shard-controllers`, its shard now held by another manager. So a read
//! of every project (`?project=*`) pages with one token that every manager answers alike,
//! whichever shards each holds by then (`cube::gather`).
//!
//! A token of an older Cube, a bare task ID, is still read: the page starts at that task,
//! which must be held here.

use chrono::{DateTime, Utc};
use cube_types::Task;
use uuid::Uuid;

/// A task's place in the lists' order; the order of this type is that order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PagePosition {
    pub created: Option<DateTime<Utc>>,
    pub id: Uuid,
}

impl PagePosition {
    pub fn of(task: &Task) -> PagePosition {
        PagePosition {
            created: task.status.created_time,
            id: task.id,
        }
    }

    /// The position of a task as a list shows it in JSON (`ID`, `CreatedTime`), as it
    /// would be read back: `None` for anything else.
    pub fn of_json(task: &serde_json::Value) -> Option<PagePosition> {
        let id = Uuid::parse_str(task.get("ID")?.as_str()?).ok()?;
        let created = match task.get("CreatedTime") {
            None | Some(serde_json::Value::Null) => None,
            Some(text) => {
                let time = DateTime::parse_from_rfc3339(text.as_str()?)
                    .ok()?
                    .with_timezone(&Utc);
                // Read as the task's own JSON reads it: Go's zero time is "unset".
                (chrono::Datelike::year(&time) > 1).then_some(time)
            }
        };
        Some(PagePosition { created, id })
    }

    /// The token: `p`, the creation time as seconds and nanoseconds since the epoch (empty
    /// when unset), `_`, the ID. Nothing in it needs escaping in a URL.
    pub fn token(&self) -> String {
        match self.created {
            Some(time) => format!(
                "p{}.{:09}_{}",
                time.timestamp(),
                time.timestamp_subsec_nanos(),
                self.id
            ),
            None => format!("p_{}", self.id),
        }
    }

    /// A token [`PagePosition::token`] wrote; `None` for anything else.
    pub fn parse(token: &str) -> Option<PagePosition> {
        let (time, id) = token.strip_prefix('p')?.split_once('_')?;
        let id = Uuid::parse_str(id).ok()?;
        let created = if time.is_empty() {
            None
        } else {
            let (seconds, nanos) = time.split_once('.')?;
            if nanos.len() != 9 {
                return None;
            }
            Some(DateTime::from_timestamp(
                seconds.parse().ok()?,
                nanos.parse().ok()?,
            )?)
        };
        Some(PagePosition { created, id })
    }
}

/// Where a page starts, as its `?next=` token says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageStart {
    /// At this position, whatever is held there now.
    At(PagePosition),
    /// At this task, which must be held (an older Cube's token).
    Task(Uuid),
}

impl PageStart {
    /// `token` read, or `None` when it is neither a position nor a task ID.
    pub fn parse(token: &str) -> Option<PageStart> {
        if let Some(position) = PagePosition::parse(token) {
            return Some(PageStart::At(position));
        }
        Uuid::parse_str(token).ok().map(PageStart::Task)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_reads_back_from_its_token_and_from_its_task_as_json() {
        let id = Uuid::new_v4();
        for created in [
            None,
            DateTime::from_timestamp(1_764_549_000, 123_456_789),
            DateTime::from_timestamp(1_764_549_000, 0),
            DateTime::from_timestamp(-5, 7),
        ] {
            let position = PagePosition { created, id };
            let token = position.token();
            assert!(
                token
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
                "{token}"
            );
            assert_eq!(PagePosition::parse(&token), Some(position), "{token}");
            assert_eq!(PageStart::parse(&token), Some(PageStart::At(position)));
            let mut json = serde_json::json!({ "ID": id.to_string() });
            if let Some(time) = created {
                json["CreatedTime"] = serde_json::Value::String(time.to_rfc3339());
            }
            assert_eq!(PagePosition::of_json(&json), Some(position), "{json}");
        }
    }

    #[test]
    fn positions_order_as_lists_do_oldest_first_then_by_id() {
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let early = DateTime::from_timestamp(100, 0);
        let late = DateTime::from_timestamp(100, 1);
        let mut positions = vec![
            PagePosition {
                created: late,
                id: a,
            },
            PagePosition {
                created: early,
                id: b,
            },
            PagePosition {
                created: early,
                id: a,
            },
        ];
        positions.sort();
        assert_eq!(
            positions,
            vec![
                PagePosition {
                    created: early,
                    id: a
                },
                PagePosition {
                    created: early,
                    id: b
                },
                PagePosition {
                    created: late,
                    id: a
                },
            ]
        );
    }

    #[test]
    fn an_older_token_is_a_task_id_and_anything_else_is_no_token() {
        let id = Uuid::new_v4();
        assert_eq!(PageStart::parse(&id.to_string()), Some(PageStart::Task(id)));
        for bad in [
            "",
            "p",
            "p_",
            "p1.5_x",
            "p1.12345678_0",
            "gABC",
            "8f0e-11",
            "p1_x",
        ] {
            assert_eq!(PageStart::parse(bad), None, "{bad}");
        }
    }
}
