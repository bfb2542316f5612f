//! The commands that drive a cluster through the manager's API: `cube run`, `cube stop`,
//! `cube status`, `cube node`, `cube job`, `cube events`; and `cube config`, which names the
//! clusters they reach.
//!
//! One file per command: it reads its flags, asks the manager over HTTP and prints the answer
//! as a table for people or as JSON or YAML for programs. What they share is here (the manager
//! and output flags, and the words for a manager that cannot be reached), in [`output`]
//! (tables, times, JSON, YAML), in [`config`] (which manager a command reaches) and in
//! [`resolve`] (finding a task by ID, ID prefix or name).
//!
//! Nothing here decides anything about tasks or nodes: the manager does. The commands only
//! ask, and show the answer — including why a task waits or failed.

mod attach;
mod completion;
mod config;
mod events;
mod exec;
mod input;
mod job;
mod job_output;
mod logs;
mod node;
mod output;
mod project;
mod prune;
mod queue;
mod resolve;
mod restart;
mod router;
mod run;
mod secret;
mod status;
mod stop;
mod token;
mod version;
mod wait;
mod watch;

use std::ffi::OsString;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{anyhow, bail};
use clap::{Args, ValueEnum};
use cube_api::{ApiClient, ClientError, Unreached, innermost_cause};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use completion::{CompletionArgs, completion};
pub use config::{ConfigArgs, config};
pub use events::{EventsArgs, events};
pub use exec::{ExecArgs, exec};
pub use job::{JobArgs, job};
pub use logs::{LogsArgs, logs};
pub use node::{NodeArgs, node};
pub use project::{ProjectArgs, project};
pub use prune::{PruneArgs, RmArgs, prune, rm};
pub use queue::{QueueArgs, ServiceArgs, queue, service};
pub use restart::{RestartArgs, restart};
pub use router::{RouterArgs, router};
pub use run::{RunArgs, run_task};
pub use secret::{RegistryArgs, SecretArgs, VolumeArgs, registry, secret, volume};
pub use status::{StatusArgs, status};
pub use stop::{StopArgs, stop};
pub use token::{AclArgs, TokenArgs, acl, token};
pub use version::{VersionArgs, version};

/// Where the commands look for a manager when neither the flags, `CUBE_MANAGER` nor the config
/// file say.
const DEFAULT_MANAGER: &str = "127.0.0.1:5555";

/// How long one request to the manager may take before the command gives up.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Which manager a command talks to. Every command that talks to one has these flags, before
/// or after its name (`cube --cluster prod status` is `cube status --cluster prod`).
#[derive(Debug, Clone, Args)]
pub struct ClusterFlags {
    /// The manager's API address.
    ///
    /// The manager a command reaches is the first of: -m, CUBE_MANAGER, --cluster, the config
    /// file's current cluster, 127.0.0.1:5555.
    #[arg(short, long, env = "CUBE_MANAGER", value_name = "HOST:PORT")]
    pub manager: Option<String>,
    /// A cluster named in the config file, for this command only.
    ///
    /// The config file is $CUBE_CONFIG, or ~/.config/cube/config.yaml (under $XDG_CONFIG_HOME
    /// when that is set); add a cluster with
    /// `cube config set-cluster NAME --manager HOST:PORT`. -m and CUBE_MANAGER take
    /// precedence over it.
    #[arg(long, value_name = "NAME")]
    pub cluster: Option<String>,
    /// The ACL token to send (`Authorization: Bearer`) to a manager started with --acl.
    ///
    /// The first of: --token, CUBE_TOKEN, the token of the config file's cluster (`cube
    /// config set-cluster NAME --manager HOST:PORT --token TOKEN`).
    #[arg(long, env = "CUBE_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub token: Option<String>,
    /// The SHA-256 fingerprint of the cluster's CA, for a manager started with --tls: the
    /// connection is then HTTPS, and the manager's certificate must come from that CA.
    ///
    /// The first of: --ca-fingerprint, CUBE_CA_FINGERPRINT, the config file's cluster's
    /// (`cube config set-cluster NAME --manager https://HOST:PORT --ca-fingerprint FP`). The
    /// manager prints it when it starts.
    #[arg(long, env = "CUBE_CA_FINGERPRINT", value_name = "SHA256")]
    pub ca_fingerprint: Option<String>,
    /// The project the command works in: what it lists, shows and creates; `*` lists every
    /// project the token reaches (with a PROJECT column).
    ///
    /// The first of: --project, CUBE_PROJECT, the config file's cluster's `project`, then
    /// `default`. `cube project list` shows the projects.
    #[arg(long, env = "CUBE_PROJECT", value_name = "NAME")]
    pub project: Option<String>,
}

