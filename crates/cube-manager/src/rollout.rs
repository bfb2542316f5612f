//! Rolling updates: how a `service` job's deployment stands, and how each of its groups may
//! replace copies in this look. Pure, like the job transformer that calls it
//! ([`crate::jobs::plan`]): the job, its deployment as stored, the copies and the time in;
//! the deployment as it should now be stored, a [`Mode`] per group, what to go back to and
//! when to look again out.
//!
//! The rules (the README's "Rolling updates"):
//! - Every version of a service job has one deployment, started by the first look at the
//!   version. A copy whose spec is the group's template is *new*, any other live copy *old*.
//! - A new copy counts once it has been healthy (`HealthySince`) for `MinHealthyTime`.
//!   `MaxParallel` minus the new copies that do not count yet is how many old copies may be
//!   replaced now: never fewer than `Count - MaxParallel` copies are healthy.
//! - A new copy made by this deployment that fails (ends, is restarted, or is unhealthy) or
//!   does not count by `HealthyDeadline` fails the deployment; so does a group that sees no
//!   new copy count for `ProgressDeadline`. A failed deployment replaces nothing more; with
//!   `AutoRevert` the job goes back to its last stable version.
//! - With `Canary` N (and old copies to replace), N new copies start beside the old ones,
//!   and once they count the deployment is `paused` until the job is promoted.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use cube_types::State;
use cube_types::Task;
use cube_types::deployment::{Deployment, DeploymentGroup, DeploymentState, UpdateSettings};
use cube_types::job::JobRecord;
use uuid::Uuid;

use crate::copies::{has_current_spec, is_live, template_of};

/// How a group's copies whose spec changed are replaced in this look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every changed copy at once: batch jobs, and a service whose deployment succeeded.
    AtOnce,
    /// None: the deployment failed or was cancelled, and the old copies that run keep
    /// running. Missing copies are still made, from the job's template.
    Frozen,
    /// Canaries: keep the old copies, and this many new ones beside them.
    Canary { canaries: usize },
    /// Replace up to this many old copies now.
    Rolling { slots: usize },
}

/// What [`assess`] decided for one look at a service job.
#[derive(Debug, Clone)]
pub struct Rollout {
    /// The deployment as it stands after this look.
    pub deployment: Deployment,
    /// Whether it differs from the one read (new, progressed, changed state): to be stored.
    pub changed: bool,
    /// How each group replaces copies in this look, by group name.
    pub modes: BTreeMap<String, Mode>,
    /// The version to go back to: the deployment failed, with `AutoRevert`.
    pub revert_to: Option<u64>,
    /// When a deadline or `MinHealthyTime` next passes for the deployment.
    pub look_again_at: Option<DateTime<Utc>>,
}

impl Rollout {
    /// How `group` replaces copies (a group unknown to the deployment: at once).
    pub fn mode_of(&self, group: &str) -> Mode {
        self.modes.get(group).copied().unwrap_or(Mode::AtOnce)
    }
}

/// A deployment that is over because the job was stopped; `None` when there is nothing
/// active to end.
pub fn cancelled(
    deployment: Option<&Deployment>,
    reason: String,
    now: DateTime<Utc>,
) -> Option<Deployment> {
    let deployment = deployment.filter(|deployment| deployment.is_active())?;
    let mut ended = deployment.clone();
    ended.state = DeploymentState::Cancelled;
    ended.reason = reason;
    ended.modify_time = Some(now);
    Some(ended)
}

