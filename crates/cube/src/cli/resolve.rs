//! Finding the task a user means, as Docker finds a container: by its full ID, by a unique
//! prefix of its ID, or by its exact name when no other task has it — or, when tasks share
//! the name (a task that ended and its re-run), the one of them that has not ended.

use anyhow::anyhow;
use cube_types::{State, Task};
use uuid::Uuid;

use super::ManagerClient;
use super::output::table;

/// What a user's word for a task matched among the manager's tasks.
#[derive(Debug, PartialEq)]
pub enum TaskMatch<'a> {
    One(&'a Task),
    None,
    /// More than one task; the user must say more. In the manager's order.
    Several(Vec<&'a Task>),
}

/// Matches `query` against `tasks`: a full ID (with or without dashes) picks its task
/// whatever the names say; otherwise every task whose ID starts with `query` (ignoring case,
/// with or without dashes) or whose name is exactly `query` is a candidate, and only a single
/// candidate is a match. Deliberately strict: stopping the wrong task is worse than asking
/// for a longer prefix.
pub fn match_task<'a>(tasks: &'a [Task], query: &str) -> TaskMatch<'a> {
    let query = query.trim();
    if query.is_empty() {
        return TaskMatch::None;
    }
    if let Ok(id) = Uuid::parse_str(query)
        && let Some(task) = tasks.iter().find(|task| task.id == id)
    {
        return TaskMatch::One(task);
    }
    let prefix = query.to_ascii_lowercase();
    let mut candidates: Vec<&Task> = tasks
        .iter()
        .filter(|task| {
            task.name == query
                || task.id.hyphenated().to_string().starts_with(&prefix)
                || task.id.simple().to_string().starts_with(&prefix)
        })
        .collect();
    match candidates.len() {
        0 => TaskMatch::None,
        1 => TaskMatch::One(candidates.remove(0)),
        _ => {
            // Tasks that share the name asked for, and nothing else: the live one, when one
            // alone is live (a name is run again once its last run ended).
            let by_name_only = candidates.iter().all(|task| task.name == query);
            let live: Vec<&Task> = candidates
                .iter()
                .copied()
                .filter(|task| !is_ended(task))
                .collect();
            if by_name_only && live.len() == 1 {
                TaskMatch::One(live[0])
            } else {
                TaskMatch::Several(candidates)
            }
        }
    }
}

/// A task whose run is over and that will not run again by itself: Completed, Failed or Lost
/// with no restart to come. `cube status` leaves these out unless asked.
pub fn is_ended(task: &Task) -> bool {
    matches!(
        task.status.state,
        State::Completed | State::Failed | State::Lost
    ) && task.status.next_restart.is_none()
}

/// The one task `query` names, from the manager's list, or an error that says why not: no
/// task matches, or which tasks it could mean.
pub async fn find_task(manager: &ManagerClient, query: &str) -> anyhow::Result<Task> {
    let tasks: Vec<Task> = manager.get("/tasks").await?;
    match match_task(&tasks, query) {
        TaskMatch::One(task) => Ok(task.clone()),
        TaskMatch::None => Err(not_found(manager, query).await),
        TaskMatch::Several(candidates) => Err(anyhow!(
            "{query:?} matches {} tasks; give more of the ID:\n{}",
            candidates.len(),
            candidate_lines(&candidates).join("\n")
        )),
    }
}

/// Why `query` names no task of the command's project: and, when it names a task of another
/// project the token holds in, which one and how to reach it (a task run with `--project
/// team-a` is not found by a command without it). One more read, on this path only; when it
/// cannot be made (an older manager, a token for one project), the plain answer.
async fn not_found(manager: &ManagerClient, query: &str) -> anyhow::Error {
    let plain = format!("no task matches {query:?} (by ID, ID prefix or name)");
    let here = manager
        .project
        .as_deref()
        .unwrap_or(cube_types::project::DEFAULT_PROJECT);
    if here == cube_types::project::ALL_PROJECTS {
        return anyhow!(
            "{plain} in any project the token holds in; list the tasks with: cube status \
             --project '*'"
        );
    }
    let everywhere: Vec<Task> = manager
        .get("/tasks?project=*&summary=true")
        .await
        .unwrap_or_default();
    let elsewhere: Vec<Task> = everywhere
        .into_iter()
        .filter(|task| task.spec.project != here)
        .collect();
    match match_task(&elsewhere, query) {
        TaskMatch::One(task) => anyhow!(
            "{plain} in project {here}; task {} ({}) is in project {}: give --project {}",
            task.name,
            task.short_id(),
            task.spec.project,
            task.spec.project
        ),
        TaskMatch::Several(candidates) => {
            let mut projects: Vec<&str> = candidates
                .iter()
                .map(|task| task.spec.project.as_str())
                .collect();
            projects.sort_unstable();
            projects.dedup();
            anyhow!(
                "{plain} in project {here}; {} tasks of project{} {} match it: give --project \
                 NAME and more of the ID",
                candidates.len(),
                if projects.len() == 1 { "" } else { "s" },
                projects.join(", ")
            )
        }
        TaskMatch::None => anyhow!(
            "{plain} in project {here}; list the tasks with: cube status{}, or every \
             project's with: cube status --project '*'",
            if here == cube_types::project::DEFAULT_PROJECT {
                String::new()
            } else {
                format!(" --project {here}")
            }
        ),
    }
}

/// One indented line per candidate: short ID, name and state, aligned.
fn candidate_lines(candidates: &[&Task]) -> Vec<String> {
    let rows: Vec<Vec<String>> = candidates
        .iter()
        .map(|task| {
            vec![
                task.short_id(),
                task.name.clone(),
                task.status.state.name().to_string(),
            ]
        })
        .collect();
    table(&rows)
        .into_iter()
        .map(|line| format!("  {line}"))
        .collect()
}

