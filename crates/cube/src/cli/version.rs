//! `cube version`: this client's build, the manager's, and each node's Cube and Docker.

use clap::Args;
use cube_types::Node;
use cube_types::version::VersionInfo;

use super::output::{print_json, table};
use super::{ManagerClient, ManagerFlags, OutputFormat};

/// Show versions: this client's, the manager's (and the commit each was built from), and each
/// node's Cube and Docker, with what the manager found wrong with a worker's version.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube version\n  \
    cube version -o json")]
pub struct VersionArgs {
    #[command(flatten)]
    flags: ManagerFlags,
}

pub async fn version(args: VersionArgs) -> anyhow::Result<()> {
    let client = VersionInfo::this_build();
    let manager = ManagerClient::connect(&args.flags)?;
    let answered: anyhow::Result<(VersionInfo, Vec<Node>)> = async {
        let version: VersionInfo = manager.get("/version").await?;
        let nodes: Vec<Node> = manager.get("/nodes").await?;
        Ok((version, nodes))
    }
    .await;
    if args.flags.output == OutputFormat::Json {
        let (server, nodes) = answered?;
        let nodes: Vec<serde_json::Value> = nodes
            .iter()
            .map(|node| {
                serde_json::json!({
                    "Name": node.name, "Version": node.version,
                    "VersionWarning": node.version_warning,
                })
            })
            .collect();
        return print_json(&serde_json::json!({
            "Client": client, "Manager": server, "Nodes": nodes,
        }));
    }
    println!(
        "Client:  cube {} (commit {})",
        client.version, client.commit
    );
    let (server, nodes) = answered?;
    println!(
        "Manager: cube {} (commit {}) at {}",
        server.version,
        server.commit,
        manager.api().base()
    );
    if nodes.is_empty() {
        println!("Nodes:   none has joined");
        return Ok(());
    }
    let mut rows = vec![
        ["NODE", "CUBE", "COMMIT", "DOCKER", "DOCKER API", "NOTE"]
            .map(String::from)
            .to_vec(),
    ];
    for node in &nodes {
        let version = node.version.as_ref();
        let dash = || "-".to_string();
        rows.push(vec![
            node.name.clone(),
            version.map_or_else(dash, |v| v.version.clone()),
            version.map_or_else(dash, |v| v.commit.clone()),
            version.and_then(|v| v.docker.clone()).unwrap_or_else(dash),
            version
                .and_then(|v| v.docker_api_version.clone())
                .unwrap_or_else(dash),
            node.version_warning.clone().unwrap_or_default(),
        ]);
    }
    println!();
    for line in table(&rows) {
        println!("{}", line.trim_end());
    }
    Ok(())
}
