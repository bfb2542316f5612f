//! The commands that drive a cluster through the manager's API: `cube run`, `cube stop`,
//! `cube status`, `cube node`.
//!
//! One file per command: it reads its flags, asks the manager over HTTP and prints the answer
//! as a table for people or as JSON for programs. What they share is here (the manager flags
//! and the words for a manager that cannot be reached), in [`output`] (tables, times, JSON)
//! and in [`resolve`] (finding a task by ID, ID prefix or name).
//!
//! Nothing here decides anything about tasks or nodes: the manager does. The commands only
//! ask, and show the answer — including why a task waits or failed.

mod completion;
mod input;
mod node;
mod output;
mod resolve;
mod run;
mod status;
mod stop;
mod wait;

use std::time::Duration;

use anyhow::anyhow;
use clap::{Args, ValueEnum};
use cube_api::{ApiClient, ClientError};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use completion::{CompletionArgs, completion};
pub use node::{NodeArgs, node};
pub use run::{RunArgs, run_task};
pub use status::{StatusArgs, status};
pub use stop::{StopArgs, stop};

/// Where the commands look for a manager when neither `-m` nor `CUBE_MANAGER` says.
const DEFAULT_MANAGER: &str = "127.0.0.1:5555";

/// How long one request to the manager may take before the command gives up.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The flags every command that talks to the manager shares.
#[derive(Debug, Clone, Args)]
pub struct ManagerFlags {
    /// The manager's API address.
    #[arg(
        short,
        long,
        env = "CUBE_MANAGER",
        default_value = DEFAULT_MANAGER,
        value_name = "HOST:PORT"
    )]
    pub manager: String,
    /// How to print the answer: a table for people, or JSON (the API's objects) for scripts.
    #[arg(short, long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

impl ManagerFlags {
    /// ` -m HOST:PORT` when the manager is not the default one, so that a printed hint to
    /// run another command reaches the same manager; empty otherwise.
    fn manager_hint(&self) -> String {
        if self.manager == DEFAULT_MANAGER {
            String::new()
        } else {
            format!(" -m {}", self.manager)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns and `key: value` lines.
    Table,
    /// Pretty-printed JSON on stdout, and nothing else there.
    Json,
}

/// The manager's API as the commands use it: every failure becomes an error that says what
/// to do about it, most of all when no manager answers.
struct ManagerClient {
    api: ApiClient,
}

impl ManagerClient {
    fn connect(flags: &ManagerFlags) -> anyhow::Result<ManagerClient> {
        let api = ApiClient::new(&flags.manager, REQUEST_TIMEOUT)
            .map_err(|err| anyhow!("{err}; set the manager with -m HOST:PORT or CUBE_MANAGER"))?;
        Ok(ManagerClient { api })
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.api.get(path).await.map_err(|err| self.explain(err))
    }

    /// A `POST`; answers with the HTTP status code (201 created, 200 already there) and body.
    async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> anyhow::Result<(u16, T)> {
        let (status, answer) = self
            .api
            .post(path, body)
            .await
            .map_err(|err| self.explain(err))?;
        Ok((status.as_u16(), answer))
    }

    async fn delete(&self, path: &str) -> anyhow::Result<()> {
        self.api.delete(path).await.map_err(|err| self.explain(err))
    }

    /// A client error in words for the user of the command line.
    fn explain(&self, err: ClientError) -> anyhow::Error {
        explain(self.api.base(), err)
    }
}

/// A client error in words: an unreachable manager is named with the way to point at one;
/// an error answer keeps the server's message, which names the field or ID at fault.
fn explain(base: &str, err: ClientError) -> anyhow::Error {
    match err {
        ClientError::Unreachable { reason, .. } => anyhow!(
            "cannot reach the manager at {base} ({}); is it running? Start one with \
             'cube dev' or pass -m HOST:PORT / set CUBE_MANAGER",
            innermost_cause(&reason)
        ),
        other => anyhow!(other),
    }
}

/// The last cause of an error chain written as `outer: inner: innermost`. reqwest's outer
/// layers repeat the URL; the innermost says what happened ("Connection refused").
fn innermost_cause(reason: &str) -> &str {
    reason
        .rsplit(": ")
        .find(|part| !part.trim().is_empty())
        .unwrap_or(reason)
        .trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_manager_is_named_with_the_way_to_point_at_one() {
        let err = explain(
            "http://127.0.0.1:5555",
            ClientError::Unreachable {
                url: "http://127.0.0.1:5555/tasks".to_string(),
                reason: "error sending request for url (http://127.0.0.1:5555/tasks): client \
                         error (Connect): tcp connect error: Connection refused (os error 111)"
                    .to_string(),
            },
        );
        assert_eq!(
            err.to_string(),
            "cannot reach the manager at http://127.0.0.1:5555 (Connection refused (os error \
             111)); is it running? Start one with 'cube dev' or pass -m HOST:PORT / set \
             CUBE_MANAGER"
        );
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
}
