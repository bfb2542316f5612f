//! The resync: every task compared with the containers Docker has for this node, at each
//! (re)connection of the event stream and at the pod monitor's interval, whether or not an
//! event said anything. Tasks with something to do go to the reconcile; containers no task
//! owns are removed, and those that run for a task that ended are stopped.

use std::collections::HashSet;

use cube_runtime::Runtime;
use uuid::Uuid;

use super::{Worker, WorkerError, decide};

impl<R: Runtime> Worker<R> {
    /// Compares every task with the containers Docker has for this node: hands the tasks to
    /// start, to stop and to check to the reconcile, and removes containers that no task owns.
    pub async fn resync(&self) -> Result<(), WorkerError> {
        // Containers first, then tasks: a task is stored before its container is created,
        // so every container listed here has its task in the list read after it.
        let containers = match self.runtime.list_managed(&self.config.name).await {
            Ok(containers) => containers,
            Err(err) => {
                tracing::warn!(error = %err, "cannot list containers");
                return Ok(());
            }
        };
        let tasks = self.tasks.list()?;
        let known: HashSet<Uuid> = tasks.iter().map(|task| task.id).collect();
        for task in &tasks {
            self.health.track(task);
            if decide::due_at_resync(task) {
                self.runner.push(task.id);
            }
        }
        for orphan in containers
            .iter()
            .filter(|c| !c.task_id.is_some_and(|id| known.contains(&id)))
        {
            tracing::warn!(container = %orphan.id, "removing a container labelled for this node that no task owns");
            if let Err(err) = self.runtime.remove(&orphan.id).await {
                tracing::warn!(container = %orphan.id, error = %err, "cannot remove orphaned container");
            }
        }
        // A task that has ended runs nothing. A container may start after its task's stop
        // all the same: the start a worker asked for just before it was killed goes on in
        // the engine. (Listed before the tasks were read: a new run of the task, stored
        // before its container is made, would not read as ended here.)
        let ended: HashSet<Uuid> = tasks
            .iter()
            .filter(|task| task.status.state.is_terminal())
            .map(|task| task.id)
            .collect();
        for stray in containers
            .iter()
            .filter(|c| c.running && c.task_id.is_some_and(|id| ended.contains(&id)))
        {
            tracing::warn!(container = %stray.id, task = ?stray.task_id, "stopping a container that runs for a task that has ended");
            if let Err(err) = self.runtime.stop(&stray.id, self.config.stop_timeout).await {
                tracing::warn!(container = %stray.id, error = %err, "cannot stop the container of an ended task");
            }
        }
        Ok(())
    }
}
