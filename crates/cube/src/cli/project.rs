//! `cube project create|list|status|rm|set-quota`: the projects of a cluster and their quotas
//! (`GET|POST /projects`, `GET|DELETE /projects/{name}`, `PUT /projects/{name}/quota`).

use anyhow::bail;
use chrono::Utc;
use clap::{Args, Subcommand};
use cube_types::project::{ProjectRequest, ProjectView, Quota};
use cube_types::shard::ShardsView;

use super::output::{print_json, print_lines, table, time_ago};
use super::{ManagerClient, ManagerFlags, OutputFormat};

/// Projects: each team's tasks, jobs, waiting requests and tokens apart, with a quota.
///
/// Every command works in one project: --project, CUBE_PROJECT, the config file's cluster's
/// `project`, else `default`. A token holds in the projects it was made for (`cube token
/// create --role submit --project team-a`); a project it does not hold in looks empty to it.
/// A request that would take its project over its quota waits in the waiting list, saying
/// so, and is let in when the project's placed tasks declare less (one ends or is stopped,
/// or the quota is raised); one bigger than the quota itself is refused.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube project create team-a --cpus 8 --memory 16Gi\n  \
    cube project set-quota team-a --cpus 8 --memory 16Gi --disk 100Gi --tasks 200\n  \
    cube --project team-a run --name web cube-sample:latest\n  \
    export CUBE_PROJECT=team-a             # then every command works in team-a\n  \
    cube project status team-a\n  \
    cube --project '*' status              # every project the token holds in\n  \
    cube project rm team-a                 # refused while anything in it runs")]
pub struct ProjectArgs {
    #[command(subcommand)]
    command: ProjectCommand,
}

/// The limits a quota may set; what is left out has no limit.
#[derive(Debug, Args, Default)]
struct QuotaFlags {
    /// Cores its placed tasks may declare together (`8`, `0.5`, `500m`).
    #[arg(long, value_parser = cube_types::cpu::parse_cpu)]
    cpus: Option<f64>,
    /// Memory they may declare together (`16Gi`, `512MiB`).
    #[arg(long, value_parser = cube_types::size::parse_size)]
    memory: Option<u64>,
    /// Disk they may declare together (`100Gi`).
    #[arg(long, value_parser = cube_types::size::parse_size)]
    disk: Option<u64>,
    /// How many tasks may be placed at once.
    #[arg(long)]
    tasks: Option<u64>,
}

impl QuotaFlags {
    fn quota(&self) -> Quota {
        Quota {
            cpus: self.cpus,
            memory: self.memory,
            disk: self.disk,
            tasks: self.tasks,
        }
    }
}

