//! `cube job run|plan|status|stop|scale|history|revert|promote`: jobs through the manager's
//! jobs API (`/jobs`).
//!
//! A job file is read and checked here first ([`read_job_file`]: JSON or YAML, mistakes named
//! with their line), then sent; the manager decides which copies to create and stop. `--wait`
//! (on by default for `run`) follows the job with blocking queries until it has converged, as
//! [`convergence`] judges the manager's answer. How things print is in [`super::job_output`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail};
use chrono::Utc;
use clap::{Args, Subcommand};
use cube_api::ClientError;
use cube_types::duration::{format_duration, parse_duration};
use serde_json::{Value, json};

use super::input::read_job_file;
use super::job_output::{
    Convergence, JobView, PlanView, VersionView, convergence, failed_copies, history_lines,
    job_details, job_table, plan_lines, progress_line, submitted_line, waiting_copies,
};
use super::output::{print_json, print_lines, print_yaml};
use super::queue::endpoint_addresses;
use super::wait::Spinner;
use super::{ListFlags, ListFormat, ManagerClient, ManagerFlags, OutputFormat};

/// The longest one blocking query on the job waits (the manager's own cap is 60 s); a
/// waiting command asks again at once, or gives up at its `--timeout`.
const QUERY_WAIT: Duration = Duration::from_secs(30);

/// The job as the manager has it (the raw answer and as read; `None`: it has none), once
/// something about it changed after event index `*index` or the wait ran out: a blocking
/// query (`GET /jobs/{name}?index=N&wait=…`), so that a waiting command learns of a change
/// the moment it happens and asks nothing in between. `*index` moves to the answer's.
async fn next_job_answer(
    manager: &ManagerClient,
    name: &str,
    index: &mut u64,
    deadline: tokio::time::Instant,
) -> anyhow::Result<Option<(Value, JobView)>> {
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    let wait = left.min(QUERY_WAIT).max(Duration::from_millis(1));
    let raw: Value = match manager.get_blocking(&job_path(name)?, *index, wait).await {
        Ok((raw, next)) => {
            match next {
                Some(next) => *index = next,
                // A manager without blocking queries answers at once: do not ask it in a
                // tight loop.
                None => tokio::time::sleep(Duration::from_millis(250).min(left)).await,
            }
            raw
        }
        Err(ClientError::Status { status, .. }) if status.as_u16() == 404 => return Ok(None),
        Err(err) => return Err(manager.explain(err)),
    };
    let view = serde_json::from_value(raw.clone())
        .map_err(|err| anyhow!("cannot read the manager's answer about job {name}: {err}"))?;
    Ok(Some((raw, view)))
}

/// Run, plan, inspect, stop and scale jobs: groups of copies of a task that the manager keeps
/// as the job file says.
///
/// A job file (JSON or YAML, the same field names) has a Name, a Type (`service`: keep Count
/// copies running; `batch`: run Count copies to completion; `system`: one copy on every
/// matching node), optional Constraints, and Groups, each with a Name, a Count and a Task (the
/// fields of a task file).
///
/// Every change of a job's spec (not a scale) is a new version; a service job's version is
/// rolled out by a deployment that replaces MaxParallel copies at a time (see a group's
/// Update block in the README).
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube job run examples/job-web.yaml      # submit, and wait until its deployment succeeded\n  \
    cube job plan examples/job-web.yaml     # what submitting it would change\n  \
    cube job status                         # every job\n  \
    cube job status web                     # one job: its groups, deployment and copies\n  \
    cube job history web                    # its versions and what each changed\n  \
    cube job revert web 2                   # back to version 2's spec, as a new version\n  \
    cube job promote web                    # the canaries are good: replace the rest\n  \
    cube job scale web api 5                # 5 copies of group api\n  \
    cube job stop web                       # stop every copy of the job")]
pub struct JobArgs {
    #[command(subcommand)]
    action: JobAction,
}

#[derive(Debug, Subcommand)]
enum JobAction {
    Run(JobRunArgs),
    Plan(JobPlanArgs),
    Status(JobStatusArgs),
    Stop(JobStopArgs),
    Scale(JobScaleArgs),
    History(JobHistoryArgs),
    Revert(JobRevertArgs),
    Promote(JobPromoteArgs),
}