impl ClusterFlags {
    /// ` -m HOST:PORT` or ` --cluster NAME` when the manager is not the one a bare command
    /// reaches, and ` --project NAME` when the project is not, so that a printed hint to run
    /// another command reaches the same manager and the same project; empty otherwise (an
    /// address from `CUBE_MANAGER`, a project from `CUBE_PROJECT`, reach the next command
    /// too).
    fn hint(&self) -> String {
        let from_environment =
            |variable: &str, value: &String| std::env::var(variable).is_ok_and(|set| &set == value);
        let mut hint = match (&self.manager, &self.cluster) {
            (Some(manager), _)
                if manager != DEFAULT_MANAGER && !from_environment("CUBE_MANAGER", manager) =>
            {
                format!(" -m {manager}")
            }
            (Some(_), _) => String::new(),
            (None, Some(cluster)) => format!(" --cluster {cluster}"),
            (None, None) => String::new(),
        };
        if let Some(project) = &self.project
            && project != cube_types::project::DEFAULT_PROJECT
            && !from_environment("CUBE_PROJECT", project)
        {
            hint.push_str(&format!(" --project {project}"));
        }
        hint
    }
}

/// The flags of a command that talks to the manager and prints one answer.
#[derive(Debug, Clone, Args)]
pub struct ManagerFlags {
    #[command(flatten)]
    pub target: ClusterFlags,
    /// How to print the answer: a table for people, or JSON (the API's objects) for scripts.
    #[arg(short, long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

impl ManagerFlags {
    /// See [`ClusterFlags::hint`].
    fn manager_hint(&self) -> String {
        self.target.hint()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns and `key: value` lines.
    Table,
    /// Pretty-printed JSON on stdout, and nothing else there.
    Json,
}

/// The flags of a listing (`cube status`, `cube node`): which manager, and how to print.
#[derive(Debug, Clone, Args)]
pub struct ListFlags {
    #[command(flatten)]
    pub target: ClusterFlags,
    /// How to print: a table, a wider table, the API's objects as JSON or YAML, or names.
    #[arg(short, long, value_enum, default_value_t = ListFormat::Table)]
    pub output: ListFormat,
    /// Print only the IDs (of nodes: the names), one per line.
    #[arg(short, long, conflicts_with = "output")]
    pub quiet: bool,
}

impl ListFlags {
    /// What to print, `-q` included.
    fn format(&self) -> ListFormat {
        if self.quiet {
            ListFormat::Ids
        } else {
            self.output
        }
    }
}

/// How a listing prints, as `kubectl get -o` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ListFormat {
    /// Aligned columns and `key: value` lines.
    Table,
    /// The table with more columns.
    Wide,
    /// The API's objects as pretty-printed JSON, and nothing else on stdout.
    Json,
    /// The same objects as YAML.
    Yaml,
    /// One name per line.
    Name,
    /// One ID per line (`-q`).
    #[value(skip)]
    Ids,
}

/// `cube -o json status` read as `cube status -o json`: the manager flags (`-o`, `-m`,
/// `--cluster`, `--token`, `--ca-fingerprint`) given before the command's name are moved to just after it, where the command
/// defines them. Other arguments, and a line with nothing after the flags, are left as they
/// are, for clap to judge.
///
/// Why not clap's `global` flags: they would also reach `cube worker`, whose own `-m` means
/// the manager to register with, and `cube manager` and `cube dev`, which print nothing.
///
/// A command with subcommands (`cube -o json job status`, `cube -m HOST node managers`) takes
/// the flags after its subcommand, where they are defined: which commands have which is read
/// from `command`, the command line's definition, so none is forgotten.
pub fn manager_flags_after_command(
    command: &clap::Command,
    args: impl IntoIterator<Item = OsString>,
) -> Vec<OsString> {
    let args: Vec<OsString> = args.into_iter().collect();
    let mut leading = Vec::new();
    let mut index = 1;
    while let Some(arg) = args.get(index).and_then(|arg| arg.to_str()) {
        match leading_flag(arg) {
            LeadingFlag::ValueNext if index + 1 < args.len() => {
                leading.extend_from_slice(&args[index..index + 2]);
                index += 2;
            }
            LeadingFlag::ValueJoined => {
                leading.push(args[index].clone());
                index += 1;
            }
            LeadingFlag::ValueNext | LeadingFlag::Other => break,
        }
    }
    let command_follows = args
        .get(index)
        .is_some_and(|arg| !arg.to_string_lossy().starts_with('-'));
    if leading.is_empty() || !command_follows {
        return args;
    }
    // Down the subcommands named: `node managers` is a subcommand of `node`, `node w1` a
    // node's name.
    let mut command_end = index;
    let mut here = named_subcommand(command, &args[index]);
    while let Some(level) = here {
        let Some(sub) = args
            .get(command_end + 1)
            .and_then(|arg| named_subcommand(level, arg))
        else {
            break;
        };
        command_end += 1;
        here = Some(sub);
    }
    let mut moved = Vec::with_capacity(args.len());
    moved.extend_from_slice(&args[..1]);
    moved.extend_from_slice(&args[index..=command_end]);
    moved.extend(leading);
    moved.extend_from_slice(&args[command_end + 1..]);
    moved
}

/// The subcommand of `command` that `arg` names (by name or alias), if any.
fn named_subcommand<'a>(command: &'a clap::Command, arg: &OsString) -> Option<&'a clap::Command> {
    let arg = arg.to_str()?;
    command.find_subcommand(arg)
}