/// Runs `one` on each task the user named, in order: `cube stop`, `cube restart` and `cube rm`
/// take several. With one task, its error is the command's. With several, each failure is said
/// on stderr and the others go on; the command then fails naming them ("2 of 3 tasks not
/// stopped: a, b"). With `-o json`, what each answered is printed: alone when one task was
/// named, as a list otherwise.
pub async fn each_named<'a, T, F, Fut>(
    names: &'a [String],
    output: super::OutputFormat,
    not_done: &str,
    mut one: F,
) -> anyhow::Result<()>
where
    T: serde::Serialize,
    F: FnMut(&'a str) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let mut shown = Vec::new();
    let mut failed = Vec::new();
    for name in names {
        match one(name).await {
            Ok(answer) => shown.extend(answer),
            Err(err) if names.len() == 1 => return Err(err),
            Err(err) => {
                eprintln!("cube: {name}: {err:#}");
                failed.push(name.as_str());
            }
        }
    }
    if output == super::OutputFormat::Json {
        match shown.as_slice() {
            [one] if names.len() == 1 => super::output::print_json(one)?,
            _ => super::output::print_json(&shown)?,
        }
    }
    anyhow::ensure!(
        failed.is_empty(),
        "{} of {} tasks not {not_done}: {}",
        failed.len(),
        names.len(),
        failed.join(", ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: &str, name: &str) -> Task {
        let mut task = Task::new(name, "cube-sample:latest");
        task.id = Uuid::parse_str(id).unwrap();
        task
    }

    fn tasks() -> Vec<Task> {
        vec![
            task("3f2a9c1e-0000-4000-8000-000000000001", "web"),
            task("3f88aa01-0000-4000-8000-000000000002", "db"),
            task("bb1d59ef-9fc1-4e4b-a44d-db571eeed203", "cache"),
            task("c0ffee00-0000-4000-8000-000000000004", "twin"),
            task("d00d0000-0000-4000-8000-000000000005", "twin"),
        ]
    }

    fn matched_name(tasks: &[Task], query: &str) -> Option<String> {
        match match_task(tasks, query) {
            TaskMatch::One(task) => Some(task.name.clone()),
            _ => None,
        }
    }

    #[test]
    fn a_unique_prefix_finds_its_task() {
        let tasks = tasks();
        assert_eq!(matched_name(&tasks, "3f2"), Some("web".to_string()));
        assert_eq!(matched_name(&tasks, "BB1D"), Some("cache".to_string()));
        assert_eq!(
            matched_name(&tasks, "bb1d59ef-9fc1"),
            Some("cache".to_string())
        );
        assert_eq!(
            matched_name(&tasks, "bb1d59ef9fc1"),
            Some("cache".to_string())
        );
    }

    #[test]
    fn a_full_id_finds_its_task() {
        let tasks = tasks();
        assert_eq!(
            matched_name(&tasks, "bb1d59ef-9fc1-4e4b-a44d-db571eeed203"),
            Some("cache".to_string())
        );
    }

    #[test]
    fn an_ambiguous_prefix_lists_every_candidate() {
        let tasks = tasks();
        match match_task(&tasks, "3f") {
            TaskMatch::Several(candidates) => {
                let names: Vec<&str> = candidates.iter().map(|t| t.name.as_str()).collect();
                assert_eq!(names, vec!["web", "db"]);
                assert_eq!(
                    candidate_lines(&candidates),
                    vec!["  3f2a9c1e   web   Pending", "  3f88aa01   db    Pending"]
                );
            }
            other => panic!("expected several, got {other:?}"),
        }
    }

    #[test]
    fn nothing_matches_an_unknown_prefix_or_an_empty_word() {
        let tasks = tasks();
        assert_eq!(match_task(&tasks, "ffff"), TaskMatch::None);
        assert_eq!(match_task(&tasks, ""), TaskMatch::None);
        assert_eq!(match_task(&tasks, "  "), TaskMatch::None);
        assert_eq!(match_task(&[], "3f"), TaskMatch::None);
    }

    #[test]
    fn an_exact_unique_name_finds_its_task() {
        let tasks = tasks();
        assert_eq!(matched_name(&tasks, "db"), Some("db".to_string()));
        assert_eq!(matched_name(&tasks, "cache"), Some("cache".to_string()));
        assert_eq!(match_task(&tasks, "cach"), TaskMatch::None);
    }

    #[test]
    fn a_name_resolves_to_the_live_task_after_a_rerun() {
        let mut tasks = tasks();
        tasks[3].status.state = State::Completed;
        assert_eq!(
            match_task(&tasks, "twin"),
            TaskMatch::One(&tasks[4]),
            "the ended run gives way to the one that runs"
        );
        tasks[4].status.state = State::Failed;
        assert!(matches!(match_task(&tasks, "twin"), TaskMatch::Several(_)));
    }

    #[test]
    fn a_name_two_tasks_share_is_ambiguous() {
        let tasks = tasks();
        assert!(matches!(
            match_task(&tasks, "twin"),
            TaskMatch::Several(candidates) if candidates.len() == 2
        ));
    }

    #[test]
    fn a_name_that_is_also_another_tasks_prefix_is_ambiguous() {
        let mut tasks = tasks();
        tasks.push(task("e0000000-0000-4000-8000-000000000006", "bb1d"));
        assert!(matches!(
            match_task(&tasks, "bb1d"),
            TaskMatch::Several(candidates) if candidates.len() == 2
        ));
    }
}