/// The new deployment of `record`'s version. A group gets canaries only when it has old
/// copies for them to stand beside, and a revert deploys without any.
fn started(record: &JobRecord, owned: &[&Task], now: DateTime<Utc>) -> Deployment {
    let groups = record
        .job
        .groups
        .iter()
        .enumerate()
        .map(|(group_index, group)| {
            let mut update = UpdateSettings::of(group.update.as_ref());
            if record.revert_of.is_some() {
                update.canary = 0;
            }
            let template = template_of(record, group_index, owned);
            let has_old = owned.iter().any(|task| {
                task.spec.group == group.name && is_live(task) && !has_current_spec(task, &template)
            });
            let canaries = if has_old { update.canary } else { 0 };
            let settings = DeploymentGroup {
                update,
                desired: group.count.unwrap_or(0),
                desired_canaries: canaries,
                promoted: false,
                placed: 0,
                healthy: 0,
                unhealthy: 0,
                old: 0,
                progress_time: Some(now),
            };
            (group.name.clone(), settings)
        })
        .collect();
    Deployment {
        id: Uuid::new_v4(),
        job: record.job.key(),
        version: record.version,
        state: DeploymentState::Running,
        reason: String::new(),
        create_time: Some(now),
        modify_time: Some(now),
        reverted_to: None,
        groups,
    }
}

/// How one group stands in this look.
struct GroupLook {
    /// The first new copy that failed, and how.
    failure: Option<String>,
    /// Every new copy counts, and no old copy is left.
    done: bool,
    /// Canaries are wanted, not promoted, and all of them count.
    canaries_ready: bool,
    in_canary_phase: bool,
    /// New copies to keep during the canary phase.
    canary_target: usize,
    /// Old copies that may be replaced now.
    slots: usize,
    /// When something about this group changes with time alone.
    next_time: Option<DateTime<Utc>>,
}

/// Whether a new copy counts: healthy for `MinHealthyTime` by `now`, and the time it
/// started to count.
fn counted_since(task: &Task, update: &UpdateSettings) -> Option<DateTime<Utc>> {
    let since = task.status.healthy_since?;
    Some(since + update.min_healthy_time)
}

/// Why a new copy made by this deployment fails it, if it does.
fn failure_of(task: &Task, update: &UpdateSettings, now: DateTime<Utc>) -> Option<String> {
    if task.spec.desired_state != State::Running {
        return None; // stopped on purpose (a scale-down), not a failure
    }
    let detail = task.status.run.error.clone().or_else(|| {
        task.status
            .run
            .exit_code
            .map(|code| format!("exit code {code}"))
    });
    let why = match (task.status.state, detail) {
        // Its node was lost: that says nothing of the version. The copy is run again
        // elsewhere and counts once it is healthy there (found by `cube-bench chaos`: a
        // worker killed under a canary failed the deployment, and the job stayed half on its
        // old version).
        (State::Lost, _) => None,
        (State::Failed, Some(detail)) => Some(format!("failed: {detail}")),
        (State::Failed, None) => Some("failed".to_string()),
        // Restarted after a run of its own ended: the failure streak counts those, and a
        // restart after its node was lost leaves it as it was.
        _ if task.status.failure_streak > 0 => Some(format!(
            "failed and was restarted ({} time{})",
            task.status.restart_count,
            if task.status.restart_count == 1 {
                ""
            } else {
                "s"
            }
        )),
        _ => None,
    };
    if let Some(why) = why {
        return Some(format!("{} {why}", task.name));
    }
    let counts_by = counted_since(task, update).filter(|at| *at <= now);
    let deadline = task.status.created_time? + update.healthy_deadline;
    if counts_by.is_none() && deadline <= now {
        return Some(format!(
            "{} was not healthy within its HealthyDeadline of {}",
            task.name,
            cube_types::duration::format_duration(update.healthy_deadline)
        ));
    }
    None
}