enum LeadingFlag {
    /// `-o` or `--output`: the value is the next argument.
    ValueNext,
    /// `-ojson` or `--output=json`.
    ValueJoined,
    Other,
}

fn leading_flag(arg: &str) -> LeadingFlag {
    const LONG: [&str; 6] = [
        "--output",
        "--manager",
        "--cluster",
        "--token",
        "--ca-fingerprint",
        "--project",
    ];
    const SHORT: [&str; 2] = ["-o", "-m"];
    if LONG.contains(&arg) || SHORT.contains(&arg) {
        return LeadingFlag::ValueNext;
    }
    let joined_long = LONG.iter().any(|flag| {
        arg.strip_prefix(flag)
            .is_some_and(|rest| rest.starts_with('='))
    });
    let joined_short = SHORT
        .iter()
        .any(|flag| arg.starts_with(flag) && !arg.starts_with("--"));
    if joined_long || joined_short {
        LeadingFlag::ValueJoined
    } else {
        LeadingFlag::Other
    }
}

/// How long a request is tried again after a manager answered 503 (no manager leads yet, or
/// the leader does not answer): longer than an election after a leader died (`--leader-ttl`,
/// 5 s by default, then the new leader loads the state), short enough that a cluster with
/// no leader for good is reported rather than waited for.
const FAILOVER_FOR: Duration = Duration::from_secs(20);

/// The pause before the first round of tries again; it doubles each round, up to
/// [`MOST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MOST_PAUSE: Duration = Duration::from_secs(2);

/// Which failures of a request may be sent again, to the next manager or the same one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// A read, a blocking query, a `DELETE` or a `PUT`: asking twice does what asking once
    /// does, so a 503 or a broken connection is tried again too.
    Idempotent,
    /// A `POST`: only a request no manager saw (the connection was refused) is sent again.
    OnlyUnsent,
}

/// Whether `err` may be answered by trying again, on the next manager or, after a pause, the
/// same one. A timeout never is: the manager may still be carrying the request out.
fn worth_another_try(err: &ClientError, retry: Retry) -> bool {
    match err {
        ClientError::Unreachable {
            kind: Unreached::Connect,
            ..
        } => true,
        ClientError::Unreachable {
            kind: Unreached::Broken,
            ..
        } => retry == Retry::Idempotent,
        // A manager that no longer holds the project's shard (it moved, `--shard-controllers`)
        // did nothing with the request: any request may go again, once the shard is held.
        ClientError::Status { status, .. }
            if *status == reqwest::StatusCode::MISDIRECTED_REQUEST =>
        {
            true
        }
        ClientError::Status { status, .. } => {
            retry == Retry::Idempotent && *status == reqwest::StatusCode::SERVICE_UNAVAILABLE
        }
        _ => false,
    }
}

