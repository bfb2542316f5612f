//! `cube config`: named clusters in a config file, and which manager a command reaches.
//!
//! The file (`$CUBE_CONFIG`, or `~/.config/cube/config.yaml`, `$XDG_CONFIG_HOME/cube/` when
//! that is set) names clusters and says which
//! one is current, as kubectl's contexts do:
//!
//! ```yaml
//! current: prod
//! clusters:
//!   prod: {manager: 10.0.0.1:5555}
//!   dev: {manager: 127.0.0.1:5555}
//! ```
//!
//! A command reaches the first of: `-m`, `CUBE_MANAGER`, `--cluster NAME`, the current
//! cluster, 127.0.0.1:5555 ([`resolve_manager`]). The file is read only when neither `-m` nor
//! `CUBE_MANAGER` says, so a broken file never stands in the way of an explicit address.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};

use super::output::{print_lines, table};
use super::{ClusterFlags, DEFAULT_MANAGER};

/// The environment variable that names the config file, in place of the default path.
const CONFIG_ENV: &str = "CUBE_CONFIG";

/// What `cube config view` shows instead of a token.
const HIDDEN_TOKEN: &str = "REDACTED";

/// The config file's contents.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CubeConfig {
    /// The cluster a command reaches when no flag or variable says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    /// Clusters by name.
    #[serde(default)]
    pub clusters: BTreeMap<String, ClusterEntry>,
}

/// One named cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterEntry {
    /// The manager's API address, `HOST:PORT`.
    pub manager: String,
    /// The ACL token sent to this cluster's manager when neither --token nor CUBE_TOKEN
    /// gives one; hidden by `cube config view`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The SHA-256 fingerprint of the cluster's CA (a manager started with --tls): the CLI
    /// then speaks HTTPS and trusts only a manager certificate from that CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_fingerprint: Option<String>,
    /// The project commands work in on this cluster when neither --project nor
    /// CUBE_PROJECT names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
}

/// The manager a command talks to, and what chose it.
#[derive(Debug, Clone, PartialEq)]
pub struct ManagerTarget {
    pub address: String,
    pub source: TargetSource,
    /// The ACL token to send: --token or CUBE_TOKEN, else the chosen cluster's in the file.
    pub token: Option<String>,
    /// The CA fingerprint to verify the manager with (HTTPS): --ca-fingerprint or
    /// CUBE_CA_FINGERPRINT, else the chosen cluster's in the file.
    pub ca_fingerprint: Option<String>,
    /// The project to work in: --project or CUBE_PROJECT, else the chosen cluster's in the
    /// file; none: `default`.
    pub project: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TargetSource {
    /// `-m` or `CUBE_MANAGER`.
    Flag,
    /// `--cluster NAME`.
    Cluster(String),
    /// The config file's current cluster.
    Current(String),
    Default,
}

impl ManagerTarget {
    /// ` (cluster "prod")` when a config file chose the manager, for messages that name it.
    pub fn origin(&self) -> String {
        match &self.source {
            TargetSource::Cluster(name) => format!(" (cluster {name:?})"),
            TargetSource::Current(name) => format!(" (current cluster {name:?})"),
            TargetSource::Flag | TargetSource::Default => String::new(),
        }
    }

