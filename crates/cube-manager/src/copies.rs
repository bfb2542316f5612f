//! What a job's copy is: how one is made from the job ([`copy_of`]), whether it is still meant
//! to run ([`is_live`]) and whether it has the spec the job asks for now
//! ([`has_current_spec`]). Both the job transformer (`jobs.rs`) and the rolling updates
//! (`rollout.rs`) read copies this way; here, each imports it and neither the other's rules.

use cube_types::job::{Constraint, Job, JobRecord, Operator, task_name};
use cube_types::{State, Task};
use uuid::Uuid;

use crate::reconcile::policy_restarts;

/// Whether a copy is still meant to run: asked to run, and either not ended or ended with a
/// restart to come (its policy restarts that end and the limit is not reached).
pub fn is_live(task: &Task) -> bool {
    if task.spec.desired_state != State::Running {
        return false;
    }
    if !task.status.state.is_terminal() {
        return true;
    }
    policy_restarts(task.spec.restart_policy, task.status.state)
        && task
            .spec
            .max_restarts
            .is_none_or(|max| task.status.restart_count < max)
}

/// The task a copy is made from: the group's template with the job's identity, its name and
/// every constraint on it; `pin` puts a system copy on its node.
pub fn copy_of(record: &JobRecord, group_index: usize, index: u32, pin: Option<&str>) -> Task {
    let job = &record.job;
    let group = &job.groups[group_index];
    let mut template = group.task.clone();
    // The job's key: its name, with its project in front outside `default`.
    template.spec.job = job.key();
    template.spec.project = job.project().to_string();
    template.spec.group = group.name.clone();
    template.spec.constraints = job.constraints_of(group).cloned().collect();
    if let Some(node) = pin {
        template.spec.constraints.push(Constraint {
            attribute: "node.name".to_string(),
            operator: Operator::Equal,
            value: node.to_string(),
        });
    }
    template.normalize();
    copy_from(&template, job, group_index, index)
}

/// The group's template, [`copy_of`] with no pin, sharing its spec body with one of the first
/// copies of `owned` in the group whose body is equal: then [`has_current_spec`] knows every
/// copy sharing that body by one pointer comparison instead of comparing 26 fields (a look
/// at 10,000 copies spent most of its time comparing their strings).
pub fn template_of(record: &JobRecord, group_index: usize, owned: &[&Task]) -> Task {
    let mut template = copy_of(record, group_index, 0, None);
    let group = &record.job.groups[group_index].name;
    // A few tries: in a rolling update the first copies may be of the earlier version, and a
    // failed try costs a comparison of every field.
    for copy in owned
        .iter()
        .filter(|task| task.spec.group == *group)
        .take(SHARING_TRIES)
    {
        if template.spec.share_body_of(&copy.spec) {
            break;
        }
    }
    template
}

/// How many copies [`template_of`] compares its body with.
const SHARING_TRIES: usize = 4;

/// Copy `index` of the group from its `template` ([`copy_of`] with no pin, made once per
/// group and look): what [`copy_of`] makes, sharing the template's spec body, so that the
/// copies of one job version hold their spec once.
pub fn copy_from(template: &Task, job: &Job, group_index: usize, index: u32) -> Task {
    let mut task = template.clone();
    task.id = Uuid::new_v4();
    task.name = task_name(&job.name, &job.groups[group_index].name, index);
    task.spec.index = Some(index);
    task
}

/// Whether a copy still has the spec the job asks for now (a changed template replaces it).
/// `template` is the group's copy as [`copy_of`] makes it without a pin, made once per group:
/// a copy differs from it only in its name, its index and (system) the pin to its node.
///
/// A copy's constraints are the template's, or (a system copy) the template's followed by
/// one `node.name =` pin. Only a constraint *beyond* the template's is taken for a pin: a job
/// or group may well ask for `node.name =` itself, and such a constraint is the template's
/// own (reading it as a pin once made every copy look changed, and the job replaced its copy
/// in a tight loop).
pub(crate) fn has_current_spec(task: &Task, template: &Task) -> bool {
    // One body: every field the same, the constraints too (no pin: a pin is in the body).
    if task.spec.shares_body_with(&template.spec) {
        return true;
    }
    let wanted = template.spec.constraints.as_slice();
    let constraints = task.spec.constraints.as_slice();
    let same_constraints = constraints == wanted
        || constraints
            .split_last()
            .is_some_and(|(last, rest)| rest == wanted && is_pin(last));
    same_constraints && task.same_spec_except(template, &["Name", "Index", "Constraints"])
}

/// A `node.name =` constraint: what [`copy_of`] adds to put a system copy on its node.
fn is_pin(constraint: &Constraint) -> bool {
    constraint.attribute == "node.name" && constraint.operator == Operator::Equal
}