fn look_at_group(
    record: &JobRecord,
    group_index: usize,
    owned: &[&Task],
    deployment: &Deployment,
    group: &mut DeploymentGroup,
    now: DateTime<Utc>,
) -> GroupLook {
    let spec = &record.job.groups[group_index];
    let template = template_of(record, group_index, owned);
    let update = group.update;
    let started_at = deployment.create_time.unwrap_or(now);
    let mine: Vec<&Task> = owned
        .iter()
        .copied()
        .filter(|task| task.spec.group == spec.name)
        .collect();
    let mut next_time: Option<DateTime<Utc>> = None;
    let mut soonest = |at: DateTime<Utc>| {
        if at > now {
            next_time = Some(next_time.map_or(at, |known| known.min(at)));
        }
    };
    let mut placed = 0;
    let mut healthy = 0;
    let mut old = 0;
    let mut in_flight = 0;
    let mut progress = group.progress_time;
    for task in mine.iter().filter(|task| is_live(task)) {
        if !has_current_spec(task, &template) {
            old += 1;
            continue;
        }
        placed += 1;
        match counted_since(task, &update) {
            Some(at) if at <= now => {
                healthy += 1;
                if task
                    .status
                    .created_time
                    .is_some_and(|made| made >= started_at)
                {
                    progress = Some(progress.map_or(at, |known| known.max(at)));
                }
            }
            Some(at) => {
                in_flight += 1;
                soonest(at);
            }
            None => {
                in_flight += 1;
                if let Some(made) = task.status.created_time {
                    soonest(made + update.healthy_deadline);
                }
            }
        }
    }
    // Failures: new copies this deployment made (older copies of the same spec, such as
    // the good copies a revert goes back to, are not its to judge).
    let failures: Vec<String> = mine
        .iter()
        .filter(|task| has_current_spec(task, &template))
        .filter(|task| {
            task.status
                .created_time
                .is_some_and(|made| made >= started_at)
        })
        .filter_map(|task| failure_of(task, &update, now))
        .collect();
    let desired = spec.count.unwrap_or(0);
    group.desired = desired;
    group.placed = placed;
    group.healthy = healthy;
    group.unhealthy = failures.len() as u32;
    group.old = old;
    if record.promoted && group.desired_canaries > 0 && !group.promoted {
        group.promoted = true;
        progress = Some(now);
    }
    group.progress_time = progress;
    let in_canary_phase = group.desired_canaries > 0 && !group.promoted;
    let desired = desired as usize;
    let old_kept = (old as usize).min(desired);
    let canary_target = group.desired_canaries as usize + desired.saturating_sub(old_kept);
    let canaries_ready = in_canary_phase && healthy as usize >= canary_target;
    let done = !in_canary_phase && old == 0 && healthy as usize >= desired;
    let mut failure = failures.into_iter().next();
    if failure.is_none()
        && !done
        && !canaries_ready
        && let Some(since) = group.progress_time
    {
        let deadline = since + update.progress_deadline;
        if deadline <= now {
            failure = Some(format!(
                "group {} saw no new copy become healthy within its ProgressDeadline of {}",
                spec.name,
                cube_types::duration::format_duration(update.progress_deadline)
            ));
        } else {
            soonest(deadline);
        }
    }
    GroupLook {
        failure,
        done,
        canaries_ready,
        in_canary_phase,
        canary_target,
        slots: (update.max_parallel as usize).saturating_sub(in_flight),
        next_time,
    }
}

