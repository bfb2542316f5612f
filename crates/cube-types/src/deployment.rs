//! A deployment: the rollout of one version of a `service` job, as the manager records it.
//!
//! Every version of a service job is rolled out by one deployment: its copies whose spec
//! changed are replaced `MaxParallel` at a time, each new copy counting once it has been
//! healthy for `MinHealthyTime`; a new copy that fails, or is not healthy by
//! `HealthyDeadline`, fails the deployment (and with `AutoRevert` the job goes back to its last
//! stable version); a deployment that sees no copy become healthy for `ProgressDeadline` fails
//! too. With `Canary` N, N new copies first start beside the old ones and the deployment
//! pauses until it is promoted. The decisions are the manager's job transformer's; this file
//! holds the record it keeps (stored, so a restarted manager carries on) and the settings.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::job::Update;

/// The defaults of a group's `Update` block.
pub const DEFAULT_MAX_PARALLEL: u32 = 1;
pub const DEFAULT_MIN_HEALTHY_TIME: Duration = Duration::from_secs(5);
pub const DEFAULT_HEALTHY_DEADLINE: Duration = Duration::from_secs(60);
pub const DEFAULT_PROGRESS_DEADLINE: Duration = Duration::from_secs(5 * 60);

/// A group's update settings in force: its `Update` block with the defaults filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateSettings {
    #[serde(rename = "MaxParallel")]
    pub max_parallel: u32,
    #[serde(rename = "MinHealthyTime", with = "duration")]
    pub min_healthy_time: Duration,
    #[serde(rename = "HealthyDeadline", with = "duration")]
    pub healthy_deadline: Duration,
    #[serde(rename = "ProgressDeadline", with = "duration")]
    pub progress_deadline: Duration,
    #[serde(rename = "AutoRevert")]
    pub auto_revert: bool,
    #[serde(rename = "Canary")]
    pub canary: u32,
}

impl UpdateSettings {
    /// The settings of a group whose `Update` block is `update` (none: every default).
    pub fn of(update: Option<&Update>) -> UpdateSettings {
        let update = update.cloned().unwrap_or_default();
        UpdateSettings {
            max_parallel: update.max_parallel.unwrap_or(DEFAULT_MAX_PARALLEL).max(1),
            min_healthy_time: update.min_healthy_time.unwrap_or(DEFAULT_MIN_HEALTHY_TIME),
            healthy_deadline: update.healthy_deadline.unwrap_or(DEFAULT_HEALTHY_DEADLINE),
            progress_deadline: update
                .progress_deadline
                .unwrap_or(DEFAULT_PROGRESS_DEADLINE),
            auto_revert: update.auto_revert.unwrap_or(false),
            canary: update.canary.unwrap_or(0),
        }
    }
}

/// Where a deployment is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeploymentState {
    /// Copies are being replaced.
    #[serde(rename = "running")]
    Running,
    /// Its canaries are healthy; it waits for `cube job promote` to replace the rest.
    #[serde(rename = "paused")]
    Paused,
    /// Every copy runs the version and has been healthy for `MinHealthyTime`: the version is
    /// stable.
    #[serde(rename = "successful")]
    Successful,
    /// A new copy failed or missed a deadline: nothing more is replaced, and the old copies
    /// that still run keep running.
    #[serde(rename = "failed")]
    Failed,
    /// It failed, and the job went back to its last stable version (`AutoRevert`).
    #[serde(rename = "reverted")]
    Reverted,
    /// A newer version, or a stop of the job, ended it before it finished.
    #[serde(rename = "cancelled")]
    Cancelled,
}

impl DeploymentState {
    pub fn name(self) -> &'static str {
        match self {
            DeploymentState::Running => "running",
            DeploymentState::Paused => "paused",
            DeploymentState::Successful => "successful",
            DeploymentState::Failed => "failed",
            DeploymentState::Reverted => "reverted",
            DeploymentState::Cancelled => "cancelled",
        }
    }

    /// Whether the deployment is over: it replaces nothing more.
    pub fn is_terminal(self) -> bool {
        !matches!(self, DeploymentState::Running | DeploymentState::Paused)
    }
}