    /// `the manager`, or `the manager of cluster "prod"` when a config file chose it.
    pub fn described(&self) -> String {
        match &self.source {
            TargetSource::Cluster(name) => format!("the manager of cluster {name:?}"),
            TargetSource::Current(name) => {
                format!("the manager of the current cluster {name:?}")
            }
            TargetSource::Flag | TargetSource::Default => "the manager".to_string(),
        }
    }
}

/// The manager the flags, `CUBE_MANAGER` or the config file name; see the module's doc for
/// the order. An unknown `--cluster`, a current cluster the file does not define, or a file
/// that cannot be read is an error that names the file.
pub fn resolve_manager(flags: &ClusterFlags) -> anyhow::Result<ManagerTarget> {
    if let Some(address) = &flags.manager {
        if let Some(cluster) = &flags.cluster {
            eprintln!(
                "cube: --cluster {cluster} ignored: -m/CUBE_MANAGER ({address}) takes precedence"
            );
        }
        return Ok(ManagerTarget {
            address: address.clone(),
            source: TargetSource::Flag,
            token: flags.token.clone(),
            ca_fingerprint: flags.ca_fingerprint.clone(),
            project: flags.project.clone(),
        });
    }
    let path = config_path()?;
    let loaded = load(&path)?;
    let mut target = choose(flags.cluster.as_deref(), loaded.as_ref(), &path)?;
    if flags.token.is_some() {
        target.token = flags.token.clone();
    }
    if flags.ca_fingerprint.is_some() {
        target.ca_fingerprint = flags.ca_fingerprint.clone();
    }
    if flags.project.is_some() {
        target.project = flags.project.clone();
    }
    Ok(target)
}

/// The choice among `--cluster`, the file's current cluster and the default, once `-m` and
/// `CUBE_MANAGER` said nothing. `config` is `None` when there is no file at `path`.
fn choose(
    cluster: Option<&str>,
    config: Option<&CubeConfig>,
    path: &Path,
) -> anyhow::Result<ManagerTarget> {
    let file = path.display();
    let (name, source) = match (cluster, config.and_then(|c| c.current.as_deref())) {
        (Some(name), _) => (name, TargetSource::Cluster(name.to_string())),
        (None, Some(current)) => (current, TargetSource::Current(current.to_string())),
        (None, None) => {
            return Ok(ManagerTarget {
                address: DEFAULT_MANAGER.to_string(),
                source: TargetSource::Default,
                token: None,
                ca_fingerprint: None,
                project: None,
            });
        }
    };
    let Some(config) = config else {
        bail!(
            "no cluster named {name:?}: there is no config file at {file}; add one with: \
             cube config set-cluster {name} --manager HOST:PORT"
        );
    };
    match config.clusters.get(name) {
        Some(entry) => Ok(ManagerTarget {
            address: entry.manager.clone(),
            source,
            token: entry.token.clone(),
            ca_fingerprint: entry.ca_fingerprint.clone(),
            project: entry.project.clone(),
        }),
        None => {
            let what = match source {
                TargetSource::Current(_) => "the current cluster",
                _ => "--cluster",
            };
            Err(anyhow!(
                "{file}: {what} {name:?} is not among its clusters ({}); add it with: cube \
                 config set-cluster {name} --manager HOST:PORT",
                cluster_names(config)
            ))
        }
    }
}

fn cluster_names(config: &CubeConfig) -> String {
    if config.clusters.is_empty() {
        return "none".to_string();
    }
    config
        .clusters
        .keys()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `$CUBE_CONFIG`, else `$XDG_CONFIG_HOME/cube/config.yaml`, else
/// `~/.config/cube/config.yaml`.
fn config_path() -> anyhow::Result<PathBuf> {
    let set = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty());
    if let Some(path) = set(CONFIG_ENV) {
        return Ok(PathBuf::from(path));
    }
    // The XDG rule: a relative XDG_CONFIG_HOME is invalid and ignored.
    if let Some(dir) = set("XDG_CONFIG_HOME").map(PathBuf::from)
        && dir.is_absolute()
    {
        return Ok(dir.join("cube").join("config.yaml"));
    }
    match set("HOME") {
        Some(home) => Ok(PathBuf::from(home).join(".config/cube/config.yaml")),
        None => bail!("cannot tell where the config file is: set {CONFIG_ENV} or HOME"),
    }
}

/// The config at `path`, or `None` when there is no file there.
fn load(path: &Path) -> anyhow::Result<Option<CubeConfig>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err).with_context(|| format!("cannot read {}", path.display())),
    };
    parse(&text)
        .map(Some)
        .map_err(|err| anyhow!("{}: {err}", path.display()))
}