/// The manager's API as the commands use it: every failure becomes an error that says what
/// to do about it, most of all when no manager answers.
///
/// Given several managers (`-m a:5555,b:5555`, managers sharing one etcd cluster), a request
/// goes to the one that answered last (the first, at the start); one that cannot be reached,
/// answers 421 (it no longer holds the project's shard, which moves), or (for an idempotent
/// request) answers 503 or breaks the connection, is tried on the next. Once every manager
/// failed so, and one of them answered 503 or 421 (the cluster is there but elects a leader
/// or moves a shard), the round is tried again after a pause that doubles, for at most
/// [`FAILOVER_FOR`]. When every one refused the connection, none runs: that is said at once.
struct ManagerClient {
    /// One client per manager given, in the order given; never empty.
    apis: Vec<ApiClient>,
    /// The index in `apis` of the manager asked first: the one that answered last.
    current: AtomicUsize,
    /// "the manager", or "the manager of cluster ..." when the config file chose it.
    origin: String,
    /// What the last request that gave up tried (`tried 6 times in 20 s on ...`), for the
    /// error that ends the command. A `std` lock: held only to set or take the text.
    gave_up: Mutex<Option<String>>,
    /// The project the command works in, when one was named (`--project`, `CUBE_PROJECT`,
    /// the config file): every request carries it.
    project: Option<String>,
}

impl ManagerClient {
    /// The line a table starts with when the command works in another project than
    /// `default` (`project: team-a`), so that an empty or short list says whose it is.
    fn project_line(&self) -> Option<String> {
        match self.project.as_deref() {
            None | Some(cube_types::project::DEFAULT_PROJECT) => None,
            Some(cube_types::project::ALL_PROJECTS) => {
                Some("project: * (every project the token holds in)".to_string())
            }
            Some(project) => Some(format!("project: {project}")),
        }
    }

    /// Prints [`ManagerClient::project_line`] for a table, if there is one.
    fn print_project_line(&self, format: ListFormat) {
        if matches!(format, ListFormat::Table | ListFormat::Wide)
            && let Some(line) = self.project_line()
        {
            println!("{line}");
        }
    }

    fn connect(flags: &ManagerFlags) -> anyhow::Result<ManagerClient> {
        ManagerClient::connect_to(&flags.target)
    }

