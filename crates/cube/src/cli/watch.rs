//! `--watch` on `cube status` and `cube job status`: the view drawn again each time what it
//! shows changes, until Ctrl-C.
//!
//! Nothing is asked on a timer: each round is a blocking query on the manager
//! (`GET /tasks?index=N&wait=60s`, likewise `/jobs` and `/jobs/{name}`), which answers the
//! moment something it lists changed after event index N, or after the wait (then the view is
//! drawn again anyway, so that ages like "5s ago" move on). The answer's `X-Cube-Index` is the
//! N of the next round.

use std::future::Future;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::{anyhow, bail};
use chrono::Utc;
use serde_json::Value;

use super::job_output::{JobView, job_details, job_table};
use super::{ListFormat, ManagerClient};

/// How long one blocking query waits at most (the manager's own cap).
const WATCH_WAIT: Duration = Duration::from_secs(60);

/// Draws `render`'s lines for each answer of the blocking query on `path`, until Ctrl-C;
/// `title` heads the screen. The first answer comes at once (index 0 is older than anything
/// the manager keeps).
pub async fn watch<F, Fut>(
    manager: &ManagerClient,
    path: &str,
    title: &str,
    mut render: F,
) -> anyhow::Result<()>
where
    F: FnMut(Value) -> Fut,
    Fut: Future<Output = anyhow::Result<Vec<String>>>,
{
    let screen = Screen {
        terminal: std::io::stdout().is_terminal(),
    };
    let following = async {
        let mut index = 0;
        loop {
            let (answer, next) = manager
                .get_blocking::<Value>(path, index, WATCH_WAIT)
                .await
                .map_err(|err| manager.explain(err))?;
            let lines = render(answer).await?;
            screen.draw(title, &lines)?;
            index = next.ok_or_else(|| {
                anyhow!(
                    "{} does not answer blocking queries (no X-Cube-Index): is it an older \
                     Cube? Use the command without --watch",
                    manager.described()
                )
            })?;
        }
    };
    tokio::select! {
        result = following => result,
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}

/// Only a table can be drawn again; the formats for programs have `cube events` instead.
pub fn check_format(format: ListFormat) -> anyhow::Result<bool> {
    match format {
        ListFormat::Table => Ok(false),
        ListFormat::Wide => Ok(true),
        _ => bail!(
            "--watch draws a table (-o table or -o wide); to follow changes as JSON use \
             cube events -o json"
        ),
    }
}

/// Where the view is drawn: over the last one on a terminal, one after the other otherwise.
struct Screen {
    terminal: bool,
}

impl Screen {
    fn draw(&self, title: &str, lines: &[String]) -> anyhow::Result<()> {
        let mut out = std::io::stdout().lock();
        let now = Utc::now().format("%H:%M:%S");
        if self.terminal {
            // Home, then clear the screen: the view replaces the last one.
            write!(out, "\x1b[H\x1b[2J")?;
            writeln!(out, "{title}, at {now} UTC (Ctrl-C to stop)\n")?;
        } else {
            writeln!(out, "--- {title}, at {now} UTC")?;
        }
        for line in lines {
            writeln!(out, "{line}")?;
        }
        out.flush()?;
        Ok(())
    }
}

/// `cube job status --watch [NAME]`: the jobs' table, or one job in detail (`path` is
/// `/jobs/NAME`), drawn again as they change.
pub async fn watch_jobs(
    manager: &ManagerClient,
    path: Option<String>,
    format: ListFormat,
) -> anyhow::Result<()> {
    check_format(format)?;
    match path {
        Some(path) => {
            watch(
                manager,
                &path,
                "cube job status --watch",
                |answer| async move {
                    let view: JobView = serde_json::from_value(answer)
                        .map_err(|err| anyhow!("cannot read the manager's answer: {err}"))?;
                    Ok(job_details(&view, Utc::now()))
                },
            )
            .await
        }
        None => {
            watch(
                manager,
                "/jobs",
                "cube job status --watch",
                |answer| async move {
                    let views: Vec<JobView> = serde_json::from_value(answer)
                        .map_err(|err| anyhow!("cannot read the manager's list of jobs: {err}"))?;
                    if views.is_empty() {
                        return Ok(vec!["no jobs; run one with: cube job run FILE".to_string()]);
                    }
                    Ok(job_table(&views, Utc::now()))
                },
            )
            .await
        }
    }
}