/// Submit a job file and wait until the job has converged.
///
/// The file is checked first, as the manager will (a mistake is named with its line and
/// column). Prints the job's version and whether the spec changed (`job web: version 2
/// (changed)`; `scaled` when only counts changed), then waits: a service until the deployment
/// of its version succeeded (every copy runs the version and stayed healthy; a failed
/// deployment fails the command with its reason, and a deployment that waits for `cube job
/// promote` ends the wait), a batch job until every copy completed (a copy that fails for
/// good fails the command, with its error), a system job until no copy waits. A progress
/// line shows on a terminal.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube job run examples/job-web.yaml\n  \
    cube job run --detach web.json           # return once the manager has the job\n  \
    cube job run --timeout 30s web.yaml\n  \
    cat web.yaml | cube job run -\n  \
    cube job run web.yaml -o json | jq .Summary")]
pub struct JobRunArgs {
    /// The job file, JSON or YAML (by its extension, else its first character); `-` reads
    /// stdin.
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Return as soon as the manager has the job, without waiting for its copies.
    #[arg(short, long)]
    detach: bool,
    /// How long to wait for the job to converge (e.g. 30s, 5m).
    #[arg(long, default_value = "5m", value_parser = parse_duration, conflicts_with = "detach")]
    timeout: Duration,
    #[command(flatten)]
    flags: ManagerFlags,
}

/// Show what submitting a job file would change, changing nothing.
///
/// `+ web.api[3]` is a copy that would be created, `- web.api[1] (reason)` one that would be
/// stopped, `= 2 unchanged` the copies that would stay. -o json prints the manager's answer.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube job plan examples/job-web.yaml\n  \
    cube job plan web.yaml -o json | jq '.Create | length'")]
pub struct JobPlanArgs {
    /// The job file, JSON or YAML; `-` reads stdin.
    #[arg(value_name = "FILE")]
    file: PathBuf,
    #[command(flatten)]
    flags: ManagerFlags,
}

/// Show jobs: a table of every job, or one job in detail.
///
/// The table has NAME, TYPE, VERSION, STATUS, GROUPS (each group's running copies of those it
/// wants) and SUBMITTED. With NAME: the job's fields, a summary per group (WANTED, PENDING,
/// STARTING, RUNNING, FAILED, COMPLETE, LOST) and its copies (ID, NAME, STATE, NODE).
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube job status\n  \
    cube job status web\n  \
    cube job status web --watch      # drawn again as it changes, until Ctrl-C\n  \
    cube job status web -o json | jq '.Tasks[].NodeName'\n  \
    cube job status -o name")]
pub struct JobStatusArgs {
    /// Show only this job, in detail.
    #[arg(value_name = "NAME")]
    job: Option<String>,
    /// Draw the view again each time the job (or any job) changes, until Ctrl-C.
    #[arg(short, long)]
    watch: bool,
    #[command(flatten)]
    flags: ListFlags,
}

/// Stop a job: the manager stops every copy and creates none.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube job stop web\n  \
    cube job stop --wait web      # return once no copy runs")]
pub struct JobStopArgs {
    /// The job's name.
    #[arg(value_name = "NAME")]
    job: String,
    /// Wait until no copy of the job runs.
    #[arg(long)]
    wait: bool,
    /// How long --wait waits (e.g. 30s, 2m).
    #[arg(long, default_value = "2m", value_parser = parse_duration, requires = "wait")]
    timeout: Duration,
    #[command(flatten)]
    flags: ManagerFlags,
}

/// Change how many copies of a group a job wants (not a new version of the job), and wait
/// until the job has converged to it, as `cube job run` does (--detach returns at once).
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube job scale web api 5            # return once the group runs 5 copies\n  \
    cube job scale --detach web api 1   # return once the manager has the new count")]
pub struct JobScaleArgs {
    /// The job's name.
    #[arg(value_name = "NAME")]
    job: String,
    /// The group to scale.
    #[arg(value_name = "GROUP")]
    group: String,
    /// How many copies the group should have.
    #[arg(value_name = "COUNT")]
    count: u32,
    /// Return as soon as the manager has the new count, without waiting for the copies.
    #[arg(short, long)]
    detach: bool,
    /// Wait until the job has converged (the default; kept for scripts that say so).
    #[arg(long, hide = true, conflicts_with = "detach")]
    wait: bool,
    /// How long to wait for the job to converge (e.g. 30s, 5m).
    #[arg(long, default_value = "5m", value_parser = parse_duration, conflicts_with = "detach")]
    timeout: Duration,
    #[command(flatten)]
    flags: ManagerFlags,
}

