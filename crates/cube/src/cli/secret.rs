//! `cube secret create|list|rm`, `cube registry login` and `cube volume ls|rm`: a project's
//! secrets (`GET|POST /secrets`, `DELETE /secrets/{name}`), its registry logins (`POST
//! /registries`) and the named volumes on its nodes (`GET /volumes`, `DELETE
//! /volumes/{name}`).

use std::io::Read;

use anyhow::{Context, bail};
use base64::Engine;
use chrono::Utc;
use clap::{Args, Subcommand};
use cube_types::secret::{NewSecret, RegistryLogin, SecretInfo, VolumeInfo};

use super::output::{print_json, print_lines, table, time_ago};
use super::{ManagerClient, ManagerFlags, OutputFormat};

/// Secrets: values a task reads at /run/secrets/NAME, kept encrypted by the manager.
///
/// A secret belongs to a project (--project). Its value is read from a file or from standard
/// input, never from the command line (which shell history and `ps` keep). The manager keeps
/// it encrypted and gives it only to the worker that starts a task naming it; the worker
/// mounts it read-only on tmpfs at /run/secrets/NAME (or sets a variable, when the task asks:
/// {"Name": "NAME", "Env": "VAR"}). `list` shows names, versions and times, never values.
/// Creating a secret that exists makes its next version; running tasks keep the value they
/// started with, and read the new one when their next run starts (a job's copies: a new
/// version of the job).
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    printf %s 's3cret' | cube secret create db-password\n  \
    cube secret create tls-key --from-file ./key.pem\n  \
    cube run --name db --secret db-password cube-sample:latest\n  \
    cube exec db -- cat /run/secrets/db-password\n  \
    cube secret list\n  \
    cube secret rm db-password            # refused while a task uses it")]
pub struct SecretArgs {
    #[command(subcommand)]
    command: SecretCommand,
}