/// The file's text as a config; an error says at which line and column, and what is wrong.
fn parse(text: &str) -> anyhow::Result<CubeConfig> {
    // A file of comments and blank lines is a YAML stream without a document: an empty
    // config, not an error.
    let empty = text
        .lines()
        .all(|line| line.trim().is_empty() || line.trim_start().starts_with('#'));
    if empty {
        return Ok(CubeConfig::default());
    }
    let config: CubeConfig = serde_norway::from_str(text).map_err(|err| match err.location() {
        Some(at) => anyhow!(
            "line {}, column {}: {}",
            at.line(),
            at.column(),
            without_location(&err.to_string())
        ),
        None => anyhow!("{err}"),
    })?;
    for (name, entry) in &config.clusters {
        if entry.manager.trim().is_empty() {
            bail!("cluster {name:?} has an empty manager address; expected HOST:PORT");
        }
    }
    Ok(config)
}

/// serde_norway ends its messages with ` at line L column C`, which [`parse`] says first.
fn without_location(message: &str) -> &str {
    match message.rfind(" at line ") {
        Some(at) => &message[..at],
        None => message,
    }
}

/// Writes the config to `path` whole or not at all: into a file beside it, then renamed over
/// it, so that a command interrupted half-way never leaves a broken file. The file may hold
/// tokens, so only its owner may read it.
fn save(path: &Path, config: &CubeConfig) -> anyhow::Result<()> {
    let file = path.display();
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let text = serde_norway::to_string(config).context("cannot write the config as YAML")?;
    let temporary = path.with_extension(format!("yaml.{}.tmp", std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut out = options.open(&temporary)?;
        out.write_all(text.as_bytes())?;
        out.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written.with_context(|| format!("cannot write {file}"))
}

/// Name the clusters `cube` reaches: add one, pick the current one, list them.
///
/// The config file is $CUBE_CONFIG, or ~/.config/cube/config.yaml ($XDG_CONFIG_HOME/cube/
/// config.yaml when XDG_CONFIG_HOME is set). A command reaches the
/// manager given by the first of: -m, CUBE_MANAGER, --cluster NAME, the config file's current
/// cluster, 127.0.0.1:5555.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    cube config set-cluster prod --manager 10.0.0.1:5555\n  \
    cube config set-cluster dev --manager 127.0.0.1:5555\n  \
    cube config use prod          # every command now reaches prod\n  \
    cube --cluster dev status     # one command on dev\n  \
    cube config list              # the clusters, the current one marked *")]
pub struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Make NAME the current cluster: the one commands reach when neither -m, CUBE_MANAGER
    /// nor --cluster says.
    Use {
        /// A cluster the config file names.
        name: String,
    },
    /// Add a cluster, or change its manager's address.
    SetCluster {
        /// The cluster's name, for --cluster and `cube config use`.
        name: String,
        /// The cluster's manager, HOST:PORT.
        #[arg(short, long, value_name = "HOST:PORT")]
        manager: String,
        /// The ACL token to send to this cluster's manager (kept in the file, which is
        /// written readable by its owner only).
        #[arg(long, value_name = "TOKEN")]
        token: Option<String>,
        /// The SHA-256 fingerprint of the cluster's CA, for a manager started with --tls
        /// (it prints it when it starts): commands then reach it over HTTPS, verified.
        #[arg(long, value_name = "SHA256")]
        ca_fingerprint: Option<String>,
        /// The project commands work in on this cluster when neither --project nor
        /// CUBE_PROJECT names one.
        #[arg(long = "default-project", value_name = "NAME")]
        default_project: Option<String>,
    },
    /// List the clusters; the current one is marked *.
    List,
    /// Print the config file (tokens hidden).
    View,
}

pub async fn config(args: ConfigArgs) -> anyhow::Result<()> {
    let path = config_path()?;
    let loaded = load(&path)?;
    match args.command {
        ConfigCommand::Use { name } => {
            let mut config = loaded.ok_or_else(|| {
                anyhow!(
                    "no cluster named {name:?}: there is no config file at {} yet; add one \
                     with: cube config set-cluster {name} --manager HOST:PORT",
                    path.display()
                )
            })?;
            if !config.clusters.contains_key(&name) {
                bail!(
                    "{}: no cluster named {name:?} (it has: {}); add it with: cube config \
                     set-cluster {name} --manager HOST:PORT",
                    path.display(),
                    cluster_names(&config)
                );
            }
            config.current = Some(name.clone());
            save(&path, &config)?;
            println!("current cluster: {name}");
        }
        ConfigCommand::SetCluster {
            name,
            manager,
            token,
            ca_fingerprint,
            default_project,
        } => {
            if let Some(project) = &default_project {
                cube_types::project::check_project_name(project)
                    .map_err(|why| anyhow!("--default-project: {why}"))?;
            }
            // Checked as every command will read it, so that a typo fails here and not later.
            let tls = match &ca_fingerprint {
                None => None,
                Some(fingerprint) => {
                    let verifier = cube_api::tls::PinnedCaVerifier::new(fingerprint, None)
                        .map_err(|err| anyhow!("--ca-fingerprint: {err}"))?;
                    Some(cube_api::tls::client_config(verifier, None)?)
                }
            };
            cube_api::ApiClient::with_tls(&manager, super::REQUEST_TIMEOUT, tls)
                .map_err(|err| anyhow!("--manager {manager:?}: {err}"))?;
            let mut config = loaded.unwrap_or_default();
            let entry = config
                .clusters
                .entry(name.clone())
                .or_insert_with(|| ClusterEntry {
                    manager: manager.clone(),
                    token: None,
                    ca_fingerprint: None,
                    project: None,
                });
            entry.manager = manager.clone();
            if token.is_some() {
                entry.token = token;
            }
            if ca_fingerprint.is_some() {
                entry.ca_fingerprint = ca_fingerprint;
            }
            if default_project.is_some() {
                entry.project = default_project;
            }
            // The first cluster is the one a user means until they say otherwise.
            let made_current = config.current.is_none();
            if made_current {
                config.current = Some(name.clone());
            }
            save(&path, &config)?;
            let current = if made_current {
                " (now the current cluster)"
            } else {
                ""
            };
            println!("cluster {name}: {manager}{current}");
        }
        ConfigCommand::List => print_lines(&cluster_table(&loaded.unwrap_or_default())),
        ConfigCommand::View => match loaded {
            Some(config) => {
                println!("# {}", path.display());
                print!("{}", serde_norway::to_string(&with_tokens_hidden(config))?);
            }
            None => eprintln!(
                "no config file at {} yet; add a cluster with: cube config set-cluster NAME \
                 --manager HOST:PORT",
                path.display()
            ),
        },
    }
    Ok(())
}

/// `CURRENT NAME MANAGER`, the current cluster marked `*`, as `kubectl config get-contexts`.
fn cluster_table(config: &CubeConfig) -> Vec<String> {
    let mut rows = vec![["CURRENT", "NAME", "MANAGER"].map(String::from).to_vec()];
    rows.extend(config.clusters.iter().map(|(name, entry)| {
        let current = if config.current.as_deref() == Some(name) {
            "*"
        } else {
            ""
        };
        vec![current.to_string(), name.clone(), entry.manager.clone()]
    }));
    table(&rows)
}

fn with_tokens_hidden(mut config: CubeConfig) -> CubeConfig {
    for entry in config.clusters.values_mut() {
        if entry.token.is_some() {
            entry.token = Some(HIDDEN_TOKEN.to_string());
        }
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_CLUSTERS: &str = "current: prod\nclusters:\n  prod: {manager: 10.0.0.1:5555}\n  \
                                dev: {manager: 127.0.0.1:5555, token: s3cret}\n";

    fn path() -> PathBuf {
        PathBuf::from("/home/u/.config/cube/config.yaml")
    }

    #[test]
    fn the_file_names_clusters_and_the_current_one() {
        let config = parse(TWO_CLUSTERS).unwrap();
        assert_eq!(config.current.as_deref(), Some("prod"));
        assert_eq!(config.clusters["prod"].manager, "10.0.0.1:5555");
        assert_eq!(config.clusters["dev"].token.as_deref(), Some("s3cret"));
    }

    #[test]
    fn a_file_of_comments_is_an_empty_config() {
        assert_eq!(parse("# nothing yet\n\n").unwrap(), CubeConfig::default());
        assert_eq!(parse("").unwrap(), CubeConfig::default());
    }

    #[test]
    fn a_broken_file_is_an_error_that_says_the_line() {
        let err = parse("current: prod\nclusters:\n  prod: {manager: [10.0.0.1}\n").unwrap_err();
        assert!(err.to_string().starts_with("line 3, column "), "{err}");
        let err = parse("current: prod\nclustres: {}\n").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("line 2, column 1: unknown field `clustres`"),
            "{err}"
        );
        let err = parse("clusters:\n  prod: {manager: ''}\n").unwrap_err();
        assert!(err.to_string().contains("empty manager address"), "{err}");
    }

    #[test]
    fn cluster_beats_current_and_current_beats_the_default() {
        let config = parse(TWO_CLUSTERS).unwrap();
        let chosen = choose(Some("dev"), Some(&config), &path()).unwrap();
        assert_eq!(chosen.address, "127.0.0.1:5555");
        assert_eq!(chosen.source, TargetSource::Cluster("dev".to_string()));
        let chosen = choose(None, Some(&config), &path()).unwrap();
        assert_eq!(chosen.address, "10.0.0.1:5555");
        assert_eq!(chosen.origin(), " (current cluster \"prod\")");
        let chosen = choose(None, None, &path()).unwrap();
        assert_eq!(chosen.address, DEFAULT_MANAGER);
        assert_eq!(chosen.source, TargetSource::Default);
    }

    #[test]
    fn an_unknown_cluster_names_the_file_and_the_clusters_it_has() {
        let config = parse(TWO_CLUSTERS).unwrap();
        let err = choose(Some("qa"), Some(&config), &path()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/home/u/.config/cube/config.yaml: --cluster \"qa\" is not among its clusters \
             (dev, prod); add it with: cube config set-cluster qa --manager HOST:PORT"
        );
        let err = choose(Some("qa"), None, &path()).unwrap_err();
        assert!(
            err.to_string()
                .contains("there is no config file at /home/u/.config/cube/config.yaml"),
            "{err}"
        );
    }

    #[test]
    fn the_cluster_list_marks_the_current_one_and_view_hides_tokens() {
        let config = parse(TWO_CLUSTERS).unwrap();
        assert_eq!(
            cluster_table(&config),
            vec![
                "CURRENT   NAME   MANAGER",
                "          dev    127.0.0.1:5555",
                "*         prod   10.0.0.1:5555",
            ]
        );
        let hidden = with_tokens_hidden(config);
        assert_eq!(hidden.clusters["dev"].token.as_deref(), Some(HIDDEN_TOKEN));
        assert_eq!(hidden.clusters["prod"].token, None);
    }

    #[test]
    fn a_saved_config_reads_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/config.yaml");
        let config = parse(TWO_CLUSTERS).unwrap();
        save(&path, &config).unwrap();
        assert_eq!(load(&path).unwrap(), Some(config));
        assert_eq!(load(&dir.path().join("absent.yaml")).unwrap(), None);
    }
}