/// List a job's kept versions: when each was submitted, whether a deployment of it
/// succeeded (stable), and what it changed.
///
/// The version the job runs now is marked `*`. Cube keeps the last 20 versions of a job (and
/// its newest stable one).
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube job history web\n  \
    cube job history --full web          # every change of every version\n  \
    cube job history web -o json | jq '.[0].Job'")]
pub struct JobHistoryArgs {
    /// The job's name.
    #[arg(value_name = "NAME")]
    job: String,
    /// Every change of each version on its own line.
    #[arg(long)]
    full: bool,
    #[command(flatten)]
    flags: ManagerFlags,
}

/// Go back to an earlier version's spec: it becomes a new version (the group counts stay as
/// they are), rolled out by a deployment without canaries, and the command waits for it as
/// `cube job run` does.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube job revert web 2\n  \
    cube job revert --detach web 2")]
pub struct JobRevertArgs {
    /// The job's name.
    #[arg(value_name = "NAME")]
    job: String,
    /// The version to go back to (see `cube job history NAME`).
    #[arg(value_name = "VERSION")]
    target: u64,
    /// Return as soon as the manager has the new version.
    #[arg(short, long)]
    detach: bool,
    /// How long to wait for the deployment (e.g. 30s, 5m).
    #[arg(long, default_value = "5m", value_parser = parse_duration, conflicts_with = "detach")]
    timeout: Duration,
    #[command(flatten)]
    flags: ManagerFlags,
}

/// Promote a deployment's canaries: they are good, the rest of the copies may be replaced.
/// Waits for the deployment to finish, as `cube job run` does.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube job promote web\n  \
    cube job promote --detach web")]
pub struct JobPromoteArgs {
    /// The job's name.
    #[arg(value_name = "NAME")]
    job: String,
    /// Return as soon as the manager has the promotion.
    #[arg(short, long)]
    detach: bool,
    /// How long to wait for the deployment (e.g. 30s, 5m).
    #[arg(long, default_value = "5m", value_parser = parse_duration, conflicts_with = "detach")]
    timeout: Duration,
    #[command(flatten)]
    flags: ManagerFlags,
}

pub async fn job(args: JobArgs) -> anyhow::Result<()> {
    match args.action {
        JobAction::Run(args) => run(args).await,
        JobAction::Plan(args) => plan(args).await,
        JobAction::Status(args) => status(args).await,
        JobAction::Stop(args) => stop(args).await,
        JobAction::Scale(args) => scale(args).await,
        JobAction::History(args) => history(args).await,
        JobAction::Revert(args) => revert(args).await,
        JobAction::Promote(args) => promote(args).await,
    }
}

/// The path of a job in the API. Job names are letters, digits, `_` and `-` (checked by
/// [`cube_types::Job::validate`]); a name typed on the command line is refused here if it is
/// not one, rather than sent as a different path.
fn job_path(name: &str) -> anyhow::Result<String> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
    {
        bail!("{name:?} is not a job name: job names hold only letters, digits, '_' and '-'");
    }
    Ok(format!("/jobs/{name}"))
}

/// The job the manager has under `name` (the raw answer, for -o json, and as read), or `None`
/// when it has none (404).
async fn find_job(manager: &ManagerClient, name: &str) -> anyhow::Result<Option<(Value, JobView)>> {
    let raw: Value = match manager.try_get(&job_path(name)?).await {
        Ok(raw) => raw,
        Err(ClientError::Status { status, .. }) if status.as_u16() == 404 => return Ok(None),
        Err(err) => return Err(manager.explain(err)),
    };
    let view = serde_json::from_value(raw.clone())
        .map_err(|err| anyhow!("cannot read the manager's answer about job {name}: {err}"))?;
    Ok(Some((raw, view)))
}

/// The manager's refusal of a job file, said with the file (its message names the field at
/// fault); any other error as it is.
fn refused(err: anyhow::Error, origin: &str) -> anyhow::Error {
    match err.downcast_ref::<ClientError>() {
        Some(ClientError::Status { message, .. }) => anyhow!("{origin}: {message}"),
        _ => err,
    }
}

