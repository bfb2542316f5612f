//! The chaos run (issue 29): faults injected at random under a mixed workload, then the
//! history checked. `check` is the checker, pure; `chaos-check FILE` runs it on a recorded
//! history, so that a run can be checked again after a fix of the checker.

pub mod check;
mod run;

pub(crate) use run::{ChaosStore, DockerHung, Options, chaos};

use std::path::Path;

use anyhow::{Context, bail};

/// `cube-bench chaos-check FILE`: reads a recorded history (JSON) and prints each violation;
/// fails when there is one.
pub fn check_file(path: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the history {}", path.display()))?;
    let history: check::History = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a chaos history", path.display()))?;
    let found = check::check(&history);
    println!(
        "seed {}: {} operations, {} tasks, {} containers, {} capacity samples checked",
        history.seed,
        history.ops.len(),
        history.settled.tasks.len(),
        history.settled.containers.len(),
        history.settled.capacity.len()
    );
    for violation in &found {
        println!("VIOLATION {violation}");
    }
    if !found.is_empty() {
        bail!(
            "{} invariant violations in the run of seed {}",
            found.len(),
            history.seed
        );
    }
    println!("every invariant held");
    Ok(())
}