#[derive(Debug, Subcommand)]
enum SecretCommand {
    /// Keep a secret (its first version, or the next one): its value from --from-file, or
    /// from standard input when none is given (or `-`).
    Create {
        /// Letters, digits, '.', '_' and '-' (it becomes a file name in the container).
        name: String,
        /// The file holding the value; `-` (the default): standard input.
        #[arg(long, short = 'f', value_name = "FILE", default_value = "-")]
        from_file: String,
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// The project's secrets: name, version, when made and last changed (never values).
    #[command(alias = "ls")]
    List {
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// Remove a secret: refused while a task that has not ended uses it.
    Rm {
        name: String,
        #[command(flatten)]
        flags: ManagerFlags,
    },
}

pub async fn secret(args: SecretArgs) -> anyhow::Result<()> {
    match args.command {
        SecretCommand::Create {
            name,
            from_file,
            flags,
        } => {
            let value = if from_file == "-" {
                let mut value = Vec::new();
                std::io::stdin()
                    .read_to_end(&mut value)
                    .context("reading the secret's value from standard input")?;
                value
            } else {
                std::fs::read(&from_file)
                    .with_context(|| format!("--from-file {from_file}: cannot read it"))?
            };
            if value.is_empty() {
                bail!(
                    "the secret's value is empty: give it on standard input or with --from-file \
                     FILE"
                );
            }
            let manager = ManagerClient::connect(&flags)?;
            let request = NewSecret {
                name,
                project: String::new(),
                value: base64::engine::general_purpose::STANDARD.encode(&value),
            };
            let (_, info): (u16, SecretInfo) = manager.post("/secrets", &request).await?;
            match flags.output {
                OutputFormat::Json => print_json(&info),
                OutputFormat::Table => {
                    println!(
                        "secret {} of project {} kept (version {})",
                        info.name, info.project, info.version
                    );
                    Ok(())
                }
            }
        }
        SecretCommand::List { flags } => {
            let manager = ManagerClient::connect(&flags)?;
            let listed: Vec<SecretInfo> = manager.get("/secrets").await?;
            match flags.output {
                OutputFormat::Json => print_json(&listed),
                OutputFormat::Table => {
                    let now = Utc::now();
                    let mut rows = vec![
                        ["NAME", "PROJECT", "VERSION", "CREATED", "UPDATED"]
                            .map(String::from)
                            .to_vec(),
                    ];
                    for info in &listed {
                        rows.push(vec![
                            info.name.clone(),
                            info.project.clone(),
                            info.version.to_string(),
                            time_ago(info.created_time, now),
                            time_ago(info.updated_time, now),
                        ]);
                    }
                    print_lines(&table(&rows));
                    Ok(())
                }
            }
        }
        SecretCommand::Rm { name, flags } => {
            let manager = ManagerClient::connect(&flags)?;
            manager.delete(&format!("/secrets/{name}")).await?;
            println!("secret {name} removed");
            Ok(())
        }
    }
}

/// Private registries: pull a project's images from a registry that needs a login.
///
/// `login` checks the username and password with the registry (when the manager can reach
/// it; a refused login is an error) and keeps them as a secret of the project
/// (`registry:HOST`); every task of the project whose image is on HOST
/// (`HOST/team/app:1`) is pulled with them. A pull that fails says why in the task's error:
/// `unauthorized`, `not found` or `time-out`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cat ./password | cube registry login registry.example.com --username ci --password-stdin\n  \
    cube run --name app registry.example.com/team/app:1")]
pub struct RegistryArgs {
    #[command(subcommand)]
    command: RegistryCommand,
}

#[derive(Debug, Subcommand)]
enum RegistryCommand {
    /// Keep a login to the registry HOST (`registry.example.com`, `127.0.0.1:5000`) for the
    /// project.
    Login {
        host: String,
        #[arg(long, short = 'u')]
        username: String,
        /// Read the password from standard input (the only way: never on the command line).
        #[arg(long, required = true)]
        password_stdin: bool,
        #[command(flatten)]
        flags: ManagerFlags,
    },
}

pub async fn registry(args: RegistryArgs) -> anyhow::Result<()> {
    match args.command {
        RegistryCommand::Login {
            host,
            username,
            password_stdin: _,
            flags,
        } => {
            let mut password = String::new();
            std::io::stdin()
                .read_to_string(&mut password)
                .context("reading the password from standard input")?;
            let password = password.trim_end_matches(['\n', '\r']).to_string();
            if password.is_empty() {
                bail!("no password on standard input");
            }
            let manager = ManagerClient::connect(&flags)?;
            let login = RegistryLogin {
                host: host.clone(),
                project: String::new(),
                username,
                password,
            };
            let (_, answer): (u16, serde_json::Value) = manager.post("/registries", &login).await?;
            match flags.output {
                OutputFormat::Json => print_json(&answer),
                OutputFormat::Table => {
                    let project = answer["Project"].as_str().unwrap_or_default();
                    match answer["Note"].as_str() {
                        Some(note) => println!(
                            "login to {host} kept for project {project} ({note}; a pull that \
                             it does not open will say so)"
                        ),
                        None => println!("login to {host} checked and kept for project {project}"),
                    }
                    Ok(())
                }
            }
        }
    }
}

/// Named volumes: a task's data kept on its node when the task ends.
///
/// A task or a job's group mounts one with `Volumes: ["data:/var/lib/db"]` (`cube run -v
/// data:/var/lib/db`); the worker makes it on the node. Each copy of a job has its own
/// (`data.JOB.GROUP.INDEX`), and a copy started again is placed back on the node that holds
/// its volume (its history says so).
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube volume ls\n  \
    cube volume rm data.db.db.0           # refused while a task uses it\n  \
    cube volume rm data --node w2")]
pub struct VolumeArgs {
    #[command(subcommand)]
    command: VolumeCommand,
}

#[derive(Debug, Subcommand)]
enum VolumeCommand {
    /// The project's volumes: name, node, and the tasks that use them.
    #[command(alias = "list")]
    Ls {
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// Remove a volume and what it holds: refused while a task that has not ended uses it.
    Rm {
        name: String,
        /// The node holding it, when several do.
        #[arg(long)]
        node: Option<String>,
        #[command(flatten)]
        flags: ManagerFlags,
    },
}

pub async fn volume(args: VolumeArgs) -> anyhow::Result<()> {
    match args.command {
        VolumeCommand::Ls { flags } => {
            let manager = ManagerClient::connect(&flags)?;
            let listed: Vec<VolumeInfo> = manager.get("/volumes").await?;
            match flags.output {
                OutputFormat::Json => print_json(&listed),
                OutputFormat::Table => {
                    let mut rows = vec![
                        ["NAME", "PROJECT", "NODE", "USED BY"]
                            .map(String::from)
                            .to_vec(),
                    ];
                    for volume in &listed {
                        rows.push(vec![
                            volume.name.clone(),
                            volume.project.clone(),
                            volume.node.clone(),
                            if volume.used_by.is_empty() {
                                "-".to_string()
                            } else {
                                volume.used_by.join(",")
                            },
                        ]);
                    }
                    print_lines(&table(&rows));
                    Ok(())
                }
            }
        }
        VolumeCommand::Rm { name, node, flags } => {
            let manager = ManagerClient::connect(&flags)?;
            let path = match &node {
                Some(node) => format!("/volumes/{name}?node={node}"),
                None => format!("/volumes/{name}"),
            };
            manager.delete(&path).await?;
            println!("volume {name} removed");
            Ok(())
        }
    }
}