async fn run(args: JobRunArgs) -> anyhow::Result<()> {
    let file = read_job_file(&args.file)?;
    let manager = ManagerClient::connect(&args.flags)?;
    let name = file.job.name.clone();
    let before = find_job(&manager, &name)
        .await?
        .map(|(_, view)| view.version);
    let (_, raw): (u16, Value) = manager
        .post("/jobs", &file.document)
        .await
        .map_err(|err| refused(err, &file.origin))?;
    let submitted: JobView = serde_json::from_value(raw.clone())
        .map_err(|err| anyhow!("cannot read the manager's answer about job {name}: {err}"))?;
    let table = args.flags.output == OutputFormat::Table;
    if table {
        println!("{}", submitted_line(&submitted, before));
    }
    // Accepted, but no node could hold it today: it waits for one that can (on stderr, so
    // that stdout stays what scripts read).
    for warning in &submitted.warnings {
        eprintln!("warning: job {name}: {warning}");
    }
    if args.detach {
        if !table {
            print_json(&raw)?;
        } else {
            eprintln!(
                "follow it with: cube job status {name}{}",
                args.flags.manager_hint()
            );
        }
        return Ok(());
    }
    finish_waiting(
        &manager,
        &name,
        args.timeout,
        &args.flags,
        Waits::Deployment,
    )
    .await
}

/// Waits until the job's version is rolled out (its deployment succeeded, or waits for a
/// promotion) and says so; fails with the deployment's reason when it failed.
async fn finish_waiting(
    manager: &ManagerClient,
    name: &str,
    timeout: Duration,
    flags: &ManagerFlags,
    waits: Waits,
) -> anyhow::Result<()> {
    let (raw, converged, promotion) = wait_until_converged(manager, name, timeout, waits).await?;
    if flags.output != OutputFormat::Table {
        return print_json(&raw);
    }
    if let Some(entry) = converged
        .queue
        .as_ref()
        .filter(|entry| entry.state == "claimed")
    {
        for endpoint in &entry.services {
            println!("{}: {}", endpoint.name, endpoint_addresses(endpoint));
        }
    }
    match promotion {
        Some(reason) => println!(
            "job {name}: version {} waits for promotion: {reason}",
            converged.version
        ),
        None => match converged
            .deployment
            .as_ref()
            .filter(|deployment| deployment.version == converged.version)
        {
            Some(deployment) => println!(
                "job {name}: version {} deployed: {} ({})",
                converged.version,
                deployment.reason,
                progress_line(&converged)
            ),
            None => println!(
                "job {name}: {} ({})",
                converged.status,
                progress_line(&converged)
            ),
        },
    }
    Ok(())
}

/// Follows the job with blocking queries until it has converged (with `deployment`, until
/// the deployment of its version succeeded or waits for a promotion: then the reason is
/// returned too); fails when it cannot (a batch copy gave up, the job was stopped, the
/// deployment failed) or after `timeout`, with where it is stuck.
/// What a waiting command waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waits {
    /// The copies (`cube job scale`): the deployment does not matter.
    Copies,
    /// The deployment of the job's version (`run`, `revert`): done when it succeeded or
    /// waits for a promotion.
    Deployment,
    /// A deployment just promoted: one still shown paused has not seen the promotion yet.
    Promoted,
}

async fn wait_until_converged(
    manager: &ManagerClient,
    name: &str,
    timeout: Duration,
    waits: Waits,
) -> anyhow::Result<(Value, JobView, Option<String>)> {
    let spinner = Spinner::start();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut index = 0;
    loop {
        let (raw, view) = next_job_answer(manager, name, &mut index, deadline)
            .await?
            .ok_or_else(|| anyhow!("the manager has no job named {name:?}"))?;
        let mut seen = convergence(&view, waits != Waits::Copies);
        if waits == Waits::Promoted
            && let Convergence::AwaitsPromotion(_) = seen
        {
            seen = Convergence::Waiting("the promotion is on its way".to_string());
        }
        match seen {
            Convergence::Converged => {
                spinner.finish();
                return Ok((raw, view, None));
            }
            Convergence::AwaitsPromotion(reason) => {
                spinner.finish();
                return Ok((raw, view, Some(reason)));
            }
            Convergence::Failed(why) => {
                spinner.finish();
                bail!("{why}");
            }
            Convergence::Waiting(now) => {
                if tokio::time::Instant::now() >= deadline {
                    spinner.finish();
                    let mut why = vec![now];
                    why.extend(failed_copies(&view));
                    why.extend(waiting_copies(&view));
                    bail!(
                        "job {name} has not converged after {}: {}",
                        format_duration(timeout),
                        why.join("; ")
                    );
                }
                spinner.show(&now);
            }
        }
    }
}

