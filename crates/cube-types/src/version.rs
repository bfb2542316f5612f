//! Which build of Cube a process is, as `GET /version` on a manager or a worker says it, and
//! whether a worker and its manager can work together.

use serde::{Deserialize, Serialize};

/// Cube's version, from the workspace's `Cargo.toml`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit this build was made from (`build.rs`: 12 hex digits, `-dirty` with local
/// changes, `unknown` outside a git checkout).
pub const COMMIT: &str = env!("CUBE_COMMIT");

/// What a process says about its version: `GET /version`, and a worker's reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VersionInfo {
    #[serde(rename = "Version")]
    pub version: String,
    #[serde(rename = "Commit")]
    pub commit: String,
    /// A worker's container engine (`20.10.24+dfsg1`), when it could ask it.
    #[serde(rename = "Docker", default, skip_serializing_if = "Option::is_none")]
    pub docker: Option<String>,
    /// The Docker API version the worker speaks with its engine.
    #[serde(
        rename = "DockerApiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub docker_api_version: Option<String>,
}

impl VersionInfo {
    /// This build, with no engine.
    pub fn this_build() -> VersionInfo {
        VersionInfo {
            version: VERSION.to_string(),
            commit: COMMIT.to_string(),
            docker: None,
            docker_api_version: None,
        }
    }
}

/// `(major, minor)` of a `MAJOR.MINOR.PATCH` version, if it reads as one.
fn major_minor(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// What a manager of version `manager` says about a worker that reports `worker`, when it
/// matters: a worker with no version (older than version reports), or another major version
/// (another minor one before 1.0, when minors may break the API), may not speak the manager's
/// API. `None` when they can work together.
pub fn worker_mismatch(manager: &str, worker: Option<&VersionInfo>) -> Option<String> {
    let Some(worker) = worker else {
        return Some(format!(
            "the worker reports no version: it is older than its manager ({manager}); upgrade it"
        ));
    };
    let (Some(ours), Some(theirs)) = (major_minor(manager), major_minor(&worker.version)) else {
        return Some(format!(
            "the worker's version {:?} is not MAJOR.MINOR.PATCH; the manager is {manager}",
            worker.version
        ));
    };
    let breaking = if ours.0 == 0 || theirs.0 == 0 {
        ours != theirs
    } else {
        ours.0 != theirs.0
    };
    if !breaking {
        return None;
    }
    let (older, newer) = if theirs < ours {
        ("older", "upgrade the worker")
    } else {
        ("newer", "upgrade the manager")
    };
    Some(format!(
        "the worker is {} ({older} than its manager, {manager}): their APIs may differ; {newer}",
        worker.version
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(version: &str) -> VersionInfo {
        VersionInfo {
            version: version.to_string(),
            ..VersionInfo::this_build()
        }
    }

    #[test]
    fn a_patch_apart_works_and_a_minor_apart_before_one_point_oh_does_not() {
        assert_eq!(worker_mismatch("0.1.0", Some(&worker("0.1.7"))), None);
        let older = worker_mismatch("0.2.0", Some(&worker("0.1.7"))).unwrap();
        assert!(
            older.contains("older") && older.contains("upgrade the worker"),
            "{older}"
        );
        let newer = worker_mismatch("0.1.0", Some(&worker("0.2.0"))).unwrap();
        assert!(newer.contains("upgrade the manager"), "{newer}");
    }

    #[test]
    fn after_one_point_oh_only_the_major_matters() {
        assert_eq!(worker_mismatch("1.2.0", Some(&worker("1.5.3"))), None);
        assert!(worker_mismatch("2.0.0", Some(&worker("1.5.3"))).is_some());
    }

    #[test]
    fn a_worker_without_a_version_is_older() {
        let said = worker_mismatch("0.1.0", None).unwrap();
        assert!(said.contains("older than its manager"), "{said}");
    }
}