/// How a service job's deployment stands, and what each group may replace in this look.
/// `deployment` is the job's last stored deployment; `last_stable` its newest stable version
/// before the current one.
pub fn assess(
    record: &JobRecord,
    deployment: Option<&Deployment>,
    last_stable: Option<u64>,
    owned: &[&Task],
    now: DateTime<Utc>,
) -> Rollout {
    let (mut current, fresh) = match deployment {
        Some(deployment) if deployment.version == record.version => (deployment.clone(), false),
        _ => (started(record, owned, now), true),
    };
    let mut modes = BTreeMap::new();
    if current.state.is_terminal() {
        let mode = if current.state == DeploymentState::Successful {
            Mode::AtOnce
        } else {
            Mode::Frozen
        };
        for group in &record.job.groups {
            modes.insert(group.name.clone(), mode);
        }
        return Rollout {
            deployment: current,
            changed: false,
            modes,
            revert_to: None,
            look_again_at: None,
        };
    }
    let before = current.clone();
    let mut looks = Vec::new();
    let snapshot = current.clone();
    for (group_index, spec) in record.job.groups.iter().enumerate() {
        let Some(group) = current.groups.get_mut(&spec.name) else {
            continue;
        };
        let look = look_at_group(record, group_index, owned, &snapshot, group, now);
        looks.push((spec.name.clone(), look));
    }
    let mut revert_to = None;
    let failure = looks
        .iter()
        .find_map(|(name, look)| look.failure.clone().map(|failure| (name.clone(), failure)));
    if let Some((group, failure)) = failure {
        let auto_revert = current
            .groups
            .get(&group)
            .is_some_and(|group| group.update.auto_revert);
        match (auto_revert, last_stable) {
            (true, Some(stable)) => {
                current.state = DeploymentState::Reverted;
                current.reverted_to = Some(stable);
                current.reason = format!("{failure}; the job goes back to version {stable}");
                revert_to = Some(stable);
            }
            (true, None) => {
                current.state = DeploymentState::Failed;
                current.reason =
                    format!("{failure}; no earlier stable version to go back to (AutoRevert)");
            }
            (false, _) => {
                current.state = DeploymentState::Failed;
                current.reason = format!(
                    "{failure}; nothing more is replaced (cube job revert {} VERSION goes back)",
                    record.job.name
                );
            }
        }
        for (name, _) in &looks {
            modes.insert(name.clone(), Mode::Frozen);
        }
    } else if looks.iter().all(|(_, look)| look.done) {
        current.state = DeploymentState::Successful;
        current.reason = format!(
            "every copy runs version {} and stayed healthy",
            record.version
        );
        for (name, _) in &looks {
            modes.insert(name.clone(), Mode::AtOnce);
        }
    } else {
        let waiting_for_promotion = looks.iter().any(|(_, look)| look.canaries_ready)
            && looks
                .iter()
                .all(|(_, look)| look.done || look.canaries_ready);
        if waiting_for_promotion {
            current.state = DeploymentState::Paused;
            let canaries: u32 = current.groups.values().map(|g| g.desired_canaries).sum();
            current.reason = format!(
                "{canaries} canar{} healthy; promote with `cube job promote {}` to replace the \
                 rest, or revert",
                if canaries == 1 { "y is" } else { "ies are" },
                record.job.name
            );
        } else {
            current.state = DeploymentState::Running;
            current.reason = progress_reason(&current, &looks);
        }
        for (name, look) in &looks {
            let mode = if look.in_canary_phase {
                Mode::Canary {
                    canaries: look.canary_target,
                }
            } else {
                Mode::Rolling { slots: look.slots }
            };
            modes.insert(name.clone(), mode);
        }
    }
    let look_again_at = if current.state.is_terminal() {
        None
    } else {
        looks.iter().filter_map(|(_, look)| look.next_time).min()
    };
    let changed = fresh || !same_but_time(&before, &current);
    if changed {
        current.modify_time = Some(now);
    }
    Rollout {
        deployment: current,
        changed,
        modes,
        revert_to,
        look_again_at,
    }
}

/// What a running deployment is doing, in a few words: the first group not done.
fn progress_reason(deployment: &Deployment, looks: &[(String, GroupLook)]) -> String {
    let Some((name, look)) = looks.iter().find(|(_, look)| !look.done) else {
        return String::new();
    };
    let Some(group) = deployment.groups.get(name) else {
        return String::new();
    };
    if look.in_canary_phase {
        return format!(
            "group {name}: {} of {} canar{} healthy",
            group.healthy.min(look.canary_target as u32),
            look.canary_target,
            if look.canary_target == 1 { "y" } else { "ies" }
        );
    }
    format!(
        "group {name}: {} of {} copies of version {} healthy, {} old left, {} at a time",
        group.healthy, group.desired, deployment.version, group.old, group.update.max_parallel
    )
}