    /// A client for the managers the flags, `CUBE_MANAGER` or the config file name.
    fn connect_to(flags: &ClusterFlags) -> anyhow::Result<ManagerClient> {
        let target = config::resolve_manager(flags)?;
        let tls = match &target.ca_fingerprint {
            None => None,
            Some(fingerprint) => {
                let verifier = cube_api::tls::PinnedCaVerifier::new(
                    fingerprint,
                    Some(cube_api::tls::PeerRole::Manager),
                )
                .map_err(|err| anyhow!("--ca-fingerprint: {err}"))?;
                Some(cube_api::tls::client_config(verifier, None)?)
            }
        };
        let apis = target
            .address
            .split(',')
            .map(str::trim)
            .filter(|address| !address.is_empty())
            .map(|address| {
                ApiClient::with_tls(address, REQUEST_TIMEOUT, tls.clone())
                    .map(|api| {
                        api.with_token(target.token.as_deref())
                            .with_project(target.project.as_deref())
                    })
                    .map_err(|err| {
                        anyhow!(
                            "{err}{}; set the manager with -m HOST:PORT[,HOST:PORT...], \
                         CUBE_MANAGER or --cluster NAME",
                            target.origin()
                        )
                    })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        if apis.is_empty() {
            bail!("no manager address given; set one with -m HOST:PORT or CUBE_MANAGER");
        }
        Ok(ManagerClient {
            apis,
            current: AtomicUsize::new(0),
            origin: target.described(),
            gave_up: Mutex::new(None),
            project: target.project.clone(),
        })
    }

    /// The client of the manager asked first.
    fn api(&self) -> &ApiClient {
        &self.apis[self.current.load(Ordering::Relaxed) % self.apis.len()]
    }

    /// "the manager at URL" (with the cluster it came from, if any), for errors.
    fn described(&self) -> String {
        format!("{} at {}", self.origin, self.api().base())
    }

    /// `call` on the manager asked first, and on the others as the type's doc says.
    async fn failover<T, F, Fut>(&self, retry: Retry, call: F) -> Result<T, ClientError>
    where
        F: Fn(ApiClient) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        *self.gave_up.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let started = tokio::time::Instant::now();
        let mut pause = FIRST_PAUSE;
        let mut tries = 0usize;
        loop {
            let mut unavailable = false;
            let mut last = None;
            for _ in 0..self.apis.len() {
                let index = self.current.load(Ordering::Relaxed) % self.apis.len();
                match call(self.apis[index].clone()).await {
                    Ok(answer) => return Ok(answer),
                    Err(err) if worth_another_try(&err, retry) => {
                        tries += 1;
                        unavailable |= err.status().is_some();
                        if self.apis.len() > 1 {
                            self.current
                                .store((index + 1) % self.apis.len(), Ordering::Relaxed);
                        }
                        last = Some(err);
                    }
                    Err(err) => return Err(err),
                }
            }
            let Some(err) = last else {
                // `apis` is never empty, so a round without an answer had an error.
                unreachable!("a round of tries over no manager");
            };
            if !unavailable || started.elapsed() + pause > FAILOVER_FOR {
                if tries > 1 {
                    let bases: Vec<&str> = self.apis.iter().map(ApiClient::base).collect();
                    *self.gave_up.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!(
                        "tried {tries} times in {} s on {}",
                        started.elapsed().as_secs(),
                        bases.join(", ")
                    ));
                }
                return Err(err);
            }
            // A pause between rounds, bounded above: a leader is being elected.
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MOST_PAUSE);
        }
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.try_get(path).await.map_err(|err| self.explain(err))
    }

    /// A `GET` whose error is left to the caller (a 404 may be an answer).
    async fn try_get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.failover(Retry::Idempotent, |api| async move { api.get(path).await })
            .await
    }

    /// A blocking query ([`ApiClient::get_blocking`]), tried again on another manager as any
    /// read is: the wait goes on there, from the same index.
    async fn get_blocking<T: DeserializeOwned>(
        &self,
        path: &str,
        index: u64,
        wait: Duration,
    ) -> Result<(T, Option<u64>), ClientError> {
        self.failover(Retry::Idempotent, |api| async move {
            api.get_blocking(path, index, wait).await
        })
        .await
    }

    /// A `POST`; answers with the HTTP status code (201 created, 200 already there) and body.
    async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> anyhow::Result<(u16, T)> {
        let (status, answer) = self
            .failover(Retry::OnlyUnsent, |api| async move {
                api.post(path, body).await
            })
            .await
            .map_err(|err| self.explain(err))?;
        Ok((status.as_u16(), answer))
    }

    /// A `PUT`: the same request again changes nothing, so it is tried again as a read is.
    async fn put<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> anyhow::Result<T> {
        self.failover(
            Retry::Idempotent,
            |api| async move { api.put(path, body).await },
        )
        .await
        .map_err(|err| self.explain(err))
    }

    async fn delete(&self, path: &str) -> anyhow::Result<()> {
        self.failover(
            Retry::Idempotent,
            |api| async move { api.delete(path).await },
        )
        .await
        .map_err(|err| self.explain(err))
    }

    /// A streamed answer ([`ApiClient::open_stream`]): a `GET` is tried again as any read,
    /// anything else only when no manager saw it.
    async fn open_stream<B: Serialize>(
        &self,
        method: cube_api::Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<reqwest::Response, ClientError> {
        let retry = if method == cube_api::Method::GET {
            Retry::Idempotent
        } else {
            Retry::OnlyUnsent
        };
        self.failover(retry, |api| {
            let method = method.clone();
            async move { api.open_stream(method, path, body).await }
        })
        .await
    }

    /// An interactive command's connection ([`ApiClient::open_upgrade`]): it starts a
    /// command, so it is sent again only when no manager saw it.
    async fn open_upgrade(
        &self,
        path: &str,
        protocol: &str,
    ) -> Result<reqwest::Response, ClientError> {
        self.failover(Retry::OnlyUnsent, |api| async move {
            api.open_upgrade(path, protocol).await
        })
        .await
    }

    /// A stream of lines ([`ApiClient::get_lines`], `GET /events`), opened as any read.
    async fn get_lines(
        &self,
        path: &str,
        accept: Option<&str>,
    ) -> Result<(cube_api::LineStream, Option<String>), ClientError> {
        self.failover(Retry::Idempotent, |api| async move {
            api.get_lines(path, accept).await
        })
        .await
    }

    /// A client error in words for the user of the command line, with what was tried when
    /// the request went to more than one manager or more than once.
    fn explain(&self, err: ClientError) -> anyhow::Error {
        let explained = explain(&self.described(), err);
        match self
            .gave_up
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            Some(tried) => anyhow!("{explained:#} ({tried})"),
            None => explained,
        }
    }
}

