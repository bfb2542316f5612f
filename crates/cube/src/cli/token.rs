//! `cube acl bootstrap` and `cube token create|list|revoke`: the tokens of a manager started
//! with `--acl` (`POST /acl/bootstrap`, `POST|GET /acl/tokens`, `DELETE /acl/tokens/{id}`).

use chrono::Utc;
use clap::{Args, Subcommand};
use cube_types::token::{Role, TokenCreated, TokenRequest, TokenView};

use super::output::{print_json, print_lines, table, time_ago};
use super::{ManagerClient, ManagerFlags, OutputFormat};

/// The manager's ACL: `cube acl bootstrap` makes the first management token.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube manager --acl &\n  \
    cube acl bootstrap                     # prints the first management token, once\n  \
    export CUBE_TOKEN=cube.1a2b...         # then every command sends it")]
pub struct AclArgs {
    #[command(subcommand)]
    command: AclCommand,
}

#[derive(Debug, Subcommand)]
enum AclCommand {
    /// Make the first management token of a manager started with --acl, and print it. It is
    /// shown once and kept nowhere; a second bootstrap is refused.
    Bootstrap {
        #[command(flatten)]
        flags: ManagerFlags,
    },
}

/// Make, list and revoke ACL tokens (a management token is needed).
///
/// Roles: read (every GET), submit (also run, stop, scale, logs and exec of tasks and jobs),
/// operator (also drain, eligibility and removal of nodes), management (also tokens), node (a
/// join token for `cube worker --join HOST:PORT --token TOKEN`: it registers and reports as
/// one node, the first name it registers, and does nothing else; make one per node).
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube token create --role submit --name ci --ttl 24h\n  \
    cube token create --role submit --project team-a,team-b   # or --project '*'\n  \
    cube token create --role node --name w1-join\n  \
    cube token create --role router --name edge\n  \
    cube token list\n  \
    cube token revoke 1a2b3c4d5e6f7a8b")]
pub struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Make a token and print it (shown once: only its hash is kept).
    Create {
        /// read, submit, operator, management, node or router (`cube router`: reads the
        /// routes and nothing else).
        #[arg(long, value_parser = Role::parse)]
        role: Role,
        /// A name to know it by in `cube token list` and the audit log [default: ROLE-ID].
        #[arg(long)]
        name: Option<String>,
        /// How long it lasts (e.g. 24h, 90s, 720h; at most 8760h); without, until revoked.
        #[arg(long)]
        ttl: Option<String>,
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// List the tokens (never their secrets).
    List {
        #[command(flatten)]
        flags: ManagerFlags,
    },
    /// Revoke a token: it is refused from the next request on.
    Revoke {
        /// The token's ID (the first column of `cube token list`, or the part after `cube.`).
        id: String,
        #[command(flatten)]
        flags: ManagerFlags,
    },
}

pub async fn acl(args: AclArgs) -> anyhow::Result<()> {
    match args.command {
        AclCommand::Bootstrap { flags } => {
            let manager = ManagerClient::connect(&flags)?;
            let (_, created): (u16, TokenCreated) = manager
                .post("/acl/bootstrap", &serde_json::json!({}))
                .await?;
            print_created(&created, flags.output)
        }
    }
}

pub async fn token(args: TokenArgs) -> anyhow::Result<()> {
    match args.command {
        TokenCommand::Create {
            role,
            name,
            ttl,
            mut flags,
        } => {
            // --project (or CUBE_PROJECT) names the projects the token holds in, not one to
            // send the request in.
            let projects: Vec<String> = flags
                .target
                .project
                .take()
                .map(|list| {
                    list.split(',')
                        .map(|project| project.trim().to_string())
                        .filter(|project| !project.is_empty())
                        .collect()
                })
                .unwrap_or_default();
            let projects = if matches!(role, Role::Management | Role::Node) {
                Vec::new()
            } else {
                projects
            };
            let manager = ManagerClient::connect(&flags)?;
            let request = TokenRequest {
                role,
                name,
                ttl,
                projects,
            };
            let (_, created): (u16, TokenCreated) = manager.post("/acl/tokens", &request).await?;
            print_created(&created, flags.output)
        }
        TokenCommand::List { flags } => {
            let manager = ManagerClient::connect(&flags)?;
            let tokens: Vec<TokenView> = manager.get("/acl/tokens").await?;
            match flags.output {
                OutputFormat::Json => print_json(&tokens),
                OutputFormat::Table => {
                    print_lines(&token_table(&tokens));
                    Ok(())
                }
            }
        }
        TokenCommand::Revoke { id, flags } => {
            let id = id
                .strip_prefix(cube_types::token::TOKEN_PREFIX)
                .map_or(id.as_str(), |rest| rest.split('.').next().unwrap_or(rest))
                .to_string();
            let manager = ManagerClient::connect(&flags)?;
            manager.delete(&format!("/acl/tokens/{id}")).await?;
            println!("token {id} revoked");
            Ok(())
        }
    }
}

fn print_created(created: &TokenCreated, output: OutputFormat) -> anyhow::Result<()> {
    match output {
        OutputFormat::Json => print_json(created),
        OutputFormat::Table => {
            let token = &created.token;
            let expiry = token
                .expire_time
                .map_or_else(|| "never".to_string(), |time| time.to_rfc3339());
            println!("{}", created.secret);
            eprintln!(
                "token {} ({}, role {}, expires {expiry}): shown once, keep it safe; use it \
                 with --token, CUBE_TOKEN or `cube config set-cluster NAME --manager HOST:PORT \
                 --token TOKEN`",
                token.id, token.name, token.role
            );
            Ok(())
        }
    }
}

fn token_table(tokens: &[TokenView]) -> Vec<String> {
    let now = Utc::now();
    let mut rows = vec![vec![
        "ID".to_string(),
        "NAME".to_string(),
        "ROLE".to_string(),
        "NODE".to_string(),
        "PROJECTS".to_string(),
        "CREATED".to_string(),
        "EXPIRES".to_string(),
    ]];
    for token in tokens {
        rows.push(vec![
            token.id.clone(),
            token.name.clone(),
            token.role.to_string(),
            token.node.clone().unwrap_or_else(|| "-".to_string()),
            match token.role {
                Role::Management | Role::Router => "*".to_string(),
                Role::Node => "-".to_string(),
                _ if token.projects.is_empty() => "default".to_string(),
                _ => token.projects.join(","),
            },
            time_ago(Some(token.create_time), now),
            token
                .expire_time
                .map_or_else(|| "never".to_string(), |time| time.to_rfc3339()),
        ]);
    }
    table(&rows)
}
