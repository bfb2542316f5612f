//! `cube version`: this client's build, the manager's, and each node's Cube and Docker.

use clap::Args;
use cube_types::Node;
use cube_types::version::VersionInfo;

use super::output::{print_json, print_yaml, table};
use super::{ClusterFlags, ManagerClient};

/// Show versions: this client's, the manager's (and the commit each was built from), and each
/// node's Cube and Docker, with what the manager found wrong with a worker's version.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube version\n  \
    cube version -o json\n  \
    cube version -o yaml")]
pub struct VersionArgs {
    #[command(flatten)]
    target: ClusterFlags,
    /// How to print: lines for people, or the versions as JSON or YAML for scripts.
    #[arg(short, long, value_enum, default_value_t = VersionFormat::Table)]
    output: VersionFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum VersionFormat {
    /// The client's and manager's versions, then a table of the nodes'.
    Table,
    /// `{"Client": …, "Manager": …, "Nodes": […]}`, pretty-printed.
    Json,
    /// The same object as YAML.
    Yaml,
}

pub async fn version(args: VersionArgs) -> anyhow::Result<()> {
    let client = VersionInfo::this_build();
    let manager = ManagerClient::connect_to(&args.target)?;
    let answered: anyhow::Result<(VersionInfo, Vec<Node>)> = async {
        let version: VersionInfo = manager.get("/version").await?;
        let nodes: Vec<Node> = manager.get("/nodes").await?;
        Ok((version, nodes))
    }
    .await;
    if args.output != VersionFormat::Table {
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
        let versions = serde_json::json!({
            "Client": client, "Manager": server, "Nodes": nodes,
        });
        return match args.output {
            VersionFormat::Yaml => print_yaml(&versions),
            _ => print_json(&versions),
        };
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