/// A client error in words: an unreachable manager is named (`described`: "the manager at
/// URL", with the cluster it came from) with the way to point at one; one that took too long
/// is said to have, since what was asked may still be under way; an error answer keeps the
/// server's message, which names the field or ID at fault.
fn explain(described: &str, err: ClientError) -> anyhow::Error {
    match err {
        ClientError::Unreachable {
            reason,
            kind: Unreached::Connect,
            ..
        } => anyhow!(
            "cannot reach {described} ({}); is it running? Start one with \
             'cube dev' or pass -m HOST:PORT / set CUBE_MANAGER / --cluster NAME",
            innermost_cause(&reason)
        ),
        ClientError::Unreachable {
            kind: Unreached::TimedOut(after),
            ..
        } => anyhow!(
            "{described} gave no answer within {}: the request timed out here, and what it \
             asked for may still be under way there (look with 'cube status')",
            seconds(after)
        ),
        ClientError::Unreachable { reason, .. } => anyhow!(
            "the connection to {described} broke before its whole answer came ({}); what was \
             asked may or may not have been done",
            innermost_cause(&reason)
        ),
        ClientError::Status {
            status, message, ..
        } if status == reqwest::StatusCode::SERVICE_UNAVAILABLE => {
            anyhow!("{described} is unavailable (503): {message}")
        }
        other => anyhow!(other),
    }
}

