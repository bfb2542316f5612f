//! A service job on the benchmark's cluster, driven through the manager's API as a user would
//! drive it: `POST /jobs` with one group of copies of the sample image (or a whole job
//! document, submitted again for a new version), `POST /jobs/{name}/scale`, `GET /jobs/{name}`
//! for the group's summary and the job's deployment, `DELETE /jobs/{name}`. The `burst
//! --as-job`, `scale` and `rolling` benchmarks share it.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cube_runtime::sample_image::SAMPLE_IMAGE;
use serde_json::json;

use crate::BenchCluster;

/// The job's one group.
pub(crate) const GROUP: &str = "api";

/// A service job of the sample image, submitted to `cluster`'s manager.
pub(crate) struct ServiceJob<'a> {
    cluster: &'a BenchCluster,
    name: String,
}

/// The manager's summary of the group (`Summary.api` in `GET /jobs/{name}`): the copies that
/// are current, by state. A copy being stopped counts until its container has ended.
#[derive(Debug, Clone, Copy, Default, serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct GroupCounts {
    pub(crate) pending: usize,
    pub(crate) starting: usize,
    pub(crate) running: usize,
    pub(crate) failed: usize,
    pub(crate) lost: usize,
}

impl GroupCounts {
    /// Copies that are neither running nor ended: still to be placed or started.
    pub(crate) fn waiting(&self) -> usize {
        self.pending + self.starting
    }
}

impl<'a> ServiceJob<'a> {
    /// Submits the job with `count` copies; returns once the manager has accepted it (201).
    pub(crate) async fn submit(
        cluster: &'a BenchCluster,
        name: &str,
        count: usize,
    ) -> anyhow::Result<ServiceJob<'a>> {
        let job = json!({"Name": name, "Type": "service",
                         "Groups": [{"Name": GROUP, "Count": count, "Task": {"Image": SAMPLE_IMAGE}}]});
        ServiceJob::submit_spec(cluster, name, &job).await
    }

    /// Submits `job` (a whole job document named `name`, whose group is [`GROUP`]) as a new
    /// job; returns once the manager has accepted it (201).
    pub(crate) async fn submit_spec(
        cluster: &'a BenchCluster,
        name: &str,
        job: &serde_json::Value,
    ) -> anyhow::Result<ServiceJob<'a>> {
        let answer = post_job(cluster, job).await?;
        anyhow::ensure!(
            answer.status().as_u16() == 201,
            "POST /jobs answered {}",
            answer.status()
        );
        Ok(ServiceJob {
            cluster,
            name: name.to_string(),
        })
    }

    /// Submits `job` again under the same name (a changed spec is a new version); returns the
    /// manager's answer, the job's view with its `Version` and `Outcome`.
    pub(crate) async fn resubmit(
        &self,
        job: &serde_json::Value,
    ) -> anyhow::Result<serde_json::Value> {
        let answer = post_job(self.cluster, job).await?;
        anyhow::ensure!(
            answer.status().is_success(),
            "POST /jobs answered {}",
            answer.status()
        );
        answer
            .json()
            .await
            .context("reading the answer to POST /jobs")
    }

    /// `GET /jobs/{name}`: the job's view as the manager has it now (its summary, tasks and
    /// last deployment).
    pub(crate) async fn view(&self) -> anyhow::Result<serde_json::Value> {
        let url = format!("{}/jobs/{}", self.cluster.base, self.name);
        crate::get_json(&self.cluster.http, &url).await
    }

    /// Sets the group's count; returns once the manager has recorded it.
    pub(crate) async fn scale(&self, count: usize) -> anyhow::Result<()> {
        let url = format!("{}/jobs/{}/scale", self.cluster.base, self.name);
        let answer = self
            .cluster
            .http
            .post(&url)
            .json(&json!({"Group": GROUP, "Count": count}))
            .send()
            .await
            .with_context(|| format!("POST {url}"))?;
        anyhow::ensure!(
            answer.status().is_success(),
            "POST {url} answered {}",
            answer.status()
        );
        Ok(())
    }

    /// The group's summary as the manager has it now.
    pub(crate) async fn counts(&self) -> anyhow::Result<GroupCounts> {
        let view = self.view().await?;
        let group = view["Summary"].get(GROUP).cloned().unwrap_or_default();
        if group.is_null() {
            return Ok(GroupCounts::default());
        }
        serde_json::from_value(group)
            .with_context(|| format!("reading Summary.{GROUP} of job {}", self.name))
    }

    /// Polls the summary every 10 ms until `done` holds (returns the time it took), failing
    /// when a copy has failed or is lost, or after `bound`.
    pub(crate) async fn await_counts(
        &self,
        started: Instant,
        bound: Duration,
        mut done: impl AsyncFnMut(&GroupCounts) -> anyhow::Result<bool>,
    ) -> anyhow::Result<Duration> {
        loop {
            let counts = self.counts().await?;
            if done(&counts).await? {
                return Ok(started.elapsed());
            }
            if counts.failed > 0 || counts.lost > 0 {
                bail!("job {}: copies failed or lost: {counts:?}", self.name);
            }
            if started.elapsed() > bound {
                bail!("job {}: {counts:?} after {bound:?}", self.name);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until exactly `count` copies run; the time since `started`.
    pub(crate) async fn await_running(
        &self,
        count: usize,
        started: Instant,
        bound: Duration,
    ) -> anyhow::Result<Duration> {
        self.await_counts(started, bound, async |counts| Ok(counts.running == count))
            .await
    }

    /// `DELETE /jobs/{name}`: every copy is stopped (the job stays, `Stopped`).
    pub(crate) async fn stop(&self) -> anyhow::Result<()> {
        let url = format!("{}/jobs/{}", self.cluster.base, self.name);
        let answer = self
            .cluster
            .http
            .delete(&url)
            .send()
            .await
            .with_context(|| format!("DELETE {url}"))?;
        anyhow::ensure!(
            answer.status().is_success(),
            "DELETE {url} answered {}",
            answer.status()
        );
        Ok(())
    }
}

/// `POST /jobs` of `job` to `cluster`'s manager.
async fn post_job(
    cluster: &BenchCluster,
    job: &serde_json::Value,
) -> anyhow::Result<reqwest::Response> {
    cluster
        .http
        .post(format!("{}/jobs", cluster.base))
        .json(job)
        .send()
        .await
        .context("POST /jobs")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_counts_read_the_managers_summary_of_a_group() {
        let group = json!({"Pending": 1, "Starting": 2, "Running": 47, "Failed": 0,
                           "Complete": 0, "Lost": 0});
        let counts: GroupCounts = serde_json::from_value(group).unwrap();
        assert_eq!((counts.running, counts.waiting()), (47, 3));
    }
}