impl std::fmt::Display for DeploymentState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One deployment of a version of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deployment {
    #[serde(rename = "ID")]
    pub id: Uuid,
    #[serde(rename = "Job")]
    pub job: String,
    /// The job version it rolls out.
    #[serde(rename = "Version")]
    pub version: u64,
    #[serde(rename = "State")]
    pub state: DeploymentState,
    /// Why it is in its state, in words (what it waits for, what failed).
    #[serde(rename = "Reason", default)]
    pub reason: String,
    #[serde(rename = "CreateTime", with = "crate::time::optional", default)]
    pub create_time: Option<DateTime<Utc>>,
    /// When it last changed state or progressed.
    #[serde(rename = "ModifyTime", with = "crate::time::optional", default)]
    pub modify_time: Option<DateTime<Utc>>,
    /// The version the job went back to, when it failed with `AutoRevert`.
    #[serde(
        rename = "RevertedTo",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub reverted_to: Option<u64>,
    #[serde(rename = "Groups")]
    pub groups: BTreeMap<String, DeploymentGroup>,
}

/// How one group's rollout stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentGroup {
    /// The settings in force for this deployment (a revert deploys without canaries).
    #[serde(rename = "Update")]
    pub update: UpdateSettings,
    /// The copies the group wants (its `Count`).
    #[serde(rename = "Desired")]
    pub desired: u32,
    /// Canaries to start before the rest is replaced; 0 once promoted, or with none.
    #[serde(rename = "DesiredCanaries")]
    pub desired_canaries: u32,
    #[serde(rename = "Promoted", default)]
    pub promoted: bool,
    /// Copies of the new version that exist (live).
    #[serde(rename = "Placed")]
    pub placed: u32,
    /// Copies of the new version healthy for `MinHealthyTime`.
    #[serde(rename = "Healthy")]
    pub healthy: u32,
    /// Copies of the new version that failed or missed their deadline.
    #[serde(rename = "Unhealthy")]
    pub unhealthy: u32,
    /// Copies of the old versions still live.
    #[serde(rename = "Old", default)]
    pub old: u32,
    /// When the group last made progress (a copy counted healthy; the start, or the
    /// promotion): the progress deadline runs from here.
    #[serde(rename = "ProgressTime", with = "crate::time::optional", default)]
    pub progress_time: Option<DateTime<Utc>>,
}

impl Deployment {
    /// Whether it is still replacing copies or waiting to be promoted.
    pub fn is_active(&self) -> bool {
        !self.state.is_terminal()
    }

    /// Whether it waits for promotion: canaries placed, not promoted.
    pub fn awaits_promotion(&self) -> bool {
        self.state == DeploymentState::Paused
    }
}

/// Serde for a required duration field, written as `"5s"`.
mod duration {
    use std::time::Duration;

    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        crate::duration::optional::serialize(&Some(*value), serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        crate::duration::optional::deserialize(deserializer).map(Option::unwrap_or_default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_block_left_out_has_the_documented_defaults() {
        let settings = UpdateSettings::of(None);
        assert_eq!(settings.max_parallel, 1);
        assert_eq!(settings.min_healthy_time, Duration::from_secs(5));
        assert_eq!(settings.healthy_deadline, Duration::from_secs(60));
        assert_eq!(settings.progress_deadline, Duration::from_secs(300));
        assert!(!settings.auto_revert);
        assert_eq!(settings.canary, 0);
        let partial: Update =
            serde_json::from_str(r#"{"MaxParallel": 2, "MinHealthyTime": "0s"}"#).unwrap();
        let settings = UpdateSettings::of(Some(&partial));
        assert_eq!(settings.max_parallel, 2);
        assert_eq!(settings.min_healthy_time, Duration::ZERO);
        assert_eq!(settings.healthy_deadline, Duration::from_secs(60));
    }

    #[test]
    fn a_deployment_reads_back_what_it_wrote() {
        let mut groups = BTreeMap::new();
        groups.insert(
            "api".to_string(),
            DeploymentGroup {
                update: UpdateSettings::of(None),
                desired: 4,
                desired_canaries: 0,
                promoted: false,
                placed: 2,
                healthy: 1,
                unhealthy: 0,
                old: 2,
                progress_time: Some(Utc::now()),
            },
        );
        let deployment = Deployment {
            id: Uuid::new_v4(),
            job: "web".into(),
            version: 2,
            state: DeploymentState::Running,
            reason: "replacing 2 copies, 1 at a time".into(),
            create_time: Some(Utc::now()),
            modify_time: Some(Utc::now()),
            reverted_to: None,
            groups,
        };
        let text = serde_json::to_string(&deployment).unwrap();
        assert!(text.contains(r#""State":"running""#), "{text}");
        assert!(text.contains(r#""MinHealthyTime":"5s""#), "{text}");
        let back: Deployment = serde_json::from_str(&text).unwrap();
        // Times are written to the second's fraction RFC 3339 keeps.
        assert_eq!(back.groups["api"].update, deployment.groups["api"].update);
        assert_eq!(back.state, DeploymentState::Running);
        assert!(!back.state.is_terminal());
        assert!(DeploymentState::Reverted.is_terminal());
    }
}