/// How many copies of the job are on their way or running; none for a job the manager no
/// longer has.
fn live_copies(view: Option<&JobView>) -> usize {
    view.map_or(0, |view| {
        view.tasks
            .iter()
            .filter(|task| !task.status.state.is_terminal())
            .count()
    })
}

/// Waits until no copy of the job is on its way or running, after a stop; answers with the
/// job as last seen (`None`: the manager no longer has it).
async fn wait_until_stopped(
    manager: &ManagerClient,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<Option<(Value, JobView)>> {
    let spinner = Spinner::start();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut index = 0;
    loop {
        let found = next_job_answer(manager, name, &mut index, deadline).await?;
        let live = live_copies(found.as_ref().map(|(_, view)| view));
        if live == 0 {
            spinner.finish();
            return Ok(found);
        }
        let now = format!("{live} copies still running");
        if tokio::time::Instant::now() >= deadline {
            spinner.finish();
            bail!(
                "job {name} is not stopped after {}: {now}",
                format_duration(timeout)
            );
        }
        spinner.show(&now);
    }
}

async fn plan(args: JobPlanArgs) -> anyhow::Result<()> {
    let file = read_job_file(&args.file)?;
    let manager = ManagerClient::connect(&args.flags)?;
    let (_, raw): (u16, Value) = manager
        .post("/jobs/plan", &file.document)
        .await
        .map_err(|err| refused(err, &file.origin))?;
    match args.flags.output {
        OutputFormat::Json => print_json(&raw),
        OutputFormat::Table => {
            let plan: PlanView = serde_json::from_value(raw)
                .map_err(|err| anyhow!("cannot read the manager's plan: {err}"))?;
            print_lines(&plan_lines(&file.job.name, &plan));
            Ok(())
        }
    }
}

async fn status(args: JobStatusArgs) -> anyhow::Result<()> {
    let manager = ManagerClient::connect_to(&args.flags.target)?;
    let now = Utc::now();
    let format = args.flags.format();
    if args.watch {
        let path = args.job.as_deref().map(job_path).transpose()?;
        return super::watch::watch_jobs(&manager, path, format).await;
    }
    if let Some(name) = &args.job {
        let Some((raw, view)) = find_job(&manager, name).await? else {
            bail!(
                "no job named {name:?}; see the jobs with: cube job status{}",
                args.flags.target.hint()
            );
        };
        return match format {
            ListFormat::Table | ListFormat::Wide => {
                print_lines(&job_details(&view, now));
                Ok(())
            }
            ListFormat::Json => print_json(&raw),
            ListFormat::Yaml => print_yaml(&raw),
            ListFormat::Name | ListFormat::Ids => {
                println!("{}", view.job.name);
                Ok(())
            }
        };
    }
    let raw: Value = manager.get("/jobs").await?;
    let views: Vec<JobView> = serde_json::from_value(raw.clone())
        .map_err(|err| anyhow!("cannot read the manager's list of jobs: {err}"))?;
    manager.print_project_line(format);
    match format {
        ListFormat::Table | ListFormat::Wide if views.is_empty() => {
            println!("no jobs; run one with: cube job run FILE");
        }
        ListFormat::Table | ListFormat::Wide => print_lines(&job_table(&views, now)),
        ListFormat::Json => print_json(&raw)?,
        ListFormat::Yaml => print_yaml(&raw)?,
        ListFormat::Name | ListFormat::Ids => print_lines(
            &views
                .iter()
                .map(|view| view.job.name.clone())
                .collect::<Vec<_>>(),
        ),
    }
    Ok(())
}

async fn stop(args: JobStopArgs) -> anyhow::Result<()> {
    let manager = ManagerClient::connect(&args.flags)?;
    let path = job_path(&args.job)?;
    manager.delete(&path).await?;
    let found = if args.wait {
        wait_until_stopped(&manager, &args.job, args.timeout).await?
    } else {
        find_job(&manager, &args.job).await?
    };
    match args.flags.output {
        OutputFormat::Json => match &found {
            Some((raw, _)) => print_json(raw)?,
            None => print_json(&Value::Null)?,
        },
        OutputFormat::Table => match live_copies(found.as_ref().map(|(_, view)| view)) {
            0 => println!("job {}: stopped", args.job),
            live => println!("job {}: stopping ({live} copies still running)", args.job),
        },
    }
    Ok(())
}

async fn scale(args: JobScaleArgs) -> anyhow::Result<()> {
    let manager = ManagerClient::connect(&args.flags)?;
    let path = format!("{}/scale", job_path(&args.job)?);
    let body = json!({"Group": args.group, "Count": args.count});
    let (_, raw): (u16, Value) = manager.post(&path, &body).await?;
    let (raw, view) = if !args.detach {
        let (raw, view, _) =
            wait_until_converged(&manager, &args.job, args.timeout, Waits::Copies).await?;
        (raw, view)
    } else {
        let view: JobView = serde_json::from_value(raw.clone())
            .map_err(|err| anyhow!("cannot read the manager's answer: {err}"))?;
        (raw, view)
    };
    match args.flags.output {
        OutputFormat::Json => print_json(&raw)?,
        OutputFormat::Table => println!(
            "job {}: group {} scaled to {} ({})",
            args.job,
            args.group,
            args.count,
            progress_line(&view)
        ),
    }
    Ok(())
}

async fn history(args: JobHistoryArgs) -> anyhow::Result<()> {
    let manager = ManagerClient::connect(&args.flags)?;
    let path = format!("{}/versions", job_path(&args.job)?);
    let raw: Value = manager.get(&path).await?;
    match args.flags.output {
        OutputFormat::Json => print_json(&raw),
        OutputFormat::Table => {
            let versions: Vec<VersionView> = serde_json::from_value(raw)
                .map_err(|err| anyhow!("cannot read the manager's list of versions: {err}"))?;
            print_lines(&history_lines(&versions, Utc::now(), args.full));
            Ok(())
        }
    }
}

async fn revert(args: JobRevertArgs) -> anyhow::Result<()> {
    let manager = ManagerClient::connect(&args.flags)?;
    let path = format!("{}/revert", job_path(&args.job)?);
    let body = json!({"Version": args.target});
    let (_, raw): (u16, Value) = manager.post(&path, &body).await?;
    let view: JobView = serde_json::from_value(raw.clone())
        .map_err(|err| anyhow!("cannot read the manager's answer: {err}"))?;
    let table = args.flags.output == OutputFormat::Table;
    if table {
        let line = submitted_line(&view, Some(view.version));
        match view.outcome.as_deref() {
            Some("changed") => println!(
                "job {}: version {} (the spec of version {})",
                args.job, view.version, args.target
            ),
            _ => println!("{line}: it already has the spec of version {}", args.target),
        }
    }
    if args.detach {
        if !table {
            print_json(&raw)?;
        }
        return Ok(());
    }
    finish_waiting(
        &manager,
        &args.job,
        args.timeout,
        &args.flags,
        Waits::Deployment,
    )
    .await
}

async fn promote(args: JobPromoteArgs) -> anyhow::Result<()> {
    let manager = ManagerClient::connect(&args.flags)?;
    let path = format!("{}/promote", job_path(&args.job)?);
    let (_, raw): (u16, Value) = manager.post(&path, &json!({})).await?;
    let table = args.flags.output == OutputFormat::Table;
    if table {
        println!(
            "job {}: promoted; the rest of the copies are replaced",
            args.job
        );
    }
    if args.detach {
        if !table {
            print_json(&raw)?;
        }
        return Ok(());
    }
    finish_waiting(
        &manager,
        &args.job,
        args.timeout,
        &args.flags,
        Waits::Promoted,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_name_from_the_command_line_becomes_its_path_or_is_refused() {
        assert_eq!(job_path("web-1").unwrap(), "/jobs/web-1");
        assert!(job_path("../tasks").is_err());
        assert!(job_path("").is_err());
    }
}