/// A duration in seconds as people write it: `10 s`, `2.5 s`.
fn seconds(duration: Duration) -> String {
    let whole = duration.as_secs();
    if duration.subsec_millis() == 0 {
        format!("{whole} s")
    } else {
        format!("{:.1} s", duration.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn an_unreachable_manager_is_named_with_the_way_to_point_at_one() {
        let err = explain(
            "the manager at http://127.0.0.1:5555",
            ClientError::Unreachable {
                url: "http://127.0.0.1:5555/tasks".to_string(),
                reason: "error sending request for url (http://127.0.0.1:5555/tasks): client \
                         error (Connect): tcp connect error: Connection refused (os error 111)"
                    .to_string(),
                kind: Unreached::Connect,
            },
        );
        assert_eq!(
            err.to_string(),
            "cannot reach the manager at http://127.0.0.1:5555 (Connection refused (os error \
             111)); is it running? Start one with 'cube dev' or pass -m HOST:PORT / set \
             CUBE_MANAGER / --cluster NAME"
        );
    }

    fn unreached(kind: Unreached) -> ClientError {
        ClientError::Unreachable {
            url: "http://127.0.0.1:5555/tasks".to_string(),
            reason: "operation timed out".to_string(),
            kind,
        }
    }

    fn answered(status: u16) -> ClientError {
        ClientError::Status {
            url: "http://127.0.0.1:5555/tasks".to_string(),
            status: reqwest::StatusCode::from_u16(status).unwrap(),
            message: "no manager leads at the moment".to_string(),
        }
    }

    #[test]
    fn a_read_is_tried_again_on_a_503_or_a_broken_connection_and_a_post_only_when_unsent_or_misdirected()
     {
        let refused = || unreached(Unreached::Connect);
        let broken = || unreached(Unreached::Broken);
        let timed_out = || unreached(Unreached::TimedOut(REQUEST_TIMEOUT));
        assert!(worth_another_try(&refused(), Retry::Idempotent));
        assert!(worth_another_try(&refused(), Retry::OnlyUnsent));
        assert!(worth_another_try(&broken(), Retry::Idempotent));
        assert!(!worth_another_try(&broken(), Retry::OnlyUnsent));
        assert!(worth_another_try(&answered(503), Retry::Idempotent));
        assert!(!worth_another_try(&answered(503), Retry::OnlyUnsent));
        // A shard that moved: nothing was done, whatever the request.
        assert!(worth_another_try(&answered(421), Retry::Idempotent));
        assert!(worth_another_try(&answered(421), Retry::OnlyUnsent));
        // The manager may still be at work on it; and a refusal is an answer.
        assert!(!worth_another_try(&timed_out(), Retry::Idempotent));
        for status in [400, 404, 409, 500] {
            assert!(!worth_another_try(&answered(status), Retry::Idempotent));
        }
    }

    #[tokio::test]
    async fn a_submission_answered_421_while_its_shard_moves_is_sent_again_and_lands() {
        // A manager answering the first two POSTs 421 (the shard moves), then 201.
        let posts = Arc::new(AtomicUsize::new(0));
        let counted = posts.clone();
        let manager = axum::Router::new().route(
            "/tasks",
            axum::routing::post(move || {
                let counted = counted.clone();
                async move {
                    if counted.fetch_add(1, Ordering::SeqCst) < 2 {
                        (
                            axum::http::StatusCode::MISDIRECTED_REQUEST,
                            axum::Json(serde_json::json!({"Error": "shard 5 moved"})),
                        )
                    } else {
                        (
                            axum::http::StatusCode::CREATED,
                            axum::Json(serde_json::json!({"ID": "placed"})),
                        )
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move { axum::serve(listener, manager).await });
        let client = ManagerClient {
            apis: vec![ApiClient::new(&address, REQUEST_TIMEOUT).unwrap()],
            current: AtomicUsize::new(0),
            origin: "the manager".to_string(),
            gave_up: Mutex::new(None),
            project: None,
        };
        let (status, answer): (u16, serde_json::Value) =
            client.post("/tasks", &serde_json::json!({})).await.unwrap();
        assert_eq!((status, answer["ID"].as_str()), (201, Some("placed")));
        assert_eq!(posts.load(Ordering::SeqCst), 3, "sent three times");
        server.abort();
    }

    #[test]
    fn a_timeout_and_a_503_say_what_happened_not_that_the_manager_is_down() {
        let described = "the manager at http://127.0.0.1:5555";
        let timed_out = explain(described, unreached(Unreached::TimedOut(REQUEST_TIMEOUT)));
        assert_eq!(
            timed_out.to_string(),
            "the manager at http://127.0.0.1:5555 gave no answer within 10 s: the request timed \
             out here, and what it asked for may still be under way there (look with 'cube \
             status')"
        );
        let unavailable = explain(described, answered(503)).to_string();
        assert_eq!(
            unavailable,
            "the manager at http://127.0.0.1:5555 is unavailable (503): no manager leads at the \
             moment"
        );
        assert_eq!(seconds(Duration::from_millis(2500)), "2.5 s");
    }

    #[test]
    fn an_error_answer_keeps_the_servers_message() {
        let err = explain(
            "http://127.0.0.1:5555",
            ClientError::Status {
                url: "http://127.0.0.1:5555/tasks".to_string(),
                status: reqwest::StatusCode::BAD_REQUEST,
                message: "Task.Memmory: unknown field".to_string(),
            },
        );
        assert!(
            err.to_string().contains("Task.Memmory: unknown field"),
            "{err}"
        );
    }

    fn moved(args: &[&str]) -> Vec<String> {
        manager_flags_after_command(
            &<crate::Cli as clap::CommandFactory>::command(),
            args.iter().map(OsString::from),
        )
        .into_iter()
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect()
    }

    #[test]
    fn manager_flags_before_the_command_move_to_just_after_it() {
        assert_eq!(
            moved(&["cube", "-o", "json", "status", "3f2a"]),
            vec!["cube", "status", "-o", "json", "3f2a"]
        );
        assert_eq!(
            moved(&["cube", "--cluster", "prod", "-ojson", "node", "-q"]),
            vec!["cube", "node", "--cluster", "prod", "-ojson", "-q"]
        );
        assert_eq!(
            moved(&["cube", "--output=yaml", "-m", "10.0.0.1:5555", "status"]),
            vec!["cube", "status", "--output=yaml", "-m", "10.0.0.1:5555"]
        );
        assert_eq!(
            moved(&["cube", "-o", "json", "job", "status", "web"]),
            vec!["cube", "job", "status", "-o", "json", "web"]
        );
        assert_eq!(
            moved(&["cube", "--token", "cube.1a2b", "status"]),
            vec!["cube", "status", "--token", "cube.1a2b"]
        );
        assert_eq!(
            moved(&["cube", "--project", "*", "queue"]),
            vec!["cube", "queue", "--project", "*"]
        );
        assert_eq!(
            moved(&["cube", "--ca-fingerprint=ab:cd", "-m", "h:1", "node", "-q"]),
            vec!["cube", "node", "--ca-fingerprint=ab:cd", "-m", "h:1", "-q"]
        );
        assert_eq!(
            moved(&["cube", "-o", "json", "job", "--help"]),
            vec!["cube", "job", "-o", "json", "--help"]
        );
        // Every command with subcommands, not only those once listed by hand (tried as a new
        // user would: `cube -m HOST node managers` looked for a node named "managers", and
        // `cube -m HOST project create alpha` was refused).
        assert_eq!(
            moved(&["cube", "-m", "h:1", "node", "managers"]),
            vec!["cube", "node", "managers", "-m", "h:1"]
        );
        assert_eq!(
            moved(&["cube", "-m", "h:1", "node", "w1"]),
            vec!["cube", "node", "-m", "h:1", "w1"]
        );
        assert_eq!(
            moved(&["cube", "-m", "h:1", "project", "create", "alpha"]),
            vec!["cube", "project", "create", "-m", "h:1", "alpha"]
        );
        assert_eq!(
            moved(&["cube", "--token", "t", "token", "list"]),
            vec!["cube", "token", "list", "--token", "t"]
        );
        assert_eq!(
            moved(&["cube", "-o", "json", "secret", "list"]),
            vec!["cube", "secret", "list", "-o", "json"]
        );
    }

    #[test]
    fn other_arguments_are_left_for_clap_to_judge() {
        for args in [
            vec!["cube", "status", "-o", "json"],
            vec!["cube", "-o", "json"],
            vec!["cube", "-o"],
            vec!["cube", "-o", "json", "--help"],
            vec!["cube", "--verbose", "-o", "json", "status"],
            vec!["cube"],
        ] {
            assert_eq!(moved(&args), args, "{args:?}");
        }
    }

    #[test]
    fn the_hint_reaches_the_same_manager() {
        let flags = |manager: Option<&str>, cluster: Option<&str>| ClusterFlags {
            manager: manager.map(String::from),
            cluster: cluster.map(String::from),
            token: None,
            ca_fingerprint: None,
            project: None,
        };
        assert_eq!(flags(None, None).hint(), "");
        assert_eq!(flags(Some(DEFAULT_MANAGER), None).hint(), "");
        assert_eq!(
            flags(Some("10.0.0.1:5555"), None).hint(),
            " -m 10.0.0.1:5555"
        );
        assert_eq!(flags(None, Some("prod")).hint(), " --cluster prod");
        assert_eq!(
            flags(Some("10.0.0.1:5555"), Some("prod")).hint(),
            " -m 10.0.0.1:5555"
        );
    }

    /// A task run with `--project alpha` is not found by a bare `cube status ID`, which
    /// looks in `default`: the hint printed after it names the project (tried as a new user
    /// would).
    #[test]
    fn the_hint_reaches_the_same_project() {
        let flags = |manager: Option<&str>, project: Option<&str>| ClusterFlags {
            manager: manager.map(String::from),
            cluster: None,
            token: None,
            ca_fingerprint: None,
            project: project.map(String::from),
        };
        assert_eq!(flags(None, Some("alpha")).hint(), " --project alpha");
        assert_eq!(flags(None, Some("default")).hint(), "");
        assert_eq!(
            flags(Some("10.0.0.1:5555"), Some("alpha")).hint(),
            " -m 10.0.0.1:5555 --project alpha"
        );
    }
}