#[derive(Debug, Subcommand)]
enum ProjectCommand {
    /// Make a project (a management token is needed), with a quota if limits are given.
    Create {
        /// Lower-case letters, digits and '-', starting with a letter.
        name: String,
        #[command(flatten)]
        quota: QuotaFlags,
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// List the projects the token holds in, with what each uses of its quota.
    #[command(alias = "ls")]
    List {
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// A project's quota and usage, and how many tasks, jobs and waiting requests it has.
    Status {
        /// The project [default: the current one].
        name: Option<String>,
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// Set a project's quota, replacing the one it had: the limits given, and no limit for
    /// what is left out (none given: no quota). Lowering it below what is used stops nothing;
    /// it holds new requests.
    SetQuota {
        name: String,
        #[command(flatten)]
        quota: QuotaFlags,
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// Remove a project: refused while any of its tasks has not ended or any of its jobs is
    /// not stopped.
    Rm {
        name: String,
        #[command(flatten)]
        flags: ManagerFlags,
    },
}

pub async fn project(args: ProjectArgs) -> anyhow::Result<()> {
    match args.command {
        ProjectCommand::Create {
            name,
            quota,
            mut flags,
        } => {
            // The project to make is named here; the request itself is in none.
            flags.target.project = None;
            let manager = ManagerClient::connect(&flags)?;
            let request = ProjectRequest {
                name,
                quota: quota.quota(),
            };
            let (_, view): (u16, ProjectView) = manager.post("/projects", &request).await?;
            print_view(&manager, &view, flags.output).await
        }
        ProjectCommand::List { mut flags } => {
            flags.target.project = None;
            let manager = ManagerClient::connect(&flags)?;
            let views: Vec<ProjectView> = manager.get("/projects").await?;
            match flags.output {
                OutputFormat::Json => print_json(&views),
                OutputFormat::Table => {
                    print_lines(&project_table(&views));
                    Ok(())
                }
            }
        }
        ProjectCommand::Status { name, mut flags } => {
            let name = match name.or_else(|| flags.target.project.take()) {
                Some(name) if name == cube_types::project::ALL_PROJECTS => {
                    bail!("cube project status names one project; cube project list shows all")
                }
                Some(name) => name,
                None => cube_types::project::DEFAULT_PROJECT.to_string(),
            };
            flags.target.project = None;
            let manager = ManagerClient::connect(&flags)?;
            let view: ProjectView = manager.get(&format!("/projects/{name}")).await?;
            print_view(&manager, &view, flags.output).await
        }
        ProjectCommand::SetQuota {
            name,
            quota,
            mut flags,
        } => {
            flags.target.project = None;
            let manager = ManagerClient::connect(&flags)?;
            let view: ProjectView = manager
                .put(&format!("/projects/{name}/quota"), &quota.quota())
                .await?;
            print_view(&manager, &view, flags.output).await
        }
        ProjectCommand::Rm { name, mut flags } => {
            flags.target.project = None;
            let manager = ManagerClient::connect(&flags)?;
            manager.delete(&format!("/projects/{name}")).await?;
            println!("project {name} removed");
            Ok(())
        }
    }
}

async fn print_view(
    manager: &ManagerClient,
    view: &ProjectView,
    output: OutputFormat,
) -> anyhow::Result<()> {
    match output {
        OutputFormat::Json => print_json(view),
        OutputFormat::Table => {
            // Who holds the project's shard, said by any manager; a manager that cannot say
            // (an older one) leaves the line as it was.
            let ring = manager.try_get::<ShardsView>("/shards").await.ok();
            print_lines(&status_lines(view, ring.as_ref()));
            Ok(())
        }
    }
}

/// `cube project status`: the project, then its quota's rows (used / limit).
fn status_lines(view: &ProjectView, ring: Option<&ShardsView>) -> Vec<String> {
    let holder = ring.map(|ring| {
        ring.managers
            .iter()
            .find(|manager| manager.shards.contains(&view.shard))
            .map(|manager| manager.manager.as_str())
    });
    let mut lines = vec![
        format!("Project:  {}", view.name),
        format!(
            "Created:  {}",
            view.create_time
                .map_or_else(|| "-".to_string(), |time| time_ago(Some(time), Utc::now()))
        ),
        format!(
            "Tasks:    {} not ended, {} waiting; jobs: {}",
            view.tasks, view.waiting, view.jobs
        ),
        match holder {
            Some(Some(manager)) => format!("Shard:    {}, held by {manager}", view.shard),
            Some(None) => format!(
                "Shard:    {}, held by no manager at this instant (moving to another)",
                view.shard
            ),
            None => format!("Shard:    {} (its manager: cube node managers)", view.shard),
        },
        String::new(),
    ];
    let mut rows = vec![vec![
        "RESOURCE".to_string(),
        "USED".to_string(),
        "QUOTA".to_string(),
    ]];
    for (resource, used, limit) in view.quota.rows(&view.usage) {
        rows.push(vec![resource.to_string(), used, limit]);
    }
    lines.extend(table(&rows));
    lines
}

/// `cube project list`: one row per project, each resource as `used/limit`.
fn project_table(views: &[ProjectView]) -> Vec<String> {
    let mut rows = vec![vec![
        "NAME".to_string(),
        "TASKS".to_string(),
        "JOBS".to_string(),
        "WAITING".to_string(),
        "CPU".to_string(),
        "MEMORY".to_string(),
        "DISK".to_string(),
        "PLACED".to_string(),
        "SHARD".to_string(),
    ]];
    for view in views {
        let mut row = vec![
            view.name.clone(),
            view.tasks.to_string(),
            view.jobs.to_string(),
            view.waiting.to_string(),
        ];
        for (_, used, limit) in view.quota.rows(&view.usage) {
            row.push(format!("{used}/{limit}"));
        }
        row.push(view.shard.to_string());
        rows.push(row);
    }
    table(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cube_types::project::Usage;

    #[test]
    fn a_status_shows_each_limit_next_to_its_use() {
        let view = ProjectView {
            name: "team-a".to_string(),
            quota: Quota {
                cpus: Some(1.0),
                ..Quota::default()
            },
            usage: Usage::of_task(1.0, 64 << 20, 0),
            tasks: 2,
            jobs: 0,
            waiting: 1,
            create_time: None,
            shard: 7,
        };
        let lines = status_lines(&view, None).join("\n");
        assert!(lines.contains("Project:  team-a"), "{lines}");
        assert!(lines.contains("2 not ended, 1 waiting"), "{lines}");
        assert!(
            lines.contains("Shard:    7 (its manager: cube node managers)"),
            "{lines}"
        );
        let held = |shards: Vec<u32>| ShardsView {
            ring: 16,
            managers: vec![cube_types::shard::ManagerShards {
                manager: "127.0.0.1:5565".to_string(),
                shards,
                virtual_nodes: Vec::new(),
            }],
            unowned: Vec::new(),
        };
        let lines = status_lines(&view, Some(&held(vec![4, 7, 12]))).join("\n");
        assert!(
            lines.contains("Shard:    7, held by 127.0.0.1:5565"),
            "{lines}"
        );
        let lines = status_lines(&view, Some(&held(vec![4]))).join("\n");
        assert!(lines.contains("Shard:    7, held by no manager"), "{lines}");
        let cpu = lines.lines().find(|line| line.starts_with("cpu")).unwrap();
        assert_eq!(
            cpu.split_whitespace().collect::<Vec<_>>(),
            ["cpu", "1", "1"]
        );
        let memory = lines
            .lines()
            .find(|line| line.starts_with("memory"))
            .unwrap();
        assert_eq!(
            memory.split_whitespace().collect::<Vec<_>>(),
            ["memory", "64.0", "MiB", "-"]
        );
        let listed = project_table(&[view]).join("\n");
        assert!(listed.contains("1/1"), "{listed}");
    }
}