/// Whether two states of a deployment differ only in when they were last written.
fn same_but_time(a: &Deployment, b: &Deployment) -> bool {
    let mut b = b.clone();
    b.modify_time = a.modify_time;
    *a == b
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use cube_types::Health;
    use cube_types::job::{Group, Job, JobType, Update};

    use super::*;
    use crate::copies::copy_of;

    fn record(count: u32, update: Update, version: u64) -> JobRecord {
        let mut task = Task::new("", "cube-sample:latest");
        task.spec.cmd = vec![format!("v{version}")];
        JobRecord {
            job: Job {
                name: "web".into(),
                job_type: JobType::Service,
                priority: 50,
                constraints: Vec::new(),
                owner: String::new(),
                project: String::new(),
                queue_timeout: None,
                groups: vec![Group {
                    name: "api".into(),
                    count: Some(count),
                    constraints: Vec::new(),
                    task,
                    update: Some(update),
                }],
            },
            version,
            submit_time: None,
            stopped: false,
            promoted: false,
            revert_of: None,
        }
    }

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + seconds, 0).unwrap()
    }

    /// A copy of `record`'s template, made at `made`, healthy since `healthy` (if given).
    fn copy(record: &JobRecord, index: u32, made: i64, healthy: Option<i64>) -> Task {
        let mut task = copy_of(record, 0, index, None);
        task.status.created_time = Some(at(made));
        task.status.state = State::Running;
        task.status.healthy_since = healthy.map(at);
        task.status.run.health = Some(if healthy.is_some() {
            Health::Healthy
        } else {
            Health::Starting
        });
        task
    }

    fn update(max_parallel: u32, min_healthy: u64) -> Update {
        Update {
            max_parallel: Some(max_parallel),
            min_healthy_time: Some(Duration::from_secs(min_healthy)),
            ..Update::default()
        }
    }

    #[test]
    fn a_new_version_starts_a_deployment_that_replaces_max_parallel_copies_at_a_time() {
        let v1 = record(4, update(2, 5), 1);
        let old: Vec<Task> = (0..4).map(|i| copy(&v1, i, 0, Some(1))).collect();
        let v2 = record(4, update(2, 5), 2);
        let owned: Vec<&Task> = old.iter().collect();
        let rollout = assess(&v2, None, Some(1), &owned, at(100));
        assert!(rollout.changed, "a new deployment is stored");
        assert_eq!(rollout.deployment.version, 2);
        assert_eq!(rollout.deployment.state, DeploymentState::Running);
        assert_eq!(rollout.mode_of("api"), Mode::Rolling { slots: 2 });
        assert_eq!(rollout.deployment.groups["api"].old, 4);
    }

    #[test]
    fn a_new_copy_counts_only_after_min_healthy_time_and_is_looked_at_again_then() {
        let v1 = record(2, update(1, 5), 1);
        let v2 = record(2, update(1, 5), 2);
        let first = assess(&v2, None, Some(1), &[], at(0)).deployment;
        let old = copy(&v1, 1, -100, Some(-90));
        let new = copy(&v2, 0, 1, Some(2));
        let owned = [&old, &new];
        let rollout = assess(&v2, Some(&first), Some(1), &owned, at(4));
        assert_eq!(rollout.mode_of("api"), Mode::Rolling { slots: 0 });
        assert_eq!(
            rollout.look_again_at,
            Some(at(7)),
            "healthy at 2, counts at 7"
        );
        let rollout = assess(&v2, Some(&first), Some(1), &owned, at(7));
        assert_eq!(rollout.mode_of("api"), Mode::Rolling { slots: 1 });
        assert_eq!(rollout.deployment.groups["api"].healthy, 1);
        assert!(rollout.changed);
    }

    #[test]
    fn every_copy_new_and_counted_is_a_success() {
        let v2 = record(2, update(1, 5), 2);
        let first = assess(&v2, None, Some(1), &[], at(0)).deployment;
        let a = copy(&v2, 0, 1, Some(2));
        let b = copy(&v2, 1, 8, Some(9));
        let rollout = assess(&v2, Some(&first), Some(1), &[&a, &b], at(20));
        assert_eq!(rollout.deployment.state, DeploymentState::Successful);
        assert_eq!(rollout.mode_of("api"), Mode::AtOnce);
        assert_eq!(rollout.look_again_at, None);
        // Looked at again, it changes nothing and writes nothing.
        let again = assess(&v2, Some(&rollout.deployment), Some(1), &[&a, &b], at(30));
        assert!(!again.changed);
    }

    #[test]
    fn a_failed_new_copy_fails_the_deployment_and_freezes_the_group() {
        let v1 = record(3, update(1, 0), 1);
        let v2 = record(3, update(1, 0), 2);
        let first = assess(&v2, None, Some(1), &[], at(0)).deployment;
        let old: Vec<Task> = (1..3).map(|i| copy(&v1, i, -100, Some(-90))).collect();
        let mut bad = copy(&v2, 0, 1, None);
        bad.status.state = State::Failed;
        bad.status.run.error = Some("unhealthy: 3 health checks failed in a row".into());
        let owned: Vec<&Task> = old.iter().chain([&bad]).collect();
        let rollout = assess(&v2, Some(&first), Some(1), &owned, at(5));
        assert_eq!(rollout.deployment.state, DeploymentState::Failed);
        assert!(
            rollout
                .deployment
                .reason
                .contains("web.api[0] failed: unhealthy"),
            "{}",
            rollout.deployment.reason
        );
        assert_eq!(rollout.mode_of("api"), Mode::Frozen);
        assert_eq!(rollout.revert_to, None, "no AutoRevert");
        assert_eq!(rollout.deployment.groups["api"].unhealthy, 1);
    }

    #[test]
    fn auto_revert_goes_back_to_the_last_stable_version() {
        let mut settings = update(1, 0);
        settings.auto_revert = Some(true);
        let v2 = record(1, settings.clone(), 2);
        let first = assess(&v2, None, Some(1), &[], at(0)).deployment;
        let mut bad = copy(&v2, 0, 1, None);
        bad.status.restart_count = 1;
        bad.status.failure_streak = 1;
        bad.status.state = State::Pending;
        let rollout = assess(&v2, Some(&first), Some(1), &[&bad], at(3));
        assert_eq!(rollout.deployment.state, DeploymentState::Reverted);
        assert_eq!(rollout.revert_to, Some(1));
        assert_eq!(rollout.deployment.reverted_to, Some(1));
        let nothing_stable = assess(&v2, Some(&first), None, &[&bad], at(3));
        assert_eq!(nothing_stable.deployment.state, DeploymentState::Failed);
        assert_eq!(nothing_stable.revert_to, None);
    }

    #[test]
    fn a_copy_whose_node_was_lost_does_not_fail_the_deployment_and_one_that_failed_does() {
        let v2 = record(1, update(1, 0), 2);
        let first = assess(&v2, None, None, &[], at(0)).deployment;
        let mut lost = copy(&v2, 0, 1, None);
        lost.status.state = State::Lost;
        let rollout = assess(&v2, Some(&first), None, &[&lost], at(3));
        assert_eq!(rollout.deployment.state, DeploymentState::Running);
        // Run again elsewhere after its node was lost: the streak is as it was.
        lost.status.state = State::Pending;
        lost.status.restart_count = 1;
        let rollout = assess(&v2, Some(&first), None, &[&lost], at(4));
        assert_eq!(rollout.deployment.state, DeploymentState::Running);
        // Restarted after a failure of its own.
        lost.status.failure_streak = 1;
        let rollout = assess(&v2, Some(&first), None, &[&lost], at(5));
        assert_eq!(rollout.deployment.state, DeploymentState::Failed);
        assert!(
            rollout
                .deployment
                .reason
                .contains("failed and was restarted (1 time)"),
            "{}",
            rollout.deployment.reason
        );
    }

    #[test]
    fn a_copy_not_healthy_by_its_deadline_fails_the_deployment() {
        let mut settings = update(1, 0);
        settings.healthy_deadline = Some(Duration::from_secs(10));
        let v2 = record(1, settings, 2);
        let first = assess(&v2, None, None, &[], at(0)).deployment;
        let slow = copy(&v2, 0, 1, None);
        let waiting = assess(&v2, Some(&first), None, &[&slow], at(5));
        assert_eq!(waiting.deployment.state, DeploymentState::Running);
        assert_eq!(waiting.look_again_at, Some(at(11)));
        let late = assess(&v2, Some(&first), None, &[&slow], at(11));
        assert_eq!(late.deployment.state, DeploymentState::Failed);
        assert!(
            late.deployment.reason.contains("HealthyDeadline of 10s"),
            "{}",
            late.deployment.reason
        );
    }

    #[test]
    fn canaries_start_beside_the_old_copies_and_wait_for_promotion() {
        let mut settings = update(1, 0);
        settings.canary = Some(1);
        let v1 = record(3, settings.clone(), 1);
        let old: Vec<Task> = (0..3).map(|i| copy(&v1, i, -100, Some(-90))).collect();
        let mut v2 = record(3, settings, 2);
        let owned: Vec<&Task> = old.iter().collect();
        let first = assess(&v2, None, Some(1), &owned, at(0));
        assert_eq!(first.mode_of("api"), Mode::Canary { canaries: 1 });
        let canary = copy(&v2, 3, 1, Some(2));
        let owned: Vec<&Task> = old.iter().chain([&canary]).collect();
        let paused = assess(&v2, Some(&first.deployment), Some(1), &owned, at(3));
        assert_eq!(paused.deployment.state, DeploymentState::Paused);
        assert!(
            paused.deployment.reason.contains("cube job promote web"),
            "{}",
            paused.deployment.reason
        );
        assert_eq!(
            paused.look_again_at, None,
            "nothing to wait for but a promotion"
        );
        v2.promoted = true;
        let promoted = assess(&v2, Some(&paused.deployment), Some(1), &owned, at(50));
        assert_eq!(promoted.deployment.state, DeploymentState::Running);
        assert!(promoted.deployment.groups["api"].promoted);
        assert_eq!(promoted.mode_of("api"), Mode::Rolling { slots: 1 });
    }

    #[test]
    fn a_revert_deploys_without_canaries() {
        let mut settings = update(1, 0);
        settings.canary = Some(1);
        let v1 = record(2, settings.clone(), 1);
        let old: Vec<Task> = (0..2).map(|i| copy(&v1, i, -100, Some(-90))).collect();
        let mut v3 = record(2, settings, 3);
        v3.revert_of = Some(1);
        let owned: Vec<&Task> = old.iter().collect();
        let rollout = assess(&v3, None, Some(1), &owned, at(0));
        assert_eq!(rollout.deployment.groups["api"].desired_canaries, 0);
        assert_eq!(rollout.mode_of("api"), Mode::Rolling { slots: 1 });
    }

    #[test]
    fn a_group_that_makes_no_progress_fails_at_its_progress_deadline() {
        let mut settings = update(1, 0);
        settings.healthy_deadline = Some(Duration::from_secs(60));
        settings.progress_deadline = Some(Duration::from_secs(60));
        let v1 = record(1, settings.clone(), 1);
        let v2 = record(1, settings, 2);
        let old = copy(&v1, 0, -100, Some(-90));
        let first = assess(&v2, None, Some(1), &[&old], at(0));
        assert_eq!(first.look_again_at, Some(at(60)));
        // The old copy is still there at 60 s: no new copy ever came (the cluster is full).
        let stuck = assess(&v2, Some(&first.deployment), Some(1), &[&old], at(60));
        assert_eq!(stuck.deployment.state, DeploymentState::Failed);
        assert!(
            stuck.deployment.reason.contains("ProgressDeadline"),
            "{}",
            stuck.deployment.reason
        );
    }
}
